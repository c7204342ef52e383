package main

import (
	"log/slog"
	"maps"
	"sync"
	"time"
)

// liveFreeze keeps liveness decisions still while this node cannot see the
// API server: losing sight of everyone is not everyone dying.
//
// The signal is this node's own heartbeat Lease. meshd renews it every
// quarter of --lease-duration, and the Lease informer sees each renewal come
// back. If no change of it has been seen for half the lease duration, the API
// path (writes or watch) is broken. The live set from before is then kept,
// instead of letting every node's Lease expire one after the other (which
// moves leaders around, and brings the dead ones back once all have
// expired). Other nodes' Leases cannot expire first: each was renewed at most
// a quarter of the lease duration before the outage, so it expires at least
// three quarters into it, and the freeze starts at half.
//
// After the API comes back (own Lease seen again), the freeze lasts another
// half lease duration. Every live node renews in that time, so a node whose
// renewal is merely later than this one's is not judged dead.
type liveFreeze struct {
	log   *slog.Logger
	stale time.Duration // own Lease unseen this long: frozen
	grace time.Duration // frozen this long after it is seen again

	mu        sync.Mutex
	selfSeen  time.Time // last observed change of the own Lease
	recovered time.Time // when it was seen again after being stale
	frozen    bool
	last      map[string]bool // the live set of the last unfrozen plan
}

func newLiveFreeze(log *slog.Logger, leaseDuration time.Duration, now time.Time) *liveFreeze {
	return &liveFreeze{log: log, stale: leaseDuration / 2, grace: leaseDuration / 2, selfSeen: now}
}

// selfObserved records a change of this node's own Lease.
func (f *liveFreeze) selfObserved(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now.Sub(f.selfSeen) > f.stale {
		f.recovered = now
	}
	f.selfSeen = now
}

// freezing is whether the live set is frozen at now (f.mu held).
func (f *liveFreeze) freezing(now time.Time) bool {
	stale := now.Sub(f.selfSeen) > f.stale
	return f.last != nil && (stale || now.Sub(f.recovered) < f.grace)
}

// due reports whether the freeze starts or ends at now relative to the last
// plan: the end of the grace changes the plan (nodes that died during the
// outage go) without any event, so the daemon's tick asks this.
func (f *liveFreeze) due(now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.freezing(now) != f.frozen
}

// live returns the live set to plan with: live itself, or while the API
// path is broken (and for the grace after), the last one used before.
func (f *liveFreeze) live(live map[string]bool, now time.Time) map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	freeze := f.freezing(now)
	if freeze != f.frozen {
		f.frozen = freeze
		if freeze {
			f.log.Warn("own heartbeat Lease not seen changing: the API server is unreachable; liveness frozen (leaders kept)", "last_seen", f.selfSeen)
		} else {
			f.log.Info("API server reachable again; liveness unfrozen")
		}
	}
	if freeze {
		return f.last
	}
	f.last = maps.Clone(live)
	if f.last == nil {
		f.last = map[string]bool{}
	}
	return live
}
