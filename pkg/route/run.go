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
)

// Run watches the kernel's route and rule notifications until ctx is done.
// When something other than this Manager adds, changes or deletes meshd's
// routes or rules, it re-applies the last desired set (see Set) and calls
// changed, if not nil, after a repair that had to write. Nothing is repaired
// before the first Set or after Cleanup.
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
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var timerC <-chan time.Time
	pending := ""
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
			reason := m.relevant(ev)
			if reason != "" {
				m.changes.Add(1) // the kernel may no longer match: Set must look
			}
			if reason != "" && timerC == nil {
				timer = time.NewTimer(repairDelay)
				timerC, pending = timer.C, reason
			}
		case <-timerC:
			timerC = nil
			repair(pending)
		case <-ticker.C:
			repair("periodic resync")
		}
	}
}

// relevant says why ev calls for a repair, or "" when it agrees with what
// the last sync left in the kernel (our own writes) or is not about ours.
func (m *Manager) relevant(ev Event) string {
	if ev.Err != nil {
		return "notifications lost: " + ev.Err.Error()
	}
	v := m.view.Load()
	if v == nil || !v.haveDesired {
		return ""
	}
	if r := ev.Route; r != nil {
		if r.Protocol != m.opts.Protocol || !v.tables[r.Table] {
			return ""
		}
		in := v.routes[*r]
		if !in {
			// A route asked for without device is recorded without the
			// interface the kernel chose.
			z := *r
			z.LinkIndex = 0
			in = v.routes[z]
		}
		switch {
		case ev.Deleted && in:
			return "route deleted: " + r.String()
		case !ev.Deleted && !in:
			return "route added: " + r.String()
		}
		return ""
	}
	if l := ev.Link; l != nil {
		// The kernel drops IPv4 routes through a link that goes down or
		// away, without a route notification.
		if v.links[l.Index] {
			return fmt.Sprintf("link %d changed", l.Index)
		}
		return ""
	}
	if r := ev.Rule; r != nil {
		id := r.id()
		if !m.ownsRule(*r) && !v.desiredRules[id] {
			return ""
		}
		switch in := v.rules[id]; {
		case ev.Deleted && in:
			return "rule deleted: " + r.String()
		case !ev.Deleted && !in:
			return "rule added: " + r.String()
		}
	}
	return ""
}
