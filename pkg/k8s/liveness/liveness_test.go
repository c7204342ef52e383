package liveness

import (
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func lease(node, rv string, renew time.Time) *coordinationv1.Lease {
	mt := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName(node), Namespace: DefaultNamespace, ResourceVersion: rv},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &node, RenewTime: &mt},
	}
}

func TestLiveness(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewLiveness(40*time.Second, clock.Now)

	if got := l.Live(); len(got) != 0 {
		t.Fatalf("empty Live() = %v", got)
	}

	// On first sight a year-old Lease is dead (its node died long ago), one
	// renewed a day "ahead" (a clock running fast) and a fresh one are live.
	behind := clock.Now().Add(-365 * 24 * time.Hour)
	ahead := clock.Now().Add(24 * time.Hour)
	if !l.Observe(lease("a", "1", behind)) || !l.Observe(lease("b", "1", ahead)) || !l.Observe(lease("c", "1", clock.Now().Add(-39*time.Second))) {
		t.Fatal("first observations must count as changes")
	}
	if l.Observe(lease("a", "1", behind)) {
		t.Error("an unchanged lease (informer resync) counted as a change")
	}
	if l.Observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler"}}) || l.Observe(nil) {
		t.Error("a foreign or nil lease counted")
	}
	want := map[string]bool{"a": false, "b": true, "c": true}
	if got := l.Live(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Live() = %v, want %v", got, want)
	}
	l.Forget("c")

	// 30s later "a" renews: from then on only local observation times count,
	// though its remote renewTime is still a year off. "b" stays silent.
	clock.Step(30 * time.Second)
	if !l.Observe(lease("a", "2", behind.Add(30*time.Second))) {
		t.Fatal("a renewal was not a change")
	}
	if got := l.Live(); !got["a"] || !got["b"] {
		t.Fatalf("Live() = %v, want a and b live", got)
	}
	if l.Changed() {
		t.Error("Changed before anyone expired")
	}

	// At 40s since b's last change, b is dead; a is live.
	clock.Step(10 * time.Second)
	if !l.Changed() {
		t.Error("Changed did not report b's expiry")
	}
	want = map[string]bool{"a": true, "b": false}
	if got := l.Live(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Live() = %v, want %v", got, want)
	}
	if l.Changed() {
		t.Error("Changed still true after Live() took the new state")
	}

	// A change of resourceVersion alone (same renewTime) is a change, and b
	// comes back to life.
	if !l.Observe(lease("b", "7", ahead)) {
		t.Error("a new resourceVersion was not a change")
	}
	// A renewTime change with the same resourceVersion renews too, but a
	// renewal of a live node that reports nothing new changes no decision:
	// Observe says so (the daemon enqueues no reconcile for it).
	if l.Observe(lease("a", "2", behind.Add(31*time.Second))) {
		t.Error("a plain renewal of a live node was reported as a possible decision change")
	}
	want = map[string]bool{"a": true, "b": true}
	if got := l.Live(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Live() = %v, want %v", got, want)
	}
	clock.Step(39 * time.Second)
	if got := l.Live(); !reflect.DeepEqual(got, want) {
		t.Fatalf("39s after the renewals: Live() = %v, want %v", got, want)
	}

	// Everyone silent for the timeout: nobody live.
	clock.Step(time.Second)
	want = map[string]bool{"a": false, "b": false}
	if got := l.Live(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Live() = %v, want %v", got, want)
	}

	l.Forget("a")
	if got := l.Live(); !reflect.DeepEqual(got, map[string]bool{"b": false}) {
		t.Errorf("after Forget: %v", got)
	}
	// Seen again after Forget: first sight counts, and judges staleness.
	if !l.Observe(lease("a", "2", behind)) {
		t.Error("a re-added lease was not a change")
	}
	if got := l.Live(); got["a"] {
		t.Errorf("a Lease stale on first sight after Forget is live: %v", got)
	}
	if !l.Observe(lease("a", "3", clock.Now())) || !l.Live()["a"] {
		t.Error("a renewal of a Lease stale on first sight did not make it live")
	}
}

// TestLivenessChangedQuiet checks Changed's shortcut (no evaluation while
// no input changed and no deadline passed) against a Liveness that
// evaluates every time: same inputs, same clock, same answers. Nodes renew
// on schedule, some stop renewing and come back, one publishes a probe
// report voting another down, the API server becomes unreachable for a while.
func TestLivenessChangedQuiet(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	fast, ref := NewLiveness(40*time.Second, clock.Now), NewLiveness(40*time.Second, clock.Now)
	for _, l := range []*Liveness{fast, ref} {
		l.SetTakeoverDelay(30 * time.Second)
	}
	loc := map[string]string{"a": "x", "b": "x", "c": "x", "d": "y", "e": "y"}
	rv := map[string]int{}
	renew := func(node string, report Report) {
		rv[node]++
		le := lease(node, fmt.Sprint(rv[node]), clock.Now())
		le.Annotations = ReportAnnotations(report)
		if a, b := fast.Observe(le), ref.Observe(le); a != b {
			t.Fatalf("Observe(%s) = %v, reference %v", node, a, b)
		}
	}
	changes, trues := 0, 0
	for step := 0; step < 600; step++ { // 10 minutes in 1 s steps
		sec := step
		for i, n := range []string{"a", "b", "c", "d", "e"} {
			if sec%10 != i {
				continue
			}
			switch {
			case n == "c" && sec >= 100 && sec < 200: // c stops renewing, then comes back
			case n == "e" && sec >= 300 && sec < 420:
			case n == "a" && sec >= 250 && sec < 280: // a votes d down for a while
				renew(n, Report{Down: []string{"d"}})
			default:
				renew(n, Report{})
			}
		}
		switch sec {
		case 450:
			fast.SetAPIReachable(false)
			ref.SetAPIReachable(false)
		case 500:
			fast.SetAPIReachable(true)
			ref.SetAPIReachable(true)
		}
		ref.touch() // the reference always evaluates
		got, want := fast.Changed(), ref.Changed()
		if got != want {
			t.Fatalf("at %d s: Changed() = %v, reference %v", sec, got, want)
		}
		if got {
			trues++
		}
		if got || sec%30 == 0 { // the reconcile (and the resync) decides
			changes++
			if a, b := fast.Decide(loc), ref.Decide(loc); !a.equal(b) {
				t.Fatalf("at %d s: Decide = %v, reference %v", sec, a, b)
			}
		}
		clock.Step(time.Second)
	}
	if trues < 4 || changes < 24 {
		t.Errorf("%d decision changes, %d decisions: the scenario exercised too little", trues, changes)
	}
}

// With UseLeaseDurations each Lease expires after its own
// leaseDurationSeconds (a Lease without one after the default timeout),
// also on first sight; LeaseExpired and ExpiredLeases judge by the Lease
// alone (a down vote does not expire it) and know nothing of nodes never
// observed or forgotten.
func TestLivenessLeaseDurations(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewLiveness(40*time.Second, clock.Now)
	l.UseLeaseDurations()
	withDuration := func(le *coordinationv1.Lease, s int32) *coordinationv1.Lease {
		le.Spec.LeaseDurationSeconds = &s
		return le
	}
	l.Observe(withDuration(lease("short", "1", clock.Now()), 10))
	l.Observe(withDuration(lease("long", "1", clock.Now()), 60))
	l.Observe(lease("default", "1", clock.Now()))
	// Renewed 20s ago: stale on first sight for a 10s Lease only; the 30s
	// one counts from when it was seen, like any change.
	l.Observe(withDuration(lease("stale", "1", clock.Now().Add(-20*time.Second)), 10))
	l.Observe(withDuration(lease("fresh", "1", clock.Now().Add(-20*time.Second)), 30))
	voted := lease("voted", "1", clock.Now())
	l.Observe(voted)
	l.Observe(withDuration(lease("reporter", "1", clock.Now()), 60))
	l.Observe(func() *coordinationv1.Lease {
		r := withDuration(lease("reporter", "2", clock.Now()), 60)
		r.Annotations = ReportAnnotations(Report{Down: []string{"voted"}})
		return r
	}())
	expired := func(at time.Duration, want ...string) {
		t.Helper()
		if got := l.ExpiredLeases(); !reflect.DeepEqual(got, want) {
			t.Errorf("after %v: ExpiredLeases() = %v, want %v", at, got, want)
		}
		for _, n := range []string{"short", "long", "default", "stale", "fresh", "voted", "reporter", "never"} {
			if got, w := l.LeaseExpired(n), slices.Contains(want, n); got != w {
				t.Errorf("after %v: LeaseExpired(%s) = %v, want %v", at, n, got, w)
			}
		}
	}
	expired(0, "stale")
	if l.Live()["voted"] {
		t.Fatal("the down vote does not count: the test proves nothing")
	}
	clock.Step(10 * time.Second)
	expired(10*time.Second, "short", "stale")
	if tm, ok := l.NextChange(); !ok || !tm.Equal(clock.Now().Add(20*time.Second)) {
		t.Errorf("NextChange() = %v %v, want the 30s Lease's expiry in 20s", tm, ok)
	}
	clock.Step(20 * time.Second)
	expired(30*time.Second, "fresh", "short", "stale")
	clock.Step(10 * time.Second)
	expired(40*time.Second, "default", "fresh", "short", "stale", "voted")
	l.Observe(withDuration(lease("short", "2", clock.Now()), 10))
	l.Forget("stale")
	expired(40*time.Second, "default", "fresh", "voted")
	clock.Step(20 * time.Second)
	expired(60*time.Second, "default", "fresh", "long", "reporter", "short", "voted")
}

// A Lease stale on first sight is dead until it changes. If it changes
// within the timeout of that sight (an API outage ending as this process
// starts watching: every heartbeat failed, none was seen), the node is
// settled at once; later, it recovered and settles for the takeover delay.
// StaleOnFirstSight tells the first kind of dead from one seen expiring.
func TestStaleOnFirstSight(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	clock.Step(time.Hour) // this process started an hour ago
	l := NewLiveness(40*time.Second, clock.Now)
	l.SetTakeoverDelay(30 * time.Second)
	clock.Step(time.Hour)
	old := clock.Now().Add(-45 * time.Second) // renewed just before a 40 s+ outage
	l.Observe(lease("soon", "1", old))
	l.Observe(lease("late", "1", old))
	l.Observe(lease("fresh", "1", clock.Now().Add(-5*time.Second)))
	loc := map[string]string{"soon": "x", "late": "x", "fresh": "x"}
	d := l.Decide(loc)
	if d.Live["soon"] || d.Live["late"] || !d.Live["fresh"] {
		t.Fatalf("first sight: live %v, want only fresh", d.Live)
	}
	if !l.StaleOnFirstSight("soon") || !l.StaleOnFirstSight("late") || l.StaleOnFirstSight("fresh") || l.StaleOnFirstSight("never") {
		t.Error("StaleOnFirstSight wrong on first sight")
	}

	clock.Step(10 * time.Second) // soon renews within the timeout of its sight
	l.Observe(lease("soon", "2", clock.Now()))
	if l.StaleOnFirstSight("soon") {
		t.Error("StaleOnFirstSight after a change")
	}
	d = l.Decide(loc)
	if !d.Live["soon"] || d.Settling["soon"] {
		t.Errorf("renewed 10 s after a stale first sight: live %v, settling %v; want live and settled", d.Live["soon"], d.Settling["soon"])
	}

	clock.Step(35 * time.Second) // late renews 45 s after its sight: it recovered
	l.Observe(lease("late", "2", clock.Now()))
	l.Observe(lease("soon", "3", clock.Now()))
	l.Observe(lease("fresh", "2", clock.Now()))
	d = l.Decide(loc)
	if !d.Live["late"] || !d.Settling["late"] {
		t.Errorf("renewed 45 s after a stale first sight: live %v, settling %v; want live and settling", d.Live["late"], d.Settling["late"])
	}
	if d.Settling["soon"] || d.Settling["fresh"] {
		t.Errorf("settling %v: only late should be", d.Settling)
	}

	// soon dies as seen: dead, and no longer "stale on first sight".
	clock.Step(41 * time.Second)
	l.Observe(lease("late", "3", clock.Now()))
	l.Observe(lease("fresh", "3", clock.Now()))
	if d = l.Decide(loc); d.Live["soon"] || l.StaleOnFirstSight("soon") {
		t.Errorf("seen expiring: live %v, stale on first sight %v", d.Live["soon"], l.StaleOnFirstSight("soon"))
	}
	// Back now: it recovered, so it settles.
	l.Observe(lease("soon", "4", clock.Now()))
	if d = l.Decide(loc); !d.Live["soon"] || !d.Settling["soon"] {
		t.Errorf("back after dying: live %v, settling %v; want live and settling", d.Live["soon"], d.Settling["soon"])
	}
}
