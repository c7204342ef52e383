package main

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Event coalescing: every informer event, repair signal and resync tick
// asks for one full reconcile. A reconcile waits until events have been
// quiet for coalesceQuiet, but never longer than coalesceMaxWait after the
// first event it answers. A lone change is planned after 50 ms; a burst of
// Node creations spread over seconds costs a few reconciles (about one per
// coalesceMaxWait) instead of one per event or one per 50 ms.
const (
	coalesceQuiet   = 50 * time.Millisecond
	coalesceMaxWait = 300 * time.Millisecond
)

// coalescer calls fire once per group of signals: when no signal came for
// quiet, or maxWait after the group's first signal, whichever comes first.
// Signals that arrive while fire runs start a new group.
type coalescer struct {
	quiet, maxWait time.Duration
	clock          clock.WithDelayedExecution
	fire           func()

	mu    sync.Mutex
	timer clock.Timer
	first time.Time // the group's first signal; zero when none is pending
}

func newCoalescer(clk clock.WithDelayedExecution, quiet, maxWait time.Duration, fire func()) *coalescer {
	return &coalescer{quiet: quiet, maxWait: maxWait, clock: clk, fire: fire}
}

// signal records that something changed.
func (c *coalescer) signal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	if c.first.IsZero() {
		c.first = now
	}
	wait := min(c.quiet, c.first.Add(c.maxWait).Sub(now))
	if c.timer != nil {
		c.timer.Stop()
	}
	c.timer = c.clock.AfterFunc(wait, c.expire)
}

func (c *coalescer) expire() {
	c.mu.Lock()
	pending := !c.first.IsZero()
	c.first = time.Time{}
	c.mu.Unlock()
	if pending {
		c.fire()
	}
}

// stop cancels a pending fire.
func (c *coalescer) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.first = time.Time{}
}
