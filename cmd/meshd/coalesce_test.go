package main

import (
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestCoalescer steps a fake clock in 10 ms steps, signalling at the given
// times, and checks when fire ran.
func TestCoalescer(t *testing.T) {
	const ms = time.Millisecond
	cases := []struct {
		name      string
		signalsAt []time.Duration // when signals arrive
		until     time.Duration
		wantFires []time.Duration // when fire must have run (10 ms resolution)
	}{
		{"one signal fires after the delay", []time.Duration{0}, 500 * ms, []time.Duration{50 * ms}},
		{"signals within the delay join the first", []time.Duration{0, 20 * ms, 40 * ms}, 500 * ms, []time.Duration{50 * ms}},
		{"later signals are not held back by earlier ones", []time.Duration{0, 60 * ms, 120 * ms}, 500 * ms,
			[]time.Duration{50 * ms, 110 * ms, 170 * ms}},
		// A cold start: a few events close together still go at 50 ms each.
		{"a few quick groups use the bucket", every(0, 400*ms, 100*ms), 1000 * ms,
			[]time.Duration{50 * ms, 150 * ms, 250 * ms, 350 * ms, 450 * ms}},
		// A burst: five at 50 ms spacing (the bucket refilling a little
		// meanwhile), then one per 500 ms.
		{"a steady stream is spaced out once the bucket is empty", every(0, 2000*ms, 10*ms), 3000 * ms,
			[]time.Duration{50 * ms, 100 * ms, 150 * ms, 200 * ms, 250 * ms, 550 * ms, 1050 * ms, 1550 * ms, 2050 * ms}},
		{"the bucket refills while idle", append(every(0, 300*ms, 10*ms), every(2000*ms, 2300*ms, 10*ms)...), 3000 * ms,
			[]time.Duration{50 * ms, 100 * ms, 150 * ms, 200 * ms, 250 * ms, 550 * ms, 2050 * ms, 2100 * ms, 2150 * ms, 2550 * ms}},
		{"nothing, no fire", nil, 500 * ms, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			clk := clocktesting.NewFakeClock(start)
			// The fake clock runs AfterFunc functions inside Step.
			var fires atomic.Int32
			c := newCoalescer(clk, coalesceDelay, coalesceInterval, coalesceBurst, func() { fires.Add(1) })
			var got []time.Duration
			next := 0
			for now := time.Duration(0); now <= tc.until; now += 10 * ms {
				for next < len(tc.signalsAt) && tc.signalsAt[next] <= now {
					c.signal()
					next++
				}
				clk.Step(10 * ms)
				for range fires.Swap(0) {
					got = append(got, clk.Since(start))
				}
			}
			if len(got) != len(tc.wantFires) {
				t.Fatalf("fired at %v, want %v", got, tc.wantFires)
			}
			for i := range got {
				if got[i] != tc.wantFires[i] {
					t.Fatalf("fired at %v, want %v", got, tc.wantFires)
				}
			}
		})
	}
}

func TestCoalescerStop(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	var n atomic.Int32
	c := newCoalescer(clk, coalesceDelay, coalesceInterval, coalesceBurst, func() { n.Add(1) })
	c.signal()
	c.stop()
	clk.Step(time.Second)
	if n.Load() != 0 {
		t.Fatalf("fired %d times after stop", n.Load())
	}
}

func every(from, to, step time.Duration) []time.Duration {
	var out []time.Duration
	for d := from; d <= to; d += step {
		out = append(out, d)
	}
	return out
}
