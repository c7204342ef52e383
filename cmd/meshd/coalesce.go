package main

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Event coalescing: every informer event, repair signal and resync tick
// asks for one full reconcile. A reconcile runs coalesceDelay after the
// first event that finds none pending; events until then join it. A token
// bucket (coalesceBurst reconciles, refilled one per coalesceInterval)
// spaces reconciles out only while events keep coming: a cold start or a
// lone change is planned after 50 ms, as always; a burst of Node creations
// spread over seconds costs a handful of reconciles, about one per
// coalesceInterval once the bucket is empty, instead of one per 50 ms.
const (
	coalesceDelay    = 50 * time.Millisecond
	coalesceInterval = 500 * time.Millisecond
	coalesceBurst    = 5
)

// coalescer calls fire for groups of signals: delay after the first signal
// that found nothing pending, later if the token bucket is empty.
type coalescer struct {
	delay, interval time.Duration
	burst           float64
	clock           clock.WithDelayedExecution
	fire            func()

	mu      sync.Mutex
	pending bool
	timer   clock.Timer
	tokens  float64   // as of last
	last    time.Time // when tokens was computed (zero: never, bucket full)
}

func newCoalescer(clk clock.WithDelayedExecution, delay, interval time.Duration, burst int, fire func()) *coalescer {
	return &coalescer{delay: delay, interval: interval, burst: float64(burst), tokens: float64(burst), clock: clk, fire: fire}
}

// tokensAt is the bucket's content at t (t not before c.last).
func (c *coalescer) tokensAt(t time.Time) float64 {
	if c.last.IsZero() {
		return c.burst
	}
	return min(c.burst, c.tokens+float64(t.Sub(c.last))/float64(c.interval))
}

// signal records that something changed.
func (c *coalescer) signal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending {
		return
	}
	c.pending = true
	now := c.clock.Now()
	at := now.Add(c.delay)
	if tk := c.tokensAt(at); tk < 1 {
		at = at.Add(time.Duration((1 - tk) * float64(c.interval)))
	}
	c.timer = c.clock.AfterFunc(at.Sub(now), func() { c.expire(at) })
}

// expire fires the pending group; at is when it was due (the bucket is
// accounted at that time, which keeps the clock out of the timer function).
func (c *coalescer) expire(at time.Time) {
	c.mu.Lock()
	if !c.pending {
		c.mu.Unlock()
		return
	}
	c.pending = false
	c.tokens, c.last = max(0, c.tokensAt(at)-1), at
	c.mu.Unlock()
	c.fire()
}

// stop cancels a pending fire.
func (c *coalescer) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.pending = false
}
