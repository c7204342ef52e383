package liveness

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

func TestJudge(t *testing.T) {
	// Location a: a1 (the leader), a2, a3; location b: b1, b2.
	loc := map[string]string{"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b"}
	allLive := map[string]bool{"a1": true, "a2": true, "a3": true, "b1": true, "b2": true}
	healthy := map[string]Report{
		"a1": {Up: []string{"a2", "a3", "b1", "b2"}},
		"a2": {Up: []string{"a1", "a3", "b1"}},
		"a3": {Up: []string{"a1", "a2", "b1"}},
		"b1": {Up: []string{"a1", "b2"}},
		"b2": {Up: []string{"a1", "b1"}},
	}
	with := func(base map[string]Report, r map[string]Report) map[string]Report {
		out := maps.Clone(base)
		maps.Copy(out, r)
		return out
	}
	without := func(m map[string]bool, n ...string) map[string]bool {
		out := maps.Clone(m)
		for _, x := range n {
			out[x] = false
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		live     map[string]bool
		reports  map[string]Report
		location map[string]string
		want     map[string]bool
	}{
		{"all healthy", allLive, healthy, loc, allLive},
		{"no reports: the Leases decide", without(allLive, "a1"), nil, loc, without(allLive, "a1")},
		{"leader killed and cut off: everyone reports it down", allLive, with(healthy, map[string]Report{
			"a2": {Up: []string{"a3", "b1"}, Down: []string{"a1"}},
			"a3": {Up: []string{"a2", "b1"}, Down: []string{"a1"}},
			"b1": {Up: []string{"b2"}, Down: []string{"a1"}},
			"b2": {Up: []string{"b1"}, Down: []string{"a1"}},
		}), loc, without(allLive, "a1")},
		// a1's stale report says everyone is up; it does not outvote.
		{"leader cut off from its own location only", allLive, with(healthy, map[string]Report{
			"a2": {Up: []string{"a3", "b1"}, Down: []string{"a1"}},
			"a3": {Up: []string{"a2", "b1"}, Down: []string{"a1"}},
		}), loc, without(allLive, "a1")},
		{"leader cut off from the other locations only", allLive, with(healthy, map[string]Report{
			"b1": {Up: []string{"b2"}, Down: []string{"a1"}},
			"b2": {Up: []string{"b1"}, Down: []string{"a1"}},
		}), loc, without(allLive, "a1")},
		{"one of two own-location voters: a tie keeps it", allLive, with(healthy, map[string]Report{
			"a2": {Up: []string{"a3", "b1"}, Down: []string{"a1"}},
		}), loc, allLive},
		{"a lonely, partitioned reporter does not take everyone down", allLive, with(healthy, map[string]Report{
			"a3": {Down: []string{"a1", "a2", "b1"}},
		}), loc, allLive},
		{"a dead reporter's votes do not count", without(allLive, "a2", "a3"), with(healthy, map[string]Report{
			"a2": {Down: []string{"a1"}},
			"a3": {Down: []string{"a1"}},
		}), loc, without(allLive, "a2", "a3")},
		{"own votes about oneself do not count", allLive, with(healthy, map[string]Report{
			"b1": {Up: []string{"a1"}, Down: []string{"b1", "b2"}},
		}), loc, without(allLive, "b2")},
		// Without locations a2 and x are remote voters of a1: 2 of 2 down.
		{"unknown locations count as remote", map[string]bool{"a1": true, "a2": true, "x": true}, map[string]Report{
			"x": {Down: []string{"a1"}}, "a2": {Down: []string{"a1"}},
		}, nil, map[string]bool{"a1": false, "a2": true, "x": true}},
		{"a dead node stays dead whatever the votes", without(allLive, "a1"), with(healthy, map[string]Report{
			"b1": {Up: []string{"a1"}},
		}), loc, without(allLive, "a1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Judge(tc.live, tc.reports, tc.location); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Judge = %v\nwant    %v", got, tc.want)
			}
		})
	}
}

func leaseWith(node, rv string, renew time.Time, r Report) *coordinationv1.Lease {
	l := lease(node, rv, renew)
	l.Annotations = ReportAnnotations(r)
	return l
}

// The data-plane votes take a leader down at once (no lease timeout), a
// recovered preferred node settles for the takeover delay before it may
// lead, and only observations that may change a decision say so.
func TestLivenessVotesAndSettling(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewLiveness(40*time.Second, clock.Now)
	l.SetTakeoverDelay(30 * time.Second)
	loc := map[string]string{"a1": "a", "a2": "a", "b1": "b"}
	up := func(n ...string) Report { return Report{Up: n} }
	rv := 1
	obs := func(node string, r Report) bool {
		rv++
		return l.Observe(leaseWith(node, fmt.Sprint(rv), clock.Now(), r))
	}
	obs("a1", up("a2", "b1"))
	obs("a2", up("a1", "b1"))
	obs("b1", up("a1"))
	d := l.Decide(loc)
	if want := map[string]bool{"a1": true, "a2": true, "b1": true}; !reflect.DeepEqual(d.Live, want) || len(d.Settling) != 0 {
		t.Fatalf("start: %+v (nodes live at start are settled)", d)
	}
	if l.Changed() {
		t.Fatal("Changed right after Decide")
	}
	// A renewal reporting the same: no decision change.
	clock.Step(10 * time.Second)
	if obs("a1", up("a2", "b1")) {
		t.Error("a plain renewal may change a decision?")
	}
	// a1 dies: a2 and b1 report it down. a1's Lease is still fresh.
	clock.Step(time.Second)
	if !obs("a2", Report{Up: []string{"b1"}, Down: []string{"a1"}}) || !obs("b1", Report{Down: []string{"a1"}}) {
		t.Error("a new report is a possible decision change")
	}
	if !l.Changed() {
		t.Error("votes did not change the decision")
	}
	if d := l.Decide(loc); d.Live["a1"] || !d.Live["a2"] {
		t.Fatalf("after the votes: %+v", d)
	}
	// a1's Lease expires later: that changes nothing.
	clock.Step(40 * time.Second)
	obs("a2", Report{Up: []string{"b1"}, Down: []string{"a1"}})
	obs("b1", Report{Down: []string{"a1"}})
	if l.Changed() {
		t.Error("the expiry of an already dead node changed the decision")
	}
	l.Decide(loc)
	// a1 comes back: its Lease renews and the others report it up again.
	clock.Step(time.Second)
	obs("a1", up("a2", "b1"))
	obs("a2", up("a1", "b1"))
	obs("b1", up("a1"))
	d = l.Decide(loc)
	if !d.Live["a1"] || !d.Settling["a1"] || d.Settling["a2"] {
		t.Fatalf("recovered a1 must be live and settling: %+v", d)
	}
	next, ok := l.NextChange()
	if !ok || !next.Equal(clock.Now().Add(30*time.Second)) {
		t.Errorf("NextChange = %v %v, want the end of a1's settling in 30s", next, ok)
	}
	clock.Step(29 * time.Second)
	obs("a1", up("a2", "b1"))
	obs("a2", up("a1", "b1"))
	obs("b1", up("a1"))
	if l.Changed() {
		t.Error("changed before the takeover delay")
	}
	clock.Step(time.Second)
	if !l.Changed() {
		t.Error("the end of settling did not change the decision")
	}
	if d := l.Decide(loc); !d.Live["a1"] || d.Settling["a1"] {
		t.Errorf("a1 after the takeover delay: %+v", d)
	}
}

// While the API server is unreachable, Lease ages stand still; when it
// answers again every Lease gets back the time it had left.
func TestLivenessFrozenDuringOutage(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewLiveness(40*time.Second, clock.Now)
	l.Observe(lease("a", "1", clock.Now()))
	clock.Step(30 * time.Second)
	if !l.SetAPIReachable(false) || l.SetAPIReachable(false) {
		t.Error("SetAPIReachable(false) must report the first change only")
	}
	clock.Step(100 * time.Second)
	if !l.Live()["a"] {
		t.Fatal("a node died of an API outage")
	}
	if _, ok := l.NextChange(); ok {
		t.Error("a Lease expiry is due while frozen")
	}
	if !l.SetAPIReachable(true) {
		t.Error("SetAPIReachable(true) reported no change")
	}
	clock.Step(9 * time.Second)
	if !l.Live()["a"] {
		t.Fatal("a lost its remaining time")
	}
	clock.Step(time.Second)
	if l.Live()["a"] {
		t.Fatal("a outlived its remaining time")
	}
}

// A Lease renewed while frozen (this node's own writes fail, the watch
// still delivers) ages from when the freeze ends: it gets its timeout then,
// not the outage on top. Before, unfreezing shifted it by the whole outage
// too, so a node renewing once during a 10-minute freeze and then dying
// stayed live for 10 minutes and 40 s after the API server answered again.
func TestLivenessRenewedWhileFrozenGetsNoOutageTime(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewLiveness(40*time.Second, clock.Now)
	l.Observe(lease("x", "1", clock.Now()))
	l.Observe(lease("y", "1", clock.Now()))
	clock.Step(10 * time.Second)
	l.SetAPIReachable(false)
	clock.Step(600 * time.Second)
	l.Observe(lease("x", "2", clock.Now())) // x's last renewal
	if !l.Live()["x"] || !l.Live()["y"] {
		t.Fatalf("while frozen: Live() = %v, want x and y live", l.Live())
	}
	clock.Step(time.Second)
	l.SetAPIReachable(true)
	// y renewed 10 s before the freeze: 30 s left. x was renewed during
	// it: the full 40 s, from the end of the freeze.
	if next, ok := l.NextChange(); !ok || !next.Equal(clock.Now().Add(30*time.Second)) {
		t.Errorf("NextChange() = %v %v, want y's expiry in 30 s", next, ok)
	}
	clock.Step(39 * time.Second)
	if got := l.Live(); !got["x"] || got["y"] {
		t.Fatalf("39 s after the freeze: Live() = %v, want x live, y dead", got)
	}
	if next, ok := l.NextChange(); !ok || !next.Equal(clock.Now().Add(time.Second)) {
		t.Errorf("NextChange() = %v %v, want x's expiry in 1 s (40 s after the freeze)", next, ok)
	}
	clock.Step(time.Second)
	if l.Live()["x"] {
		t.Fatal("x still live 40 s after the freeze ended (timeout 40 s): the outage was added to a renewal seen during it")
	}
}

// Thaw ends a freeze giving the Lease ages back at most its credit: the
// rest of a longer outage counts against them; a Thaw while not frozen
// does nothing.
func TestLivenessThawCredit(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewLiveness(40*time.Second, clock.Now)
	l.Observe(lease("x", "1", clock.Now()))
	clock.Step(10 * time.Second)
	l.SetAPIReachable(false)
	clock.Step(5 * time.Minute)
	if !l.Live()["x"] {
		t.Fatal("x dead while frozen")
	}
	if !l.Thaw(time.Minute) {
		t.Fatal("Thaw ended no freeze")
	}
	// 10 s before the freeze + 4 of its 5 minutes: past the 40 s timeout.
	if l.Live()["x"] {
		t.Fatal("x live after a 5-minute freeze thawed with 1 minute of credit")
	}
	if l.Thaw(time.Minute) || l.SetAPIReachable(true) {
		t.Fatal("a second thaw changed something")
	}
	l.Observe(lease("x", "2", clock.Now()))
	l.SetAPIReachable(false)
	clock.Step(20 * time.Second)
	l.Thaw(time.Minute) // the whole freeze is within the credit
	clock.Step(39 * time.Second)
	if !l.Live()["x"] {
		t.Fatal("x dead 39 s after a freeze fully credited (timeout 40 s)")
	}
}

// A Lease stale on first sight is dead also when first seen while frozen
// (this process starts during an API outage and its first heartbeat write
// fails), and after the freeze; a change brings it back as usual.
func TestLivenessStaleOnFirstSightWhileFrozen(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewLiveness(40*time.Second, clock.Now)
	l.SetAPIReachable(false)
	clock.Step(5 * time.Second)
	l.Observe(lease("dead", "1", clock.Now().Add(-24*time.Hour))) // the informer's list
	l.Observe(lease("fresh", "1", clock.Now().Add(-5*time.Second)))
	if got := l.Live(); got["dead"] || !got["fresh"] {
		t.Fatalf("first sight while frozen: Live() = %v, want fresh live and the Lease renewed a day ago dead", got)
	}
	if !l.LeaseExpired("dead") || !l.StaleOnFirstSight("dead") || !slices.Equal(l.ExpiredLeases(), []string{"dead"}) {
		t.Errorf("first sight while frozen: LeaseExpired %v, StaleOnFirstSight %v, ExpiredLeases %v; want dead expired and stale",
			l.LeaseExpired("dead"), l.StaleOnFirstSight("dead"), l.ExpiredLeases())
	}
	clock.Step(100 * time.Second)
	l.SetAPIReachable(true)
	if got := l.Live(); got["dead"] || !got["fresh"] {
		t.Fatalf("after the freeze: Live() = %v, want fresh live, dead dead", got)
	}
	l.Observe(lease("dead", "2", clock.Now()))
	if !l.Live()["dead"] {
		t.Error("a renewal of a Lease stale on first sight did not make it live")
	}
}
