package probe

import (
	"net/netip"
	"testing"
	"time"
)

// fakeClock is a Prober's clock in tests that call its internals.
type fakeClock struct{ t time.Time }

func newFakeClock() *fakeClock            { return &fakeClock{t: time.Unix(1e9, 0)} }
func (c *fakeClock) now() time.Time       { return c.t }
func (c *fakeClock) step(d time.Duration) { c.t = c.t.Add(d) }

// state is name's state, Unknown when left out of Results.
func state(p *Prober, name string) State { return p.Results()[name] }

// seqOf is the sequence number of the one probe in ps.
func seqOf(t *testing.T, ps []outProbe) uint64 {
	t.Helper()
	return only(t, ps).seq
}

// only is the one probe in ps.
func only(t *testing.T, ps []outProbe) outProbe {
	t.Helper()
	if len(ps) != 1 {
		t.Fatalf("%d probes due, want 1", len(ps))
	}
	return ps[0]
}

// interval is one probe interval of the loop: the probes due, then expire.
func interval(p *Prober, c *fakeClock) []outProbe {
	ps := p.due(nil)
	p.expire()
	c.step(p.o.Interval)
	return ps
}

// Replies are matched to probes by sequence number, from any address: one
// to an unknown, an answered, or a too old probe is ignored, and so are
// replies to the probes of a target removed or moved; the probes
// remembered stay bounded however many go unanswered.
func TestProberReplyMatching(t *testing.T) {
	c := newFakeClock()
	p, err := New(Options{Port: 1, Now: c.now, Interval: 500 * time.Millisecond, DownAfter: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort("10.0.0.2:51821")
	p.SetTargets([]Target{{Name: "a", Addr: a}})
	seq := seqOf(t, interval(p, c))
	if p.reply(seq+1, netip.Addr{}, true) || state(p, "a") != Unknown {
		t.Fatal("a reply to no probe counted")
	}
	if !p.reply(seq, netip.Addr{}, true) || state(p, "a") != Up {
		t.Fatal("the reply to a's probe did not bring it up")
	}
	if p.reply(seq, netip.Addr{}, true) {
		t.Error("a duplicate reply reported a change")
	}

	// Up at 0.5 s; its next probes go unanswered. A late reply to the
	// first of them (at 2 s) is still taken; one to a probe more than
	// inFlight ago (at 4 s) is not: it does not keep a silent target Up.
	var seqs []uint64
	for range 3 {
		seqs = append(seqs, seqOf(t, interval(p, c)))
	}
	p.reply(seqs[0], netip.Addr{}, true)
	for range inFlight {
		seqs = append(seqs, seqOf(t, interval(p, c)))
	}
	p.reply(seqs[1], netip.Addr{}, true)
	if p.expire(); state(p, "a") != Down {
		t.Fatalf("a is %s 2 s after its last reply to a recent probe, want down (a stale reply kept it up)", state(p, "a"))
	}
	// A reply to a probe older than one answered is ignored too.
	p.reply(seqs[len(seqs)-1], netip.Addr{}, true)
	ta := *p.targets["a"]
	p.reply(seqs[len(seqs)-2], netip.Addr{}, true)
	if got := *p.targets["a"]; got.answered != ta.answered || got.streak != ta.streak || got.lastOK != ta.lastOK {
		t.Errorf("a reply older than an answered one counted: answered %d, streak %d; want %d, %d", got.answered, got.streak, ta.answered, ta.streak)
	}

	// Many probes unanswered: inFlight remembered per target.
	p.SetTargets([]Target{{Name: "a", Addr: a}, {Name: "b", Addr: netip.MustParseAddrPort("10.0.0.3:51821")}})
	for range 1000 {
		interval(p, c)
	}
	if n := len(p.bySeq); n > 2*inFlight {
		t.Errorf("%d probes remembered for 2 targets, want at most %d", n, 2*inFlight)
	}
	// b moves, a goes: their probes' replies are ignored.
	var old []uint64
	for _, o := range interval(p, c) {
		old = append(old, o.seq)
	}
	p.SetTargets([]Target{{Name: "b", Addr: netip.MustParseAddrPort("10.0.0.4:51821")}})
	for _, s := range old {
		if p.reply(s, netip.Addr{}, true) {
			t.Errorf("a reply to a probe sent before the targets changed counted")
		}
	}
	if len(p.Results()) != 0 {
		t.Errorf("results %v, want none", p.Results())
	}
	if n := len(p.bySeq); n > inFlight {
		t.Errorf("%d probes remembered for 1 target, want at most %d", n, inFlight)
	}
}

// Sequence numbers start at random (replies to an earlier process's
// probes match nothing) and ICMP replies, whose echo carries 16 bits of
// them, are matched by those and by the address probed.
func TestProberReplyMatchingICMP(t *testing.T) {
	c := newFakeClock()
	p1, _ := New(Options{Port: 1, Now: c.now})
	p2, _ := New(Options{Port: 1, Now: c.now})
	if p1.seq == p2.seq {
		t.Errorf("two probers start at sequence number %d", p1.seq)
	}
	p, err := New(Options{Port: 1, ICMP: true, UpAfter: 1, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr("10.4.0.1")
	p.SetTargets([]Target{{Name: "c2/10.4.0.1", Addr: netip.AddrPortFrom(addr, 0)}, {Name: "v6", Addr: netip.MustParseAddrPort("[fd00::1]:0")}})
	o := only(t, p.due(func(t *target) bool { return t.addr.Addr().Is4() }))
	echoed := uint64(uint16(o.seq))
	if p.reply(echoed, netip.MustParseAddr("10.4.0.2"), true) {
		t.Error("an ICMP reply from another address counted")
	}
	if !p.reply(echoed, addr, true) || state(p, "c2/10.4.0.1") != Up {
		t.Error("the ICMP reply with the probe's 16-bit sequence number did not count")
	}
}

// A target answering only "cannot forward" is Down after DownAfter from its
// first reply (times Every), not before; while it answers healthily it is
// Up, and back from Down only after UpAfter replies to consecutive probes
// of its own (a probe lost in between starts over), however many intervals
// its Every skips.
func TestProberUnhealthyAndConsecutiveTiming(t *testing.T) {
	c := newFakeClock()
	p, err := New(Options{Port: 1, Now: c.now, Interval: 500 * time.Millisecond, DownAfter: 2 * time.Second, UpAfter: 3})
	if err != nil {
		t.Fatal(err)
	}
	p.SetTargets([]Target{{Name: "n", Addr: netip.MustParseAddrPort("10.0.0.2:51821"), Every: 2}})
	// n is probed every other interval, sick: Down 4 s after the first reply.
	var sickSince time.Time
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatal("a target answering only unhealthy replies never went down")
		}
		for _, o := range p.due(nil) {
			p.reply(o.seq, netip.Addr{}, false)
			if sickSince.IsZero() {
				sickSince = c.now()
			}
		}
		if p.expire() {
			break
		}
		if s := state(p, "n"); s != Unknown {
			t.Fatalf("%s %v after the first unhealthy reply, want unknown until 2 x 2 s", s, c.now().Sub(sickSince))
		}
		c.step(p.o.Interval)
	}
	if s, d := state(p, "n"), c.now().Sub(sickSince); s != Down || d != 4*time.Second {
		t.Errorf("%s %v after the first unhealthy reply, want down at 2 x 2 s", s, d)
	}
	// Healthy replies to two consecutive probes, one lost, then three: Up
	// at the third of those, six intervals later (Every 2).
	answer := []bool{true, true, false, true, true, true}
	for i, ok := range answer {
		var o outProbe
		for o.seq == 0 {
			if ps := p.due(nil); len(ps) > 0 {
				o = only(t, ps)
			}
			c.step(p.o.Interval)
		}
		if ok {
			p.reply(o.seq, netip.Addr{}, true)
		}
		if want := map[bool]State{true: Up, false: Down}[i == len(answer)-1]; state(p, "n") != want {
			t.Fatalf("after probe %d (answers %v): %s, want %s", i+1, answer[:i+1], state(p, "n"), want)
		}
	}
}
