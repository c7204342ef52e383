package probe

import (
	"context"
	"net"
	"net/netip"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

func waitState(t *testing.T, p *Prober, name string, want State, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got, ok := p.Results()[name]
		if !ok {
			got = Unknown
		}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: state %s, want %s within %s", name, got, want, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// responder answers probes on a loopback socket of its own: kind says
// what to answer the n-th request (from 1) with, 0 for nothing. It returns
// its address and the number of requests it got.
func responder(t *testing.T, kind func(n int32) byte) (netip.AddrPort, *atomic.Int32) {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var n atomic.Int32
	go func() {
		buf := make([]byte, 64)
		for {
			k, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if req, seq, ok := decode(buf[:k]); ok && req == kindRequest {
				if reply := kind(n.Add(1)); reply != 0 {
					_, _ = c.WriteToUDPAddrPort(encode(reply, seq), from)
				}
			}
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort(), &n
}

// waitCount waits until n reaches want.
func waitCount(t *testing.T, what string, n *atomic.Int32, want int32, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for n.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d, want %d within %s", what, n.Load(), want, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func start(t *testing.T, p *Prober) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		done <- nil // for the cleanup
	}
}

// Two probers over loopback: Unknown until the first answer, Up, Down after
// the responder stops, Up again only after UpAfter answers, Down while the
// responder reports itself unhealthy; a target that never answered stays
// Unknown and is left out of Results.
func TestProber(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	var changes atomic.Int32
	a, err := New(Options{Port: pa, Interval: 20 * time.Millisecond, DownAfter: 150 * time.Millisecond, UpAfter: 3,
		OnChange: func() { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	var sick atomic.Bool
	newB := func() *Prober {
		b, err := New(Options{Port: pb, Interval: time.Hour, Healthy: func() bool { return !sick.Load() }})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	lo := netip.MustParseAddr("127.0.0.1")
	if !a.SetTargets([]Target{{Name: "b", Addr: netip.AddrPortFrom(lo, uint16(pb))}, {Name: "void", Addr: netip.AddrPortFrom(lo, 9)}, {Name: "bad"}}) {
		t.Fatal("SetTargets: no change reported for a new set")
	}
	start(t, a)
	time.Sleep(100 * time.Millisecond)
	if got := a.Results(); len(got) != 0 {
		t.Fatalf("results before any answer: %v", got)
	}
	stopB := start(t, newB())
	waitState(t, a, "b", Up, 5*time.Second)
	if changes.Load() == 0 {
		t.Error("OnChange not called when b came up")
	}

	stopB()
	waitState(t, a, "b", Down, 5*time.Second)
	up, down := Split(a.Results())
	if len(up) != 0 || !reflect.DeepEqual(down, []string{"b"}) {
		t.Errorf("Split = %v %v, want [] [b] (void never answered: unknown)", up, down)
	}

	start(t, newB())
	waitState(t, a, "b", Up, 5*time.Second)

	sick.Store(true)
	waitState(t, a, "b", Down, 5*time.Second)
	sick.Store(false)
	waitState(t, a, "b", Up, 5*time.Second)

	// Same targets: no change, state kept. A moved target starts over.
	if a.SetTargets([]Target{{Name: "b", Addr: netip.AddrPortFrom(lo, uint16(pb))}, {Name: "void", Addr: netip.AddrPortFrom(lo, 9)}}) {
		t.Error("SetTargets reported a change for the same set")
	}
	if a.Results()["b"] != Up {
		t.Error("an unchanged target lost its state")
	}
	if !a.SetTargets([]Target{{Name: "b", Addr: netip.AddrPortFrom(lo, 9)}}) {
		t.Error("SetTargets: a moved target is a change")
	}
	if _, ok := a.Results()["b"]; ok {
		t.Error("a moved target kept its state")
	}
}

func TestDecode(t *testing.T) {
	b := encode(kindRequest, 42)
	if k, s, ok := decode(b); !ok || k != kindRequest || s != 42 {
		t.Errorf("decode(encode) = %d %d %v", k, s, ok)
	}
	for _, bad := range [][]byte{nil, b[:8], append([]byte("xxxx"), b[4:]...)} {
		if _, _, ok := decode(bad); ok {
			t.Errorf("decode(%q) accepted", bad)
		}
	}
	if _, err := New(Options{}); err == nil {
		t.Error("New accepted port 0")
	}
}

// A target probed at every 4th interval gets about a quarter of the probes
// one probed at every interval gets, and goes Down only after 4 times
// DownAfter.
func TestProberEvery(t *testing.T) {
	a, err := New(Options{Port: freePort(t), Interval: 20 * time.Millisecond, DownAfter: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var answer atomic.Bool
	answer.Store(true)
	healthy := func(int32) byte {
		if answer.Load() {
			return kindHealthy
		}
		return 0
	}
	slowAddr, slow := responder(t, healthy)
	fastAddr, fast := responder(t, healthy)
	a.SetTargets([]Target{{Name: "slow", Addr: slowAddr, Every: 4}, {Name: "fast", Addr: fastAddr}})
	start(t, a)
	waitState(t, a, "slow", Up, 5*time.Second)
	waitState(t, a, "fast", Up, 5*time.Second)
	s0, f0 := slow.Load(), fast.Load()
	time.Sleep(800 * time.Millisecond)
	ds, df := slow.Load()-s0, fast.Load()-f0
	if df < 8 || 2*ds > df || 8*ds < df {
		t.Errorf("%d probes of the slow target, %d of the fast one: want about a quarter", ds, df)
	}
	answer.Store(false)
	silent := time.Now()
	waitState(t, a, "fast", Down, 5*time.Second)
	waitState(t, a, "slow", Down, 5*time.Second)
	if took := time.Since(silent); took < 300*time.Millisecond {
		t.Errorf("slow target Down after %v of silence, want about 4 x 100 ms", took)
	}
	// A new Every on the same target: a change, the state is kept.
	if !a.SetTargets([]Target{{Name: "slow", Addr: slowAddr}, {Name: "fast", Addr: fastAddr}}) {
		t.Error("a new Every is no change")
	}
	if a.Results()["slow"] != Down {
		t.Error("the target lost its state")
	}
}

// Without targets the loop sends nothing at the interval: it waits for
// targets (a node that is no leader candidate wakes for nothing), and a new
// set of targets is probed at once.
func TestLoopIdleWithoutTargets(t *testing.T) {
	p, err := New(Options{Port: freePort(t), Interval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var sends atomic.Int32
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.loop(ctx, c, func() { <-ctx.Done() }, func() { sends.Add(1) }) }()
	defer func() { cancel(); <-done }()
	time.Sleep(200 * time.Millisecond) // 40 intervals
	if n := sends.Load(); n != 1 {
		t.Errorf("%d sends without targets in 40 intervals, want the first one only", n)
	}
	p.SetTargets([]Target{{Name: "x", Addr: netip.MustParseAddrPort("127.0.0.1:9")}})
	deadline := time.Now().Add(5 * time.Second)
	for sends.Load() < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sends with a target", sends.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A node probed at an address its replies do not come from (a secondary
// address or a VIP: the responder's wildcard socket answers from the
// address its routing picks, here 127.0.0.1 for 127.0.0.2) goes Up, and
// Down when it stops answering: replies are matched by sequence number.
func TestProberReplyFromAnotherAddress(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	a, err := New(Options{Port: pa, Interval: 20 * time.Millisecond, DownAfter: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Port: pb, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	a.SetTargets([]Target{{Name: "b", Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(pb))}})
	start(t, a)
	stopB := start(t, b)
	waitState(t, a, "b", Up, 5*time.Second)
	stopB()
	waitState(t, a, "b", Down, 5*time.Second)
}

// UpAfter counts replies to consecutive probes: a Down target on a lossy
// link, answering one probe in three, stays Down however many replies it
// sends; answering every probe it is Up again. A target probed every 3rd
// interval counts its own probes, not the intervals.
func TestProberUpAfterConsecutiveReplies(t *testing.T) {
	const (
		all = iota
		none
		oneInThree
	)
	var mode atomic.Int32
	kind := func(n int32) byte {
		switch mode.Load() {
		case all:
			return kindHealthy
		case oneInThree:
			if n%3 == 0 {
				return kindHealthy
			}
		}
		return 0
	}
	lossyAddr, lossy := responder(t, kind)
	slowAddr, slow := responder(t, kind)
	a, err := New(Options{Port: freePort(t), Interval: 10 * time.Millisecond, DownAfter: 100 * time.Millisecond, UpAfter: 3})
	if err != nil {
		t.Fatal(err)
	}
	a.SetTargets([]Target{{Name: "lossy", Addr: lossyAddr}, {Name: "slow", Addr: slowAddr, Every: 3}})
	start(t, a)
	waitState(t, a, "lossy", Up, 5*time.Second)
	waitState(t, a, "slow", Up, 5*time.Second)
	mode.Store(none)
	waitState(t, a, "lossy", Down, 5*time.Second)
	waitState(t, a, "slow", Down, 5*time.Second)

	mode.Store(oneInThree)
	l0, s0 := lossy.Load(), slow.Load()
	waitCount(t, "requests to lossy", lossy, l0+15, 5*time.Second) // 5 replies, none to consecutive probes
	waitCount(t, "requests to slow", slow, s0+15, 5*time.Second)
	if got := a.Results(); got["lossy"] != Down || got["slow"] != Down {
		t.Fatalf("one probe in three answered, UpAfter 3: results %v, want both still down", got)
	}

	mode.Store(all)
	waitState(t, a, "lossy", Up, 5*time.Second)
	waitState(t, a, "slow", Up, 5*time.Second)
}

// A target that answers from the start, but only that it cannot forward,
// is Down after DownAfter (times its Every), not Unknown: it must not lead.
// Once it can forward it is Up after UpAfter replies; a target that never
// answers stays Unknown.
func TestProberUnhealthyFromStartIsDown(t *testing.T) {
	var sick atomic.Bool
	sick.Store(true)
	kind := func(int32) byte {
		if sick.Load() {
			return kindSick
		}
		return kindHealthy
	}
	fastAddr, _ := responder(t, kind)
	slowAddr, _ := responder(t, kind)
	var changes atomic.Int32
	a, err := New(Options{Port: freePort(t), Interval: 20 * time.Millisecond, DownAfter: 100 * time.Millisecond, UpAfter: 3,
		OnChange: func() { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	a.SetTargets([]Target{{Name: "fast", Addr: fastAddr}, {Name: "slow", Addr: slowAddr, Every: 4},
		{Name: "void", Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 9)}})
	began := time.Now()
	start(t, a)
	waitState(t, a, "fast", Down, 5*time.Second)
	// OnChange runs after the state is visible in Results: wait for it.
	for deadline := time.Now().Add(5 * time.Second); changes.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("OnChange not called when fast went down")
		}
	}
	waitState(t, a, "slow", Down, 5*time.Second)
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Errorf("slow target Down after %v of unhealthy replies, want about 4 x 100 ms", took)
	}
	if s, ok := a.Results()["void"]; ok {
		t.Errorf("void never answered: %s, want left out (unknown)", s)
	}
	sick.Store(false)
	waitState(t, a, "fast", Up, 5*time.Second)
	waitState(t, a, "slow", Up, 5*time.Second)
}
