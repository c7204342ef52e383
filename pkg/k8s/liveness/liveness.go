package liveness

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// Annotations on a heartbeat Lease: the data-plane probe results its node
// publishes (see pkg/probe). Both are comma separated node names, sorted;
// nodes the node never heard from are in neither.
const (
	// AnnotationProbeUp lists the nodes that answer this node's probes.
	AnnotationProbeUp = convert.AnnotationPrefix + "probe-up"
	// AnnotationProbeDown lists the nodes that answered before and have
	// not answered as able to forward for the probes' down time (silent,
	// or answering that they cannot forward).
	AnnotationProbeDown = convert.AnnotationPrefix + "probe-down"
	// AnnotationClustersUp lists the linked clusters whose tunnel this node
	// (a location leader) probes and that answer through it.
	AnnotationClustersUp = convert.AnnotationPrefix + "clusters-up"
	// AnnotationClustersDown lists the linked clusters whose tunnel answered
	// this node's probes before and has stopped: none of the cluster's
	// probed leaders answered for the tunnel probes' down time.
	AnnotationClustersDown = convert.AnnotationPrefix + "clusters-down"
)

// Report is what one node says about the others it probes: nodes of its
// own cluster (Up, Down) and the tunnels to linked clusters (ClustersUp,
// ClustersDown). A name in neither list is unknown to the node.
type Report struct {
	Up, Down                 []string
	ClustersUp, ClustersDown []string
}

// ReportFromLease reads the probe results published on a heartbeat Lease.
func ReportFromLease(l *coordinationv1.Lease) Report {
	return Report{
		Up: convert.SplitList(l.Annotations[AnnotationProbeUp]), Down: convert.SplitList(l.Annotations[AnnotationProbeDown]),
		ClustersUp: convert.SplitList(l.Annotations[AnnotationClustersUp]), ClustersDown: convert.SplitList(l.Annotations[AnnotationClustersDown]),
	}
}

func (r Report) equal(o Report) bool {
	return slices.Equal(r.Up, o.Up) && slices.Equal(r.Down, o.Down) &&
		slices.Equal(r.ClustersUp, o.ClustersUp) && slices.Equal(r.ClustersDown, o.ClustersDown)
}

// Judge decides which nodes can carry traffic. It is pure: every node
// computes it from the same published data (Leases and the probe reports in
// them), so all nodes agree on the leaders.
//
// A node is live when its Lease is live (leaseLive: alive at the API) and it
// is not voted down by the data plane: among the lease-live nodes that
// report on it (other than itself), neither those of its own location nor
// those of other locations have a strict majority saying Down. Its own
// location counts apart because a leader must reach its members (a leader
// cut off from its own location forwards nothing for it, however well the
// other locations reach it), and the other locations apart because a leader
// must reach them too. A tie keeps the node live, and a node nobody reports
// on is judged by its Lease alone. location maps node names to a location
// key; nodes missing from it count as in a location of their own.
func Judge(leaseLive map[string]bool, reports map[string]Report, location map[string]string) map[string]bool {
	type tally struct{ ownUp, ownDown, remUp, remDown int }
	votes := make(map[string]*tally, len(leaseLive))
	loc := func(n string) (string, bool) { l, ok := location[n]; return l, ok && l != "" }
	count := func(reporter, subject string, down bool) {
		if reporter == subject || !leaseLive[subject] {
			return
		}
		t := votes[subject]
		if t == nil {
			t = &tally{}
			votes[subject] = t
		}
		lr, okr := loc(reporter)
		ls, oks := loc(subject)
		own := okr && oks && lr == ls
		switch {
		case own && down:
			t.ownDown++
		case own:
			t.ownUp++
		case down:
			t.remDown++
		default:
			t.remUp++
		}
	}
	for r, rep := range reports {
		if !leaseLive[r] {
			continue // a dead node's last words do not count
		}
		for _, s := range rep.Up {
			count(r, s, false)
		}
		for _, s := range rep.Down {
			count(r, s, true)
		}
	}
	out := make(map[string]bool, len(leaseLive))
	for n, live := range leaseLive {
		if t := votes[n]; live && t != nil {
			live = !(2*t.ownDown > t.ownDown+t.ownUp || 2*t.remDown > t.remDown+t.remUp)
		}
		out[n] = live
	}
	return out
}

// Decision is what the planner gets (mesh.Local's Live and Settling).
type Decision struct {
	// Live says which nodes can carry traffic (Judge).
	Live map[string]bool
	// Settling are live nodes that became live less than the takeover delay
	// ago: they lead only where no settled node can.
	Settling map[string]bool
	// Candidates are the leader candidates (DecideCandidates; nil from
	// Decide): only they may lead.
	Candidates map[string]bool
}

func (d Decision) equal(o Decision) bool {
	return maps.Equal(d.Live, o.Live) && maps.Equal(d.Settling, o.Settling)
}

// Liveness judges which nodes are alive, from two signals: the node's
// heartbeat Lease (alive at the API server) and the data-plane probe reports
// the nodes publish in their Leases (forwarding, see Judge).
//
// Leases: a node is lease-live while the last change of its Lease (a new
// resourceVersion or renewTime), timed by the local clock when THIS process
// observed it, is younger than the timeout. Later changes never compare a
// remote renewTime with the local clock. With UseLeaseDurations, each Lease's
// own leaseDurationSeconds is its timeout (the Leases of another cluster,
// whose renew interval this process does not configure).
//
// A Lease seen for the first time (after a restart of this process) is the
// one exception: it counts as a change only if its renewTime is younger than
// the timeout by the local clock. A Lease already stale on first sight is
// dead until it changes, so a long-dead node is not picked as a leader again
// after a restart. This assumes the nodes' clocks agree to well within the
// timeout (NTP; the kubelet's node Lease makes the same assumption): a node
// whose clock runs behind by more than the timeout minus its renew interval
// looks dead to a freshly started meshd until its next renewal, then live. A
// Lease without a renewTime is judged by its first sight alone.
//
// While the API server is unreachable (SetAPIReachable(false)), lease ages
// stop: losing sight of everyone is not everyone dying. When it answers
// again, every Lease gets back the time it had left. A Lease that changes
// meanwhile (the watch may still deliver) ages from when the freeze ends: it
// has its timeout left then, not more (the outage counts for no Lease, for
// or against it), and one stale on first sight is dead, frozen or not.
//
// Hysteresis: a node that becomes live (back from dead, or voted up again)
// is Settling for the takeover delay, and leads only where no settled node
// can; so a recovered preferred leader takes over after it has been healthy
// for that long, not at its first sign of life. Nodes live when this process
// starts are settled at once, and so is a node whose Lease was stale on
// first sight and changes within the timeout of that sight: it was not
// seen dying, its heartbeats were only not seen (an API outage ending as
// this process starts watching: every Lease looks stale until renewed).
// Safe for concurrent use.
type Liveness struct {
	mu       sync.Mutex
	timeout  time.Duration
	perLease bool // UseLeaseDurations
	takeover time.Duration
	now      func() time.Time
	start    time.Time
	seen     map[string]observation
	frozenAt time.Time // non-zero while the API server is unreachable
	location map[string]string
	// voters are the nodes whose probe reports count (DecideCandidates;
	// nil: every node's).
	voters map[string]bool
	// since is when each live node became live; judged marks the nodes
	// evaluated at least once.
	since  map[string]time.Time
	judged map[string]bool
	// last is the decision returned by the last Decide call.
	last Decision
	// quietUntil: until then, with no input changed (see touch), the
	// decision is last; Changed answers without evaluating every node.
	quietUntil time.Time
}

// touch forgets quietUntil: an input of the decision changed.
func (l *Liveness) touch() { l.quietUntil = time.Time{} }

// quiet records, after an evaluation at now that equals last, that only
// the clock can change the decision, at the next deadline (a Lease expiring,
// a node done settling; never while frozen and nothing settles).
func (l *Liveness) quiet(now time.Time) {
	t, ok := l.nextChange(now)
	if !ok {
		t = now.Add(24 * time.Hour) // only new input changes it (touch)
	}
	l.quietUntil = t
}

type observation struct {
	resourceVersion string
	renewTime       time.Time // the remote timestamp, only compared for equality (and on first sight)
	at              time.Time // local time of the last observed change
	timeout         time.Duration
	report          Report
	// staleSight: when this first sight found the Lease stale (zero
	// otherwise, and once it changed); renewedAfterStaleSight: this change
	// follows such a sight within the timeout (see the type doc).
	staleSight             time.Time
	renewedAfterStaleSight bool
}

// NewLiveness returns a Liveness with the given timeout and no takeover
// delay; now is the local clock (time.Now in production).
func NewLiveness(timeout time.Duration, now func() time.Time) *Liveness {
	if now == nil {
		now = time.Now
	}
	return &Liveness{timeout: timeout, now: now, start: now(), seen: map[string]observation{},
		since: map[string]time.Time{}, judged: map[string]bool{}}
}

// SetTakeoverDelay sets how long a node that became live stays Settling.
func (l *Liveness) SetTakeoverDelay(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.takeover = d
	l.touch()
}

// UseLeaseDurations makes each Lease's own spec.leaseDurationSeconds its
// timeout; the timeout given to NewLiveness stays the one of Leases without
// it. Call it before the first Observe.
func (l *Liveness) UseLeaseDurations() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.perLease = true
	l.touch()
}

// Observe records a heartbeat Lease (from an informer's add or update). It
// reports whether the observation may change a decision: a Lease seen for
// the first time, a change of a lease-dead node, or a new probe report. A
// renewal of a live node that reports what it reported before is not one.
// Leases that are not meshd heartbeats are ignored.
func (l *Liveness) Observe(lease *coordinationv1.Lease) bool {
	node, ok := NodeNameFromLease(lease)
	if !ok {
		return false
	}
	var renew time.Time
	if lease.Spec.RenewTime != nil {
		renew = lease.Spec.RenewTime.Time
	}
	report := ReportFromLease(lease)
	l.mu.Lock()
	defer l.mu.Unlock()
	timeout := l.timeout
	if d := lease.Spec.LeaseDurationSeconds; l.perLease && d != nil && *d > 0 {
		timeout = time.Duration(*d) * time.Second
	}
	prev, known := l.seen[node]
	if known && prev.resourceVersion == lease.ResourceVersion && prev.renewTime.Equal(renew) {
		return false
	}
	now := l.now()
	// While frozen, lease ages stand still: an observation is timed at the
	// freeze, so it ages from when the freeze ends, like every other.
	at := now
	if !l.frozenAt.IsZero() {
		at = l.frozenAt
	}
	o := observation{resourceVersion: lease.ResourceVersion, renewTime: renew, at: at, timeout: timeout, report: report}
	if !known && !renew.IsZero() && now.Sub(renew) >= timeout {
		// Stale on first sight: dead until it changes (see the type doc),
		// frozen or not.
		o.at, o.staleSight = at.Add(-timeout), now
	}
	if known && !prev.staleSight.IsZero() && now.Sub(prev.staleSight) < timeout {
		o.renewedAfterStaleSight = true
	}
	l.seen[node] = o
	// A renewal of a lease-live node with the same report only moves its
	// expiry later: quietUntil stays a safe (early) bound.
	if !known || !l.leaseLive(prev, now) || !prev.report.equal(report) {
		l.touch()
		return true
	}
	return false
}

// Forget drops a node (its Lease or Node was deleted).
func (l *Liveness) Forget(nodeName string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.seen, nodeName)
	delete(l.since, nodeName)
	delete(l.judged, nodeName)
	l.touch()
}

// SetAPIReachable tells whether this node can reach the API server (its own
// heartbeat renewal succeeded). While it cannot, lease ages are frozen.
// It reports whether the state changed.
func (l *Liveness) SetAPIReachable(ok bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	switch {
	case !ok && l.frozenAt.IsZero():
		l.frozenAt = now
		l.touch()
		return true
	case ok && !l.frozenAt.IsZero():
		l.thaw(now.Sub(l.frozenAt))
		return true
	}
	return false
}

// Thaw ends a freeze (see SetAPIReachable) giving the Lease ages back at
// most credit of the time it lasted: an outage longer than credit counts
// against every Lease for the rest. A reader that stops trusting what it
// saw before a long outage (pkg/mirror, past its grace period) thaws with
// that period, so a node that died during the outage is not live again
// when the API server answers. It reports whether a freeze ended.
func (l *Liveness) Thaw(credit time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.frozenAt.IsZero() {
		return false
	}
	l.thaw(min(max(credit, 0), l.now().Sub(l.frozenAt)))
	return true
}

// thaw ends the freeze, shifting every observation by d (l.mu held). Every
// observation is timed at or before frozenAt (Observe times those made while
// frozen at frozenAt): with d the whole freeze each gets back the time it
// had left at the freeze, and none more than its timeout.
func (l *Liveness) thaw(d time.Duration) {
	for n, o := range l.seen {
		o.at = o.at.Add(d)
		l.seen[n] = o
	}
	l.frozenAt = time.Time{}
	l.touch()
}

// leaseLive: the Lease changed within the timeout (ages frozen while the
// API server is unreachable).
func (l *Liveness) leaseLive(o observation, now time.Time) bool {
	if !l.frozenAt.IsZero() {
		now = l.frozenAt
	}
	return now.Sub(o.at) < o.timeout
}

// StaleOnFirstSight reports whether node's Lease was stale when first seen
// and has not changed since: dead by the first-sight rule (see the type
// doc), not seen dying.
func (l *Liveness) StaleOnFirstSight(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.seen[node].staleSight.IsZero()
}

// LeaseExpired reports whether node's Lease was observed and is not live,
// by the Lease alone (the probe reports do not count). A node whose Lease
// was never observed (or was forgotten) is not expired.
func (l *Liveness) LeaseExpired(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	o, ok := l.seen[node]
	return ok && !l.leaseLive(o, l.now())
}

// ExpiredLeases lists the nodes whose Lease is expired (LeaseExpired), sorted.
func (l *Liveness) ExpiredLeases() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	var out []string
	for n, o := range l.seen {
		if !l.leaseLive(o, now) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Decide returns the current decision for nodes in the given locations
// (node name to location key, see Judge) and remembers it as the one the
// plan uses (see Changed). Nodes whose Lease was never observed are absent.
func (l *Liveness) Decide(location map[string]string) Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.location = location
	now := l.now()
	d := l.evaluate(now)
	l.last = d
	l.quiet(now)
	return Decision{Live: maps.Clone(d.Live), Settling: maps.Clone(d.Settling)}
}

// Live returns Decide's Live with the last locations.
func (l *Liveness) Live() map[string]bool {
	l.mu.Lock()
	loc := l.location
	l.mu.Unlock()
	return l.Decide(loc).Live
}

// Changed reports whether the decision now differs from the one the last
// Decide returned: a node expired, was voted down or up, or finished
// settling. The caller reconciles then.
//
// It is called every second (and on Lease changes): while no input changed
// and no deadline passed since the last evaluation equal to the decision,
// it answers without evaluating every node.
func (l *Liveness) Changed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Before(l.quietUntil) {
		return false
	}
	if l.evaluate(now).equal(l.last) {
		l.quiet(now)
		return false
	}
	return true
}

// NextChange returns when a decision is next due to change by the clock
// alone (a Lease expiring, a node done settling); ok is false when none is.
func (l *Liveness) NextChange() (t time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextChange(l.now())
}

func (l *Liveness) nextChange(now time.Time) (t time.Time, ok bool) {
	add := func(c time.Time) {
		if c.After(now) && (!ok || c.Before(t)) {
			t, ok = c, true
		}
	}
	if l.frozenAt.IsZero() {
		for _, o := range l.seen {
			add(o.at.Add(o.timeout))
		}
	}
	for _, s := range l.since {
		add(s.Add(l.takeover))
	}
	return t, ok
}

// LeaseLive returns, for every observed node, whether its Lease is live
// (by the Lease alone, as leaseLive; frozen while the API server is
// unreachable): what mesh.Candidates walks.
func (l *Liveness) LeaseLive() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	out := make(map[string]bool, len(l.seen))
	for n, o := range l.seen {
		out[n] = l.leaseLive(o, now)
	}
	return out
}

// DecideCandidates is Decide for nodes, with their leader candidates
// (mesh.Candidates, walked with LeaseLive, k per location) as the only
// voters: only their probe reports count (only they probe, and a node
// watches only their Leases, so every node counts the same votes). The
// decision's Candidates are those candidates; only they may lead
// (mesh.Local.Candidates). Every node, the link controller and meshctl
// judge this way, so they agree.
func (l *Liveness) DecideCandidates(nodes []mesh.Node, g mesh.Granularity, k int) Decision {
	cands := mesh.Candidates(nodes, g, k, l.LeaseLive())
	l.mu.Lock()
	l.voters = cands
	l.mu.Unlock()
	d := l.Decide(convert.LocationKeys(nodes, g))
	d.Candidates = cands
	return d
}

// evaluate computes the decision at now and updates the settling state.
// Only the voters' reports count (all, while voters is nil).
func (l *Liveness) evaluate(now time.Time) Decision {
	leaseLive := make(map[string]bool, len(l.seen))
	reports := make(map[string]Report, len(l.seen))
	for n, o := range l.seen {
		leaseLive[n] = l.leaseLive(o, now)
		if l.voters == nil || l.voters[n] {
			reports[n] = o.report
		}
	}
	live := Judge(leaseLive, reports, l.location)
	d := Decision{Live: live, Settling: map[string]bool{}}
	for n, ok := range live {
		if !ok {
			delete(l.since, n)
			l.judged[n] = true
			continue
		}
		s, known := l.since[n]
		if !known {
			s = now
			if !l.judged[n] && now.Sub(l.start) < l.timeout || l.seen[n].renewedAfterStaleSight {
				// Live when this process started, or its heartbeats were
				// only not seen: settled.
				s = now.Add(-l.takeover)
			}
			l.since[n] = s
		}
		l.judged[n] = true
		if now.Sub(s) < l.takeover {
			d.Settling[n] = true
		}
	}
	return d
}

// ReportAnnotations are the Lease annotations publishing a probe report.
func ReportAnnotations(r Report) map[string]string {
	return map[string]string{
		AnnotationProbeUp: strings.Join(r.Up, ","), AnnotationProbeDown: strings.Join(r.Down, ","),
		AnnotationClustersUp: strings.Join(r.ClustersUp, ","), AnnotationClustersDown: strings.Join(r.ClustersDown, ","),
	}
}
