package route

import (
	"context"
	"fmt"
	"time"
)

// Timings of Run.
const (
	repairDelay  = 50 * time.Millisecond // gather a burst of notifications into one repair
	minBackoff   = 100 * time.Millisecond
	maxBackoff   = 30 * time.Second
	healthyAfter = 30 * time.Second // a subscription that lived this long resets the back-off
	// A retry (see retryLater) waits at least minRetryGap after the last
	// repair; the gap doubles, up to maxRetryGap, each time a retry leaves
	// a route missing, and is back to minRetryGap once none is.
	minRetryGap = time.Second
	maxRetryGap = 30 * time.Second
)

// relevance is what a notification calls for.
type relevance int

const (
	// notRelevant: it agrees with what the last sync left, or is not about
	// meshd's routes and rules.
	notRelevant relevance = iota
	// retryLater: it cannot have changed meshd's routes, but a desired
	// route is missing (its gateway was unreachable, its device down or
	// absent) and this may let it be added (a link came up, an address was
	// added somewhere). Rate-limited: a storm of unrelated link or address
	// notifications (pods starting) costs at most one listing per gap.
	retryLater
	// repairSoon: meshd's routes or rules may have changed, or a link or
	// address they depend on did. The next Set looks at the kernel, and
	// Run repairs after repairDelay.
	repairSoon
)

// Run watches the kernel's route, rule, link and address notifications
// until ctx is done. When something other than this Manager adds, changes
// or deletes meshd's routes or rules, or a link they go through changes or
// loses an IPv4 address (the kernel drops IPv4 routes silently with a link
// going down or losing its last IPv4 address), it re-applies the last
// desired set (see Set) and calls changed, if not nil, after a repair that
// had to write. While a desired route is missing (its gateway unreachable,
// its device down or absent), any link or address notification is followed
// by a retry, at most one per second (the gap doubling up to 30 s while
// retries leave a route missing). Nothing is repaired before the first Set
// or after Cleanup.
//
// When the kernel drops the subscription (a burst overran the socket
// buffer: ENOBUFS) or subscribing fails, Run waits (exponential back-off from
// 100ms to 30s), subscribes again and does a full resync, since
// notifications were lost. It also resyncs every Options.ResyncInterval.
// While it watches, a Set that repeats the last desired set after a sync
// that left the kernel matching it, with no relevant notification since,
// trusts the watch and reads nothing from the kernel. Run returns nil when
// ctx is done.
func (m *Manager) Run(ctx context.Context, changed func()) error {
	backoff := minBackoff
	repair := func(reason string) {
		wrote, err := m.resync()
		if err != nil {
			m.log.Warn("repair routes and rules", "reason", reason, "err", err)
		}
		if wrote {
			m.log.Info("repaired routes and rules", "reason", reason)
			if changed != nil {
				changed()
			}
		}
	}
	for first := true; ; first = false {
		if !first {
			m.resubscribes.Add(1)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			backoff = min(2*backoff, maxBackoff)
		}
		done := make(chan struct{})
		events, err := m.k.Subscribe(done)
		if err != nil {
			close(done)
			m.log.Warn("subscribe to route and rule notifications", "err", err, "retry_in", backoff)
			continue
		}
		started := time.Now()
		// Whatever happened while nobody listened.
		m.watching.Store(true)
		repair("subscribed")
		alive := m.watch(ctx, events, repair)
		m.watching.Store(false)
		m.changes.Add(1)
		close(done)
		for range events { // let the subscription's goroutines finish
		}
		if !alive {
			return nil
		}
		if time.Since(started) >= healthyAfter {
			backoff = minBackoff
		}
		m.log.Warn("route and rule subscription lost (overrun?); resubscribing with full resync", "in", backoff)
	}
}

// watch consumes events until the subscription dies (true) or ctx is done
// (false).
func (m *Manager) watch(ctx context.Context, events <-chan Event, repair func(string)) bool {
	ticker := time.NewTicker(m.opts.ResyncInterval)
	defer ticker.Stop()
	next := repairSchedule{retryGap: minRetryGap}
	defer next.stop()
	missing := func() bool { v := m.view.Load(); return v != nil && v.missing }
	for {
		select {
		case <-ctx.Done():
			return false
		case ev, ok := <-events:
			if !ok {
				return true
			}
			if ev.Err != nil {
				m.log.Warn("route and rule notifications", "err", ev.Err)
			}
			switch reason, rel := m.relevant(ev); rel {
			case repairSoon:
				m.changes.Add(1) // the kernel may no longer match: Set must look
				next.repair(reason)
			case retryLater:
				next.retry(reason)
			}
		case <-next.c:
			reason, isRetry := next.fired()
			repair(reason)
			next.done(isRetry, missing())
		case <-ticker.C:
			repair("periodic resync")
			next.done(false, missing())
		}
	}
}

// repairSchedule is when watch repairs next: repairDelay after the first
// notification that calls for a repair (gathering a burst into one), and a
// retry (see retryLater) no sooner than the retry gap after the last
// repair.
type repairSchedule struct {
	timer      *time.Timer
	c          <-chan time.Time // the timer's channel while a repair is due, else nil
	due        time.Time
	reason     string
	isRetry    bool
	lastRepair time.Time
	retryGap   time.Duration
}

func (s *repairSchedule) repair(reason string) { s.at(reason, time.Now().Add(repairDelay), false) }

func (s *repairSchedule) retry(reason string) {
	at := time.Now().Add(repairDelay)
	if gap := s.lastRepair.Add(s.retryGap); gap.After(at) {
		at = gap
	}
	s.at(reason, at, true)
}

// at makes sure a repair runs by t.
func (s *repairSchedule) at(reason string, t time.Time, isRetry bool) {
	if s.c != nil && !t.Before(s.due) {
		return // one is due sooner
	}
	s.stop()
	s.timer = time.NewTimer(time.Until(t))
	s.c, s.due, s.reason, s.isRetry = s.timer.C, t, reason, isRetry
}

// fired takes the due repair's reason, when its timer fired.
func (s *repairSchedule) fired() (string, bool) {
	s.c = nil
	return s.reason, s.isRetry
}

// done records a repair, and whether it left a desired route missing.
func (s *repairSchedule) done(isRetry, missing bool) {
	s.lastRepair = time.Now()
	switch {
	case !missing:
		s.retryGap = minRetryGap
	case isRetry:
		s.retryGap = min(2*s.retryGap, maxRetryGap)
	}
}

func (s *repairSchedule) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
}

// relevant says why ev calls for a repair or a retry, or notRelevant when it
// agrees with what the last sync left in the kernel (our own writes) or is
// not about ours.
func (m *Manager) relevant(ev Event) (string, relevance) {
	if ev.Err != nil {
		return "notifications lost: " + ev.Err.Error(), repairSoon
	}
	v := m.view.Load()
	if v == nil || !v.haveDesired {
		return "", notRelevant
	}
	switch {
	case ev.Route != nil:
		return m.relevantRoute(v, *ev.Route, ev.Deleted)
	case ev.Link != nil:
		// The kernel drops IPv4 routes through a link that goes down or
		// away, without a route notification.
		idx := ev.Link.Index
		switch {
		case v.links[idx]:
			return fmt.Sprintf("link %d changed", idx), repairSoon
		case v.missing:
			return fmt.Sprintf("link %d changed while a route is missing", idx), retryLater
		}
	case ev.Addr != nil:
		a := ev.Addr
		what := fmt.Sprintf("address %s added to link %d", a.Addr, a.LinkIndex)
		if a.Deleted {
			what = fmt.Sprintf("address %s removed from link %d", a.Addr, a.LinkIndex)
		}
		switch {
		case a.Deleted && a.Addr.Is4() && v.links[a.LinkIndex]:
			// The kernel drops the IPv4 routes through a link that lost
			// its last IPv4 address, every table's, without a route
			// notification.
			return what, repairSoon
		case v.missing && !a.Deleted && a.Addr.Is4() && v.links[a.LinkIndex]:
			// The IPv4 address back on a missing route's link (the end
			// of a DHCP renewal): its gateway may be reachable again.
			return what, repairSoon
		case v.missing:
			return what + " while a route is missing", retryLater
		}
	case ev.Rule != nil:
		r := ev.Rule
		id := r.id()
		if !m.ownsRule(*r) && !v.desiredRules[id] {
			return "", notRelevant
		}
		switch in := v.rules[id]; {
		case ev.Deleted && in:
			return "rule deleted: " + r.String(), repairSoon
		case !ev.Deleted && !in:
			return "rule added: " + r.String(), repairSoon
		}
	}
	return "", notRelevant
}

func (m *Manager) relevantRoute(v *view, r KernelRoute, deleted bool) (string, relevance) {
	if r.Protocol != m.opts.Protocol || !v.tables[r.Table] {
		return "", notRelevant
	}
	in := v.routes[r]
	if !in {
		// A route asked for without device is recorded without the
		// interface the kernel chose until it is read back.
		z := r
		z.LinkIndex = 0
		in = v.routes[z]
	}
	switch {
	case deleted && in:
		return "route deleted: " + r.String(), repairSoon
	case !deleted && !in:
		return "route added: " + r.String(), repairSoon
	}
	return "", notRelevant
}
