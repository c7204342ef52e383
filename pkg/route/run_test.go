package route

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// startRun runs m.Run until the test ends; it returns the count of
// changed() calls.
func startRun(t *testing.T, m *Manager) *atomic.Int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var changed atomic.Int64
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func() { changed.Add(1) }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return &changed
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, d)
	return 0
}

func TestRunRepairsForeignChanges(t *testing.T) {
	f, m, wg, _ := fakeEnv(t)
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}}, []Rule{{}})
	changed := startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return f.Subscribes() == 1 })
	r := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: wg, Protocol: 109}

	// Deleted route comes back.
	if err := f.DelRoute(r); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, time.Second, "route restored", func() bool { return f.Routes()[r] })
	t.Logf("route restored in %v", took)
	waitFor(t, time.Second, "changed called", func() bool { return changed.Load() == 1 })

	// A stray route with our marker is removed.
	stray := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.99.0.0/16"), LinkIndex: wg, Protocol: 109}
	_ = f.AddRoute(stray)
	waitFor(t, time.Second, "stray removed", func() bool { return !f.Routes()[stray] })

	// Deleted rule comes back.
	rule := KernelRule{Family: FamilyV4, Priority: 31000, Table: 51820, Protocol: 109}
	_ = f.DelRule(rule)
	waitFor(t, time.Second, "rule restored", func() bool { return f.Rules()[rule] })

	// Foreign changes do not cause writes.
	w := m.Writes()
	_ = f.AddRoute(KernelRoute{Family: FamilyV4, Table: 254, Dst: pfx("10.98.0.0/16"), LinkIndex: wg, Protocol: 3})
	_ = f.AddRule(KernelRule{Family: FamilyV4, Priority: 100, Table: 100})
	// Our own Set does not cause a repair either.
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}, {Dst: pfx("10.6.0.0/16"), Device: "wg0"}}, []Rule{{}})
	time.Sleep(3 * repairDelay)
	if got := m.Writes() - w; got != 1 {
		t.Fatalf("writes = %d, want 1 (only the Set's add)", got)
	}
	if got := changed.Load(); got != 3 {
		t.Fatalf("changed called %d times, want 3", got)
	}
}

func TestRunNothingBeforeSetOrAfterCleanup(t *testing.T) {
	f, m, wg, _ := fakeEnv(t)
	stale := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: wg, Protocol: 109}
	_ = f.AddRoute(stale)
	startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return f.Subscribes() == 1 })
	_ = f.AddRoute(KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.6.0.0/16"), LinkIndex: wg, Protocol: 109})
	time.Sleep(3 * repairDelay)
	if m.Writes() != 0 {
		t.Fatal("Run wrote before the first Set")
	}
	mustSet(t, m, []Route{{Dst: pfx("10.7.0.0/16"), Device: "wg0"}}, nil)
	if err := m.Cleanup(); err != nil {
		t.Fatal(err)
	}
	w := m.Writes()
	_ = f.AddRoute(stale)
	time.Sleep(3 * repairDelay)
	if m.Writes() != w || !f.Routes()[stale] {
		t.Fatal("Run repaired after Cleanup")
	}
}

// TestRunOverrun: the kernel drops the subscription (ENOBUFS); Run
// resubscribes and resyncs in full, catching a change it never heard of.
func TestRunOverrun(t *testing.T) {
	f, m, wg, _ := fakeEnv(t)
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}}, nil)
	changed := startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return f.Subscribes() == 1 })
	r := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: wg, Protocol: 109}

	for i := range 3 {
		f.DropSubscriptions()
		_ = f.DelRoute(r) // nobody hears this
		waitFor(t, 2*time.Second, "resubscribed and resynced", func() bool { return f.Routes()[r] })
		if got := m.Resubscribes(); got != uint64(i+1) {
			t.Fatalf("resubscribes = %d, want %d", got, i+1)
		}
	}
	// changed is called once the repair's writes are done: right after the
	// route is back in the kernel, not before.
	waitFor(t, time.Second, "three repairs reported", func() bool { return changed.Load() == 3 })
	time.Sleep(3 * repairDelay)
	if changed.Load() != 3 {
		t.Fatalf("changed = %d, want 3", changed.Load())
	}
	// An error report (lost notifications) also triggers a resync.
	syncs := m.syncs.Load()
	f.Notify(Event{Err: errors.New("dump interrupted")})
	waitFor(t, time.Second, "resync on error", func() bool { return m.syncs.Load() > syncs })
}

// TestRunBackoff: when subscribing keeps failing, Run backs off instead of
// spinning.
func TestRunBackoff(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	f.SetSubscribeErr(errors.New("ENOBUFS forever"))
	startRun(t, m)
	time.Sleep(1600 * time.Millisecond)
	// 0, +100ms, +200ms, +400ms, +800ms: 5 attempts in 1.5s; a spin would be millions.
	if got := f.Subscribes(); got < 3 || got > 6 {
		t.Fatalf("subscribe attempts in 1.6s = %d, want 3..6", got)
	}
	f.SetSubscribeErr(nil)
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}}, nil)
	n := f.Subscribes()
	waitFor(t, 3*time.Second, "subscribed again", func() bool { return f.Subscribes() > n })
	time.Sleep(200 * time.Millisecond)
	if got := f.Subscribes(); got != n+1 {
		t.Fatalf("subscribes = %d, want %d: a healthy subscription is kept", got, n+1)
	}
}

func TestRunPeriodicResync(t *testing.T) {
	f := NewFakeKernel()
	f.AddLink("wg0")
	m := NewWithKernel(Options{ResyncInterval: 50 * time.Millisecond}, f)
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}}, nil)
	startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return f.Subscribes() == 1 })
	// The interface is recreated: IPv4 routes vanish without a notification.
	f.DelLink("wg0")
	idx := f.AddLink("wg0")
	r := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: idx, Protocol: 109}
	waitFor(t, time.Second, "periodic resync", func() bool { return f.Routes()[r] })
}

// While Run watches, a Set of the same desired set after a sync that left
// the kernel matching it reads nothing from the kernel; a new set, a
// relevant notification or the loss of the watch makes the next Set look
// again. Without Run, every Set looks.
func TestSetTrustsTheWatch(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	routes := []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}, {Dst: pfx("10.6.0.0/16"), Gateway: addr("198.51.100.7")}}
	lists := func() int { return f.Lists() }
	mustSet(t, m, routes, []Rule{{}})
	mustSet(t, m, routes, []Rule{{}})
	if got := lists(); got != 2 {
		t.Fatalf("without Run: %d listings for 2 Sets, want 2", got)
	}
	startRun(t, m)
	waitFor(t, time.Second, "subscribed and synced", func() bool { return f.Subscribes() == 1 && lists() == 3 })
	mustSet(t, m, routes, []Rule{{}})
	mustSet(t, m, routes, []Rule{{}})
	if got := lists(); got != 3 {
		t.Fatalf("watched, unchanged: %d listings, want 3 (none for the Sets)", got)
	}
	// A new set looks.
	routes = append(routes, Route{Dst: pfx("10.7.0.0/16"), Device: "wg0"})
	mustSet(t, m, routes, []Rule{{}})
	if got := lists(); got != 4 {
		t.Fatalf("a new set: %d listings, want 4", got)
	}
	// A foreign change: repaired by Run (a listing), then trusted again.
	r := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: 2, Protocol: 109}
	if err := f.DelRoute(r); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "route restored", func() bool { return f.Routes()[r] })
	n := lists()
	mustSet(t, m, routes, []Rule{{}})
	if got := lists(); got != n {
		t.Fatalf("after the repair: %d listings, want %d", got, n)
	}
	// The watch lost: the next Set looks until Run synced again.
	f.DropSubscriptions()
	waitFor(t, 2*time.Second, "resubscribed", func() bool { return f.Subscribes() == 2 })
	waitFor(t, time.Second, "resynced", func() bool { return lists() > n })
}

// A link that goes away takes its IPv4 routes with it, silently (no route
// notification): Run repairs on the link notification, at once, and so
// puts the routes on the link that replaces it.
func TestRunRepairsAfterLinkLoss(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}}, []Rule{{}})
	changed := startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return f.Subscribes() == 1 })
	f.DelLink("wg0")
	if len(ours(f)) != 0 {
		t.Fatal("the fake kept routes through a deleted link")
	}
	idx := f.AddLink("wg0", pfx("10.4.0.1/16"))
	r := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: idx, Protocol: 109}
	took := waitFor(t, time.Second, "route back on the new wg0", func() bool { return f.Routes()[r] })
	t.Logf("route back %v after the link came back", took)
	waitFor(t, time.Second, "changed called", func() bool { return changed.Load() >= 1 })
	// A link meshd's routes do not use changes nothing.
	w := m.Writes()
	f.AddLink("veth9")
	time.Sleep(3 * repairDelay)
	if m.Writes() != w {
		t.Error("a foreign link's notification caused writes")
	}
}
