package clusterlink

import (
	"log/slog"
	"testing"
	"time"
)

// TestSettled: a linked cluster's liveness settles a lease duration after
// its Lease watch began to answer (again); unreachable or never answered
// is not settled; a cluster without a watch is.
func TestSettled(t *testing.T) {
	now := time.Unix(1000, 0)
	w := NewLinkLiveness(slog.New(slog.DiscardHandler), "meshd-system", 40*time.Second, 0, 0, func() {})
	w.now = func() time.Time { return now }
	if ok, _ := w.Settled("link-none"); !ok {
		t.Error("a cluster without a watch counts as settled")
	}
	r := &remoteLeases{}
	w.remotes["link-a"] = r
	if ok, wait := w.Settled("link-a"); ok || wait != 40*time.Second {
		t.Errorf("never answered: settled %v, wait %v", ok, wait)
	}
	r.reach.Store(reachYes)
	r.since.Store(now.UnixNano())
	now = now.Add(15 * time.Second)
	if ok, wait := w.Settled("link-a"); ok || wait != 25*time.Second {
		t.Errorf("15 s after answering: settled %v, wait %v", ok, wait)
	}
	now = now.Add(25 * time.Second)
	if ok, _ := w.Settled("link-a"); !ok {
		t.Error("a lease duration after answering: not settled")
	}
	r.reach.Store(reachNo)
	if ok, _ := w.Settled("link-a"); ok {
		t.Error("unreachable counts as settled")
	}
}

func TestNoneLive(t *testing.T) {
	for _, c := range []struct {
		live map[string]bool
		want bool
	}{
		{nil, false}, // liveness unknown: every node counts as live
		{map[string]bool{}, true},
		{map[string]bool{"a": false, "b": false}, true},
		{map[string]bool{"a": false, "b": true}, false},
	} {
		if got := noneLive(c.live); got != c.want {
			t.Errorf("noneLive(%v) = %v, want %v", c.live, got, c.want)
		}
	}
}
