package main

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

// Event coalescing: every informer event, repair signal and resync tick
// asks for one full reconcile. A reconcile runs coalesceDelay after the
// first event that finds none pending; events until then join it. A token
// bucket (golang.org/x/time/rate: coalesceBurst reconciles, refilled one per
// coalesceInterval) spaces reconciles out only while events keep coming: a
// cold start or a lone change is planned after 50 ms, as always; a burst of
// Node creations spread over seconds costs a handful of reconciles, about
// one per coalesceInterval once the bucket is empty, instead of one per 50 ms.
const (
	coalesceDelay    = 50 * time.Millisecond
	coalesceInterval = 500 * time.Millisecond
	coalesceBurst    = 5
)

// coalescer calls fire for groups of signals: delay after the first signal
// that found nothing pending, later if the token bucket is empty.
type coalescer struct {
	delay time.Duration
	limit *rate.Limiter // read with explicit times from clock
	clock clock.WithDelayedExecution
	fire  func()

	mu      sync.Mutex
	pending *rate.Reservation // the token of the pending fire, nil if none
	timer   clock.Timer
}

func newCoalescer(clk clock.WithDelayedExecution, delay, interval time.Duration, burst int, fire func()) *coalescer {
	return &coalescer{delay: delay, limit: rate.NewLimiter(rate.Every(interval), burst), clock: clk, fire: fire}
}

// signal records that something changed.
func (c *coalescer) signal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending != nil {
		return
	}
	now := c.clock.Now()
	at := now.Add(c.delay)
	// The fire's token is taken when it is due: later if the bucket is empty.
	r := c.limit.ReserveN(at, 1)
	at = at.Add(r.DelayFrom(at))
	c.pending = r
	c.timer = c.clock.AfterFunc(at.Sub(now), c.expire)
}

// expire fires the pending group.
func (c *coalescer) expire() {
	c.mu.Lock()
	if c.pending == nil {
		c.mu.Unlock()
		return
	}
	c.pending = nil
	c.mu.Unlock()
	c.fire()
}

// stop cancels a pending fire and returns its token.
func (c *coalescer) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.pending != nil {
		c.pending.CancelAt(c.clock.Now())
		c.pending = nil
	}
}
