// Package probe is meshd's data-plane liveness signal: a small UDP echo on
// the underlay. Every node answers probes on one UDP port and probes a set
// of targets (in meshd, a leader candidate probes the other candidates: of
// its own location at their internal IPs, of other locations at their
// WireGuard endpoint addresses).
//
// A reply also carries the responder's own health (Options.Healthy: can it
// forward at all). A target answering healthily is Up (at its first reply;
// back from Down, after UpAfter replies to consecutive probes). One that
// answered before, healthily or not, and has not answered healthily for
// DownAfter (times its Every) is Down: silent, or answering that it cannot
// forward, from the start or not. One that never answered at all is
// Unknown (behind a NAT, a firewall that drops the port, or not started
// yet) and tells nothing. The Prober only observes: what the states mean for
// leader election is decided elsewhere (meshd publishes them in its
// heartbeat Lease, see pkg/k8s/liveness). It imports nothing of meshd and
// nothing of Kubernetes.
//
// Wire format (16 bytes, both directions): "mshp", version 1, kind (1
// request, 2 reply healthy, 3 reply unhealthy), two zero bytes, a 64-bit
// big-endian sequence number echoed by the reply (every version echoes
// it). Replies are matched to probes by that number, not by their source
// address: a responder answers from whatever address its routing picks (a
// node probed at a secondary address or a VIP answers from another one). A
// reply to none of its target's last few probes (late, or to a probe of an
// earlier process: the numbers start at random) or a second reply to one is
// ignored. Probes are not authenticated: someone able to spoof underlay
// packets can make a dead node look alive (but can equally drop WireGuard
// traffic).
//
// Out of scope: which targets to probe and what their states mean for leader
// election (cmd/meshd and pkg/k8s/liveness decide), publishing the results
// (the heartbeat Lease, pkg/k8s/liveness) and any other route or rule (pkg/route).
package probe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"
)

// State is what a prober knows about a target.
type State int

const (
	// Unknown: the target never answered.
	Unknown State = iota
	// Up: the target answers, and can forward.
	Up
	// Down: the target answered before (able to forward or not), and has
	// not answered as able to forward for DownAfter.
	Down
)

func (s State) String() string {
	switch s {
	case Up:
		return "up"
	case Down:
		return "down"
	}
	return "unknown"
}

// Target is a node to probe.
type Target struct {
	Name string
	Addr netip.AddrPort
	// Every probes the target at every Every-th interval only (0 and 1:
	// every interval); it is Down after Every times DownAfter. For targets
	// whose loss matters less soon, at a fraction of the packets.
	Every int
}

// Defaults.
const (
	DefaultInterval  = 500 * time.Millisecond
	DefaultDownAfter = 2 * time.Second
	DefaultUpAfter   = 3
)

// Options configure a Prober.
type Options struct {
	// Port is the UDP port probes are answered on and sent from.
	Port int
	// Mark, when set, marks every probe packet (SO_MARK) and Run adds the
	// policy rule "fwmark Mark lookup main" at RulePriority (before meshd's
	// own rule): probes then take the underlay path even where the target's
	// address is routed into the mesh (a member of another location is
	// reachable through its leader too; a non-leader reaches other
	// locations through its own leader), so they test the node and the
	// underlay between the two, nothing else.
	Mark         uint32
	RulePriority int
	// Interval between two probes of a target (default 500 ms).
	Interval time.Duration
	// DownAfter is how long a target that answered before may go without
	// a healthy reply before it is Down (default 2 s): an Up target
	// silent or answering unhealthy, or one answering only unhealthy
	// replies since its first.
	DownAfter time.Duration
	// UpAfter is how many healthy replies, to consecutive probes of the
	// target, bring a Down target back Up (default 3): a probe without a
	// healthy reply starts the count over. A target seen for the first time
	// is Up at its first healthy reply.
	UpAfter int
	// Healthy reports whether this node can forward; nil means always.
	Healthy func() bool
	// OnChange is called (from the prober's goroutine) after a target's
	// state changed between Up and Down, or first became Up or Down.
	OnChange func()
	Logger   *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// ICMP makes the probes ICMP echo requests (IPv4) to the targets'
	// addresses (their ports are ignored), answered by the targets'
	// kernels, and this Prober answers nothing. With Mark 0 they follow the
	// routing of any traffic: sent to a node's mesh address in another
	// cluster, they test the WireGuard tunnel to it (a UDP probe could not:
	// its answer leaves the responder's marked socket by the underlay). It
	// needs CAP_NET_RAW.
	ICMP bool
}

// inFlight is how many of a target's latest probes a reply may answer:
// a reply to an older one is ignored, and at most inFlight probes per
// target are remembered.
const inFlight = 4

// sentProbe is a probe sent to a target.
type sentProbe struct {
	key uint64 // its sequence number as on the wire (16 bits for ICMP)
	n   uint64 // the target's probe count when sent (1, 2, ...); 0: none
}

// probeRef finds a sent probe by its key.
type probeRef struct {
	t *target
	n uint64
}

type target struct {
	name   string
	addr   netip.AddrPort
	state  State
	lastOK time.Time // last healthy reply
	// sickSince is, while Unknown, when the first (unhealthy) reply came.
	sickSince time.Time
	// streak counts the healthy replies to consecutive probes, up to the
	// last one answered.
	streak   int
	probes   uint64              // probes sent
	answered uint64              // the last probe answered (its count; 0: none)
	sent     [inFlight]sentProbe // the latest probes, at n % inFlight
	every    int                 // Target.Every, at least 1
	skip     int                 // intervals to skip before the next probe
}

// due reports whether t is probed at this interval (see Target.Every); it
// counts the interval.
func (t *target) due() bool {
	if t.skip > 0 {
		t.skip--
		return false
	}
	t.skip = t.every - 1
	return true
}

// downAfter is how long t may stay silent before it is Down.
func (p *Prober) downAfter(t *target) time.Duration {
	return p.o.DownAfter * time.Duration(t.every)
}

// Prober sends and answers probes. Create it with New, give it targets
// with SetTargets and run it with Run.
type Prober struct {
	o   Options
	log *slog.Logger

	mu      sync.Mutex
	targets map[string]*target // by name
	// bySeq finds the targets' latest probes (sent) by key, until they are
	// answered: at most inFlight entries per target.
	bySeq map[uint64]probeRef
	seq   uint64 // the last sequence number sent; starts at random
	wake  chan struct{}
}

// New returns a Prober; nothing happens until Run.
func New(o Options) (*Prober, error) {
	if o.Port < 1 || o.Port > 65535 {
		return nil, fmt.Errorf("probe port %d: want 1-65535", o.Port)
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.DownAfter <= 0 {
		o.DownAfter = DefaultDownAfter
	}
	if o.UpAfter <= 0 {
		o.UpAfter = DefaultUpAfter
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Mark != 0 && (o.RulePriority < 1 || o.RulePriority > 32765) {
		return nil, fmt.Errorf("probe rule priority %d: want 1-32765 (before the main table)", o.RulePriority)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	var seq [8]byte
	_, _ = rand.Read(seq[:])
	return &Prober{o: o, log: o.Logger, targets: map[string]*target{}, bySeq: map[uint64]probeRef{},
		seq: binary.BigEndian.Uint64(seq[:]), wake: make(chan struct{}, 1)}, nil
}

// SetTargets replaces the set of targets. A target whose name and address
// are unchanged keeps its state; a new or moved one starts Unknown. It
// reports whether the set changed.
func (p *Prober) SetTargets(ts []Target) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := make(map[string]*target, len(ts))
	changed := false
	for _, t := range ts {
		if !t.Addr.IsValid() || t.Name == "" {
			continue
		}
		t.Addr = netip.AddrPortFrom(t.Addr.Addr().Unmap(), t.Addr.Port())
		if p.o.ICMP {
			t.Addr = netip.AddrPortFrom(t.Addr.Addr(), 0)
		}
		every := max(t.Every, 1)
		if old, ok := p.targets[t.Name]; ok && old.addr == t.Addr {
			if old.every != every {
				old.every, old.skip, changed = every, 0, true
			}
			next[t.Name] = old
			continue
		}
		// Slow targets spread over the intervals.
		next[t.Name] = &target{name: t.Name, addr: t.Addr, every: every, skip: len(next) % every}
		changed = true
	}
	changed = changed || len(next) != len(p.targets)
	if !changed {
		return false
	}
	p.targets = next
	// Replies to the probes of targets gone (or moved) are ignored.
	p.bySeq = make(map[uint64]probeRef, inFlight*len(next))
	for _, t := range next {
		for _, s := range t.sent {
			if s.n > t.answered {
				p.bySeq[s.key] = probeRef{t, s.n}
			}
		}
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return true
}

// Results returns the targets that are Up or Down (Unknown ones are left
// out), by name.
func (p *Prober) Results() map[string]State {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]State, len(p.targets))
	for n, t := range p.targets {
		if t.state != Unknown {
			out[n] = t.state
		}
	}
	return out
}

// Split returns the names of the Up and of the Down targets, sorted.
func Split(results map[string]State) (up, down []string) {
	for _, n := range slices.Sorted(maps.Keys(results)) {
		switch results[n] {
		case Up:
			up = append(up, n)
		case Down:
			down = append(down, n)
		}
	}
	return up, down
}

const (
	wireLen     = 16
	wireVersion = 1
	kindRequest = 1
	kindHealthy = 2
	kindSick    = 3
)

var magic = [4]byte{'m', 's', 'h', 'p'}

func encode(kind byte, seq uint64) []byte {
	b := make([]byte, wireLen)
	copy(b, magic[:])
	b[4] = wireVersion
	b[5] = kind
	binary.BigEndian.PutUint64(b[8:], seq)
	return b
}

func decode(b []byte) (kind byte, seq uint64, ok bool) {
	if len(b) < wireLen || [4]byte(b[:4]) != magic || b[4] != wireVersion {
		return 0, 0, false
	}
	return b[5], binary.BigEndian.Uint64(b[8:]), true
}

// Run answers and sends probes until ctx ends. It fails only if the port
// cannot be bound.
func (p *Prober) Run(ctx context.Context) error {
	if p.o.ICMP {
		return p.runICMP(ctx)
	}
	lc := net.ListenConfig{}
	if mark := p.o.Mark; mark != 0 {
		if err := ensureBypass(mark, p.o.RulePriority); err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, int(mark))
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("marking the probe socket: %w", serr)
			}
			return nil
		}
	}
	pc, err := lc.ListenPacket(context.Background(), "udp", fmt.Sprintf(":%d", p.o.Port))
	if err != nil {
		return fmt.Errorf("probe: listening on UDP port %d: %w", p.o.Port, err)
	}
	conn := pc.(*net.UDPConn)
	defer conn.Close()
	p.log.Info("answering and sending data-plane probes", "port", p.o.Port, "mark", fmt.Sprintf("%#x", p.o.Mark), "interval", p.o.Interval, "down-after", p.o.DownAfter)
	return p.loop(ctx, conn, func() { p.receive(ctx, conn) }, func() { p.send(conn) })
}

// loop runs receive in its own goroutine and sends every interval (or when
// the targets change) until ctx ends, then closes conn. Without targets it
// waits for some, waking nothing meanwhile (a node that is no leader
// candidate probes nothing).
func (p *Prober) loop(ctx context.Context, conn net.PacketConn, receive, send func()) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); receive() }()
	t := time.NewTicker(p.o.Interval)
	defer t.Stop()
	for {
		send()
		if p.expire() {
			p.changed()
		}
		var tick <-chan time.Time // nil: no targets, no tick
		if p.hasTargets() {
			tick = t.C
		}
		select {
		case <-ctx.Done():
			conn.Close()
			wg.Wait()
			return nil
		case <-tick:
		case <-p.wake:
		}
	}
}

func (p *Prober) hasTargets() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.targets) > 0
}

func (p *Prober) changed() {
	if p.o.OnChange != nil {
		p.o.OnChange()
	}
}

// outProbe is a probe to send.
type outProbe struct {
	addr netip.AddrPort
	seq  uint64
}

// due counts an interval for the targets that take part (all when ok is
// nil) and returns the probes due in it, recorded as sent.
func (p *Prober) due(ok func(*target) bool) []outProbe {
	p.mu.Lock()
	defer p.mu.Unlock()
	batch := make([]outProbe, 0, len(p.targets))
	for _, t := range p.targets {
		if ok != nil && !ok(t) || !t.due() {
			continue
		}
		batch = append(batch, outProbe{t.addr, p.record(t)})
	}
	return batch
}

// record numbers the next probe of t and remembers it in place of t's
// oldest one; it returns its sequence number (p.mu held).
func (p *Prober) record(t *target) uint64 {
	p.seq++
	key := p.key(p.seq)
	t.probes++
	s := &t.sent[t.probes%inFlight]
	if r, ok := p.bySeq[s.key]; s.n != 0 && ok && r.t == t && r.n == s.n {
		delete(p.bySeq, s.key) // too old to be answered
	}
	*s = sentProbe{key: key, n: t.probes}
	p.bySeq[key] = probeRef{t, t.probes}
	return p.seq
}

// key is the part of a sequence number a reply echoes: all of it, but 16
// bits in an ICMP echo.
func (p *Prober) key(seq uint64) uint64 {
	if p.o.ICMP {
		return seq & 0xffff
	}
	return seq
}

func (p *Prober) send(conn *net.UDPConn) {
	for _, o := range p.due(nil) {
		if _, err := conn.WriteToUDPAddrPort(encode(kindRequest, o.seq), o.addr); err != nil {
			p.log.Debug("sending a probe", "to", o.addr, "error", err)
		}
	}
}

// expire turns Down the Up targets without a healthy reply for DownAfter,
// and the Unknown ones answering only unhealthy replies for as long; it
// reports changes.
func (p *Prober) expire() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.o.Now()
	changed := false
	for _, t := range p.targets {
		switch {
		case t.state == Up && now.Sub(t.lastOK) >= p.downAfter(t):
			t.state = Down
			t.streak = 0
			changed = true
			p.log.Info("probe target stopped answering", "node", t.name, "addr", t.addr, "silent", now.Sub(t.lastOK).Round(time.Millisecond))
		case t.state == Unknown && !t.sickSince.IsZero() && now.Sub(t.sickSince) >= p.downAfter(t):
			t.state = Down
			t.streak = 0
			changed = true
			p.log.Info("probe target answers but cannot forward", "node", t.name, "addr", t.addr, "since", now.Sub(t.sickSince).Round(time.Millisecond))
		}
	}
	return changed
}

// receive answers and reads probes until conn is closed (loop closes it
// when ctx ends): it blocks in the read meanwhile, waking for packets only.
func (p *Prober) receive(ctx context.Context, conn *net.UDPConn) {
	buf := make([]byte, 64)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			continue
		}
		kind, seq, ok := decode(buf[:n])
		if !ok {
			continue
		}
		switch kind {
		case kindRequest:
			reply := byte(kindHealthy)
			if p.o.Healthy != nil && !p.o.Healthy() {
				reply = kindSick
			}
			_, _ = conn.WriteToUDPAddrPort(encode(reply, seq), from)
		case kindHealthy, kindSick:
			// Matched by seq alone: the reply's source address may not be
			// the one probed (see the package doc).
			if p.reply(seq, netip.Addr{}, kind == kindHealthy) {
				p.changed()
			}
		}
	}
}

// reply records an answer echoing seq (its key, see Prober.key); from,
// when valid, must be the probed address. It reports a state change.
// Answers to no recent probe of a target, or to one already answered (or
// older), are ignored.
func (p *Prober) reply(seq uint64, from netip.Addr, healthy bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := p.key(seq)
	r, ok := p.bySeq[key]
	if !ok {
		return false
	}
	t := r.t
	if from.IsValid() && from.Unmap() != t.addr.Addr() {
		return false
	}
	delete(p.bySeq, key)
	if r.n <= t.answered {
		return false // overtaken by the answer to a later probe
	}
	next := r.n == t.answered+1
	t.answered = r.n
	now := p.o.Now()
	if !healthy {
		t.streak = 0
		if t.state == Unknown && t.sickSince.IsZero() {
			t.sickSince = now
		}
		return false
	}
	t.lastOK = now
	if next {
		t.streak++
	} else {
		t.streak = 1 // a probe in between went unanswered
	}
	switch {
	case t.state == Unknown:
		t.state = Up
		return true
	case t.state == Down && t.streak >= p.o.UpAfter:
		t.state = Up
		p.log.Info("probe target answers again", "node", t.name, "addr", t.addr)
		return true
	}
	return false
}
