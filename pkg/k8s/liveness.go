package k8s

import (
	"maps"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// Liveness judges which nodes are alive from when THIS process observed
// their heartbeat Leases change: a node is live while the last change of its
// Lease (a new resourceVersion or renewTime), timed by the local clock, is
// younger than the timeout. Later changes never compare a remote renewTime
// with the local clock.
//
// A Lease seen for the first time (after a restart of this process) is the
// one exception: it counts as a change only if its renewTime is younger than
// the timeout by the local clock. A Lease already stale on first sight is
// dead until it changes, so a long-dead node is not picked as a leader again
// after a restart. This assumes the nodes' clocks agree to well within the
// timeout (NTP; the kubelet's node Lease makes the same assumption): a node
// whose clock runs behind by more than the timeout minus its renew interval
// looks dead to a freshly started meshd until its next renewal, then live. A
// Lease without a renewTime is judged by its first sight alone. Safe for
// concurrent use.
type Liveness struct {
	mu      sync.Mutex
	timeout time.Duration
	now     func() time.Time
	seen    map[string]observation
	// lastLive is the live set returned by the last Live call.
	lastLive map[string]bool
}

type observation struct {
	resourceVersion string
	renewTime       time.Time // the remote timestamp, only compared for equality
	at              time.Time // local time of the last observed change
}

// NewLiveness returns a Liveness with the given timeout; now is the local
// clock (time.Now in production).
func NewLiveness(timeout time.Duration, now func() time.Time) *Liveness {
	if now == nil {
		now = time.Now
	}
	return &Liveness{timeout: timeout, now: now, seen: map[string]observation{}}
}

// Observe records a heartbeat Lease (from an informer's add or update). It
// reports whether the Lease changed since last observed (always true the
// first time). Leases that are not meshd heartbeats are ignored.
func (l *Liveness) Observe(lease *coordinationv1.Lease) bool {
	node, ok := NodeNameFromLease(lease)
	if !ok {
		return false
	}
	var renew time.Time
	if lease.Spec.RenewTime != nil {
		renew = lease.Spec.RenewTime.Time
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	prev, known := l.seen[node]
	if known && prev.resourceVersion == lease.ResourceVersion && prev.renewTime.Equal(renew) {
		return false
	}
	now := l.now()
	at := now
	if !known && !renew.IsZero() && now.Sub(renew) >= l.timeout {
		// Stale on first sight: dead until it changes (see the type doc).
		at = now.Add(-l.timeout)
	}
	l.seen[node] = observation{resourceVersion: lease.ResourceVersion, renewTime: renew, at: at}
	return true
}

// Forget drops a node (its Lease or Node was deleted).
func (l *Liveness) Forget(nodeName string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.seen, nodeName)
}

// Live returns every node whose Lease was ever observed, mapped to whether a
// change was observed within the timeout. Nodes never observed are absent.
func (l *Liveness) Live() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	out := make(map[string]bool, len(l.seen))
	for n, o := range l.seen {
		out[n] = l.live(o, now)
	}
	l.lastLive = out
	return maps.Clone(out)
}

func (l *Liveness) live(o observation, now time.Time) bool {
	return now.Sub(o.at) < l.timeout
}

// Expired reports whether a node that the last Live call reported live has
// since expired: the plan built from that Live result is stale. It keeps
// reporting true until Live is called again.
func (l *Liveness) Expired() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	for n, was := range l.lastLive {
		if !was {
			continue
		}
		if o, ok := l.seen[n]; ok && !l.live(o, now) {
			return true
		}
	}
	return false
}
