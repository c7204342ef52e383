package wg

import (
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/wg/internal/initiation"
)

// Lazy peers (Options.LazyPeers, in-process devices only).
//
// wireguard-go keeps about 45 KB per peer whether it carries traffic or not
// (two goroutines, their queues, timers, handshake state): 45 MB for a node
// of a 1,000-node full mesh, most of whose peers it never talks to. With
// lazy peers the device holds only the peers that carry traffic; the others
// are kept here, as configured, and put into the device on their first
// packet:
//
//   - a packet read from the TUN device for one of their allowed IPs (the
//     device then stages it and starts a handshake, as for any new peer);
//   - a handshake initiation from them, identified and authenticated with
//     the device's private key (package initiation) before the device
//     reads it, so that the device answers it. wireguard-go refuses an
//     initiation whose timestamp is not after the last one it took from
//     the peer, but forgets that timestamp when the peer leaves the device:
//     so inbound keeps the last timestamp of every configured peer's
//     initiations itself and puts a peer in only for a later one (a
//     replayed initiation would otherwise move an idle peer's endpoint to
//     whoever replays it).
//
// A peer in the device that had no byte received or sent and no handshake
// for lazyIdleAfter (5 min) is taken out again by trimIdle, which
// Manager.Run calls every lazyTrimEvery: by then its session keys have
// expired (after 180 s) and the next packet either way starts a fresh
// handshake. A peer with a persistent keepalive is never lazy: the
// keepalive is there to hold a NAT mapping open (trimIdle puts back one
// missing from the device).
//
// With a threshold (Options.LazyPeersAbove, newLazyPeers' above) the layer
// is lazy only while more peers than that are configured. Up to it, it is
// eager: every configured peer is in the device, each write is forwarded as
// it comes (a created peer's first handshake is nudged as without the
// layer), a device read reports the device as it is (a peer removed by
// hand is missing, and the next Set puts it back), and neither the trim nor
// the initiation check runs. Crossing the threshold upwards changes nothing
// at once: the peers then idle leave the device at the next trims.
// Crossing it downwards puts every idle peer back in the write that did.
//
// The rest of the package does not see the difference: lazyPeers is the
// Device's Client, whose Device read lists every configured peer (the ones
// out of the device with what was configured for them, no handshake and no
// bytes) and whose ConfigureDevice records every peer and forwards only what
// concerns the ones in the device. wg(8) on the UAPI socket sees the device
// itself: only the active peers.
//
// The packet paths take no lock: they read an immutable lazyView, which
// every change publishes whole, and wait for an activation at most
// lazyActivateWait per batch. Everything else holds mu, also across its
// calls to the device, so that what it reads and writes is never stale.
const (
	lazyIdleAfter = 5 * time.Minute
	lazyTrimEvery = 30 * time.Second
	// lazyActivateWait bounds how long a packet reader (the TUN reader or
	// a UDP receiver) waits, per batch, for peers to be put into the
	// device. Past it the batch goes on without (a packet for a peer still
	// out is dropped by the device, as any packet to or from an unknown
	// peer; the sender retries): the bound keeps a device reconfiguration
	// that waits for the readers (a listen port change closes the socket
	// and waits for its receivers) from waiting on an activation that
	// waits on it.
	lazyActivateWait = 250 * time.Millisecond
	// lazyChecksPerSecond bounds the handshake initiations whose sender
	// inbound identifies (two X25519 operations each, about 0.1 ms), with
	// a burst of lazyChecksBurst: initiations with a valid MAC1 cost
	// nothing to forge for whoever knows the node's public key, and the
	// check runs on the receive path. Past the bound an initiation goes to
	// the device unchecked; if its peer is out of the device it is dropped
	// and the peer tries again 5 s later, as after any lost packet.
	lazyChecksPerSecond = 200
	lazyChecksBurst     = 400
	// lazyClockSkew is how far ahead of this node's clock a peer's may be
	// for trimIdle's timestamp floor to refuse its old initiations (at most
	// half of idleAfter: the floor stays in the past).
	lazyClockSkew = 2 * time.Minute
)

// lazyPeer is one configured peer and whether it is in the device.
type lazyPeer struct {
	psk       *wgtypes.Key
	endpoint  *net.UDPAddr
	keepalive time.Duration
	allowed   []net.IPNet

	active bool
	// While active: the counters and handshake last seen by trim, and
	// when they last changed (or the peer was put in).
	rx, tx int64
	hs     time.Time
	seen   time.Time
}

// lazyPeers is the lazy-peer layer of an in-process device (see above).
type lazyPeers struct {
	name      string
	log       *slog.Logger
	idleAfter time.Duration
	now       func() time.Time

	inner  Client // the device itself (wgctrl over its UAPI socket)
	reader atomic.Pointer[initiation.Reader]
	view   atomic.Pointer[lazyView] // what the packet paths read

	mu    sync.Mutex
	peers map[wgtypes.Key]*lazyPeer
	priv  wgtypes.Key
	// above is the threshold (0: none, always lazy); eager whether at
	// most above peers are configured now.
	above int
	eager bool

	// The last initiation timestamp seen from each configured peer (see
	// inbound); tsMu is only ever held for a map access.
	tsMu   sync.Mutex
	lastTS map[wgtypes.Key]initiation.Timestamp

	activations, trims, replays atomic.Uint64
	checks                      *rate.Limiter // of inbound's sender checks

	reqs     chan lazyRequest
	stop     chan struct{}
	stopOnce sync.Once
}

// lazyView is the packet paths' copy of the peers: immutable once
// published.
type lazyView struct {
	owner map[netip.Prefix]wgtypes.Key // allowed IP → peer, all peers
	lens  [2][]int                     // prefix lengths in owner, longest first: IPv4, IPv6
	idle  map[wgtypes.Key]bool         // every configured peer: whether it is out of the device
	nIdle int
	eager bool // lazyPeers.eager: every peer is in the device, inbound checks nothing
}

type lazyRequest struct {
	key  wgtypes.Key
	done chan struct{}
}

// newLazyPeers returns the layer for device name; with above > 0 it is lazy
// only while more than above peers are configured.
func newLazyPeers(name string, log *slog.Logger, above int) *lazyPeers {
	l := &lazyPeers{
		name: name, log: log, idleAfter: lazyIdleAfter, now: time.Now, above: max(above, 0), eager: above > 0,
		peers: map[wgtypes.Key]*lazyPeer{}, lastTS: map[wgtypes.Key]initiation.Timestamp{},
		reqs: make(chan lazyRequest), stop: make(chan struct{}),
		checks: rate.NewLimiter(lazyChecksPerSecond, lazyChecksBurst),
	}
	l.reader.Store(initiation.NewReader(wgtypes.Key{}))
	l.publish(true)
	return l
}

// start runs the activation worker over the device's client c until close.
func (l *lazyPeers) start(c Client) {
	l.inner = c
	go func() {
		for {
			select {
			case <-l.stop:
				return
			case r := <-l.reqs:
				l.activate(r.key)
				close(r.done)
			}
		}
	}()
}

func (l *lazyPeers) close() { l.stopOnce.Do(func() { close(l.stop) }) }

// Device reads the device and adds the peers kept out of it.
func (l *lazyPeers) Device(name string) (*wgtypes.Device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur, err := l.inner.Device(name)
	if err != nil {
		return nil, err
	}
	if cur.PrivateKey != l.priv {
		l.setKey(cur.PrivateKey)
	}
	if l.syncPresent(cur.Peers) {
		l.publish(false)
	}
	if l.eager {
		return cur, nil // every peer belongs in the device: a missing one is drift
	}
	for _, k := range slices.SortedFunc(func(yield func(wgtypes.Key) bool) {
		for k, p := range l.peers {
			if !p.active && !yield(k) {
				return
			}
		}
	}, compareKeys) {
		cur.Peers = append(cur.Peers, l.peers[k].view(k))
	}
	return cur, nil
}

// syncPresent marks active exactly the configured peers the device has
// (it loses them all when it is replaced; wg(8) can add or remove one),
// and reports whether that changed anything.
func (l *lazyPeers) syncPresent(in []wgtypes.Peer) bool {
	present := make(map[wgtypes.Key]bool, len(in))
	for i := range in {
		present[in[i].PublicKey] = true
	}
	now := l.now()
	changed := false
	for k, p := range l.peers {
		if present[k] != p.active {
			l.setActive(p, present[k], now)
			changed = true
		}
	}
	return changed
}

func (l *lazyPeers) setActive(p *lazyPeer, on bool, now time.Time) {
	p.active = on
	if on {
		p.rx, p.tx, p.hs, p.seen = 0, 0, time.Time{}, now
	}
}

// publish makes the packet paths see the peers as they are now; with
// routes false, the allowed IPs are those of the last publish.
func (l *lazyPeers) publish(routes bool) {
	v := &lazyView{idle: make(map[wgtypes.Key]bool, len(l.peers)), eager: l.eager}
	for k, p := range l.peers {
		v.idle[k] = !p.active
		if !p.active {
			v.nIdle++
		}
	}
	if old := l.view.Load(); old != nil && !routes {
		v.owner, v.lens = old.owner, old.lens
		l.view.Store(v)
		return
	}
	v.owner = map[netip.Prefix]wgtypes.Key{}
	for k, p := range l.peers {
		for _, n := range p.allowed {
			pfx, ok := ipNetToPrefix(n)
			if !ok {
				continue
			}
			v.owner[pfx.Masked()] = k
			f := family(pfx.Addr())
			if !slices.Contains(v.lens[f], pfx.Bits()) {
				v.lens[f] = append(v.lens[f], pfx.Bits())
			}
		}
	}
	for f := range v.lens {
		slices.SortFunc(v.lens[f], func(a, b int) int { return b - a })
	}
	l.view.Store(v)
}

func (l *lazyPeers) setKey(k wgtypes.Key) {
	l.priv = k
	l.reader.Store(initiation.NewReader(k))
}

// ConfigureDevice records cfg's peers and forwards to the device the device
// fields and what concerns the peers in it, plus a whole configuration for
// the peers that must be in it (a persistent keepalive). A removed peer
// that was in the device is removed from it; a peer re-created in the same
// call (removed and added, as a handshake retry does) stays where it was.
func (l *lazyPeers) ConfigureDevice(name string, cfg wgtypes.Config) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setEager(l.countAfter(cfg))
	out, joined := l.record(cfg)
	defer l.publish(true)
	var err error
	if out.PrivateKey != nil || out.ListenPort != nil || out.FirewallMark != nil || out.ReplacePeers || len(out.Peers) > 0 {
		err = l.inner.ConfigureDevice(name, out)
	}
	if cfg.PrivateKey != nil && err == nil {
		l.setKey(*cfg.PrivateKey)
	}
	if err == nil {
		now := l.now()
		for _, p := range joined {
			l.setActive(p, true, now)
		}
	}
	// On an error part of it may be applied: the next read tells.
	return err
}

// countAfter is how many peers are configured once cfg is applied.
func (l *lazyPeers) countAfter(cfg wgtypes.Config) int {
	n := len(l.peers)
	if cfg.ReplacePeers {
		n = 0
	}
	present := map[wgtypes.Key]bool{} // the peers cfg names, as it goes
	for _, pc := range cfg.Peers {
		in, ok := present[pc.PublicKey]
		if !ok {
			in = !cfg.ReplacePeers && l.peers[pc.PublicKey] != nil
		}
		switch {
		case pc.Remove:
			if in {
				n--
			}
			in = false
		case pc.UpdateOnly: // creates nothing (and is not recorded when new)
		case !in:
			n++
			in = true
		}
		present[pc.PublicKey] = in
	}
	return n
}

// setEager makes the layer eager or lazy for n configured peers (see
// above), and logs a change.
func (l *lazyPeers) setEager(n int) {
	eager := l.above > 0 && n <= l.above
	if eager == l.eager {
		return
	}
	l.eager = eager
	if eager {
		l.log.Info("lazy WireGuard peers off: every peer is in the device", "peers", n, "lazyAbove", l.above)
	} else {
		l.log.Info("lazy WireGuard peers on: a peer without traffic for 5 minutes leaves the device", "peers", n, "lazyAbove", l.above)
	}
}

// record applies cfg to the recorded peers and returns what to forward to
// the device, and the idle peers that forwarding puts into it. When eager,
// a new peer is active from the start (its entries are forwarded as they
// are), an idle one touched is put in whole at its first entry, and so is
// every other idle one.
func (l *lazyPeers) record(cfg wgtypes.Config) (wgtypes.Config, []*lazyPeer) {
	out := wgtypes.Config{PrivateKey: cfg.PrivateKey, ListenPort: cfg.ListenPort, FirewallMark: cfg.FirewallMark, ReplacePeers: cfg.ReplacePeers}
	if cfg.ReplacePeers {
		clear(l.peers)
	}
	var idleTouched []wgtypes.Key
	var removedActive map[wgtypes.Key]bool
	for _, pc := range cfg.Peers {
		p := l.peers[pc.PublicKey]
		switch {
		case pc.Remove:
			if p == nil || p.active {
				out.Peers = append(out.Peers, pc) // in the device, or not ours
				if p != nil {
					if removedActive == nil {
						removedActive = map[wgtypes.Key]bool{}
					}
					removedActive[pc.PublicKey] = true
				}
			}
			delete(l.peers, pc.PublicKey)
			continue
		case p == nil && pc.UpdateOnly:
			out.Peers = append(out.Peers, pc) // not ours: the device decides
			continue
		case p == nil && removedActive[pc.PublicKey]:
			p = &lazyPeer{active: true, seen: l.now()} // re-created: back into the device
			l.peers[pc.PublicKey] = p
		case p == nil:
			p = &lazyPeer{active: l.eager, seen: l.now()}
			l.peers[pc.PublicKey] = p
		}
		p.apply(pc)
		switch {
		case p.active:
			out.Peers = append(out.Peers, pc)
		case l.eager:
			out.Peers = append(out.Peers, p.config(pc.PublicKey))
			l.setActive(p, true, l.now())
		default:
			idleTouched = append(idleTouched, pc.PublicKey)
		}
	}
	if l.eager {
		out.Peers = append(out.Peers, l.putBackIdle()...)
	}
	var joined []*lazyPeer
	seen := map[*lazyPeer]bool{}
	for _, k := range idleTouched {
		p := l.peers[k]
		if p == nil || p.active || p.keepalive <= 0 || seen[p] {
			continue
		}
		seen[p] = true
		out.Peers = append(out.Peers, p.config(k))
		joined = append(joined, p)
	}
	return out, joined
}

// putBackIdle marks active the peers still out of the device (idle when the
// layer turned eager) and returns their whole configurations, sorted.
func (l *lazyPeers) putBackIdle() []wgtypes.PeerConfig {
	var back []wgtypes.Key
	for k, p := range l.peers {
		if !p.active {
			back = append(back, k)
		}
	}
	slices.SortFunc(back, compareKeys)
	out := make([]wgtypes.PeerConfig, 0, len(back))
	for _, k := range back {
		out = append(out, l.peers[k].config(k))
		l.setActive(l.peers[k], true, l.now())
	}
	return out
}

// apply records one PeerConfig, with wgctrl's semantics.
func (p *lazyPeer) apply(pc wgtypes.PeerConfig) {
	if pc.PresharedKey != nil {
		k := *pc.PresharedKey
		p.psk = &k
	}
	if pc.Endpoint != nil {
		ep := *pc.Endpoint
		p.endpoint = &ep
	}
	if pc.PersistentKeepaliveInterval != nil {
		p.keepalive = *pc.PersistentKeepaliveInterval
	}
	if pc.ReplaceAllowedIPs {
		p.allowed = nil
	}
	p.allowed = append(p.allowed, pc.AllowedIPs...)
}

// config is the whole configuration that puts p into the device.
func (p *lazyPeer) config(k wgtypes.Key) wgtypes.PeerConfig {
	ka := p.keepalive
	pc := wgtypes.PeerConfig{PublicKey: k, PersistentKeepaliveInterval: &ka, ReplaceAllowedIPs: true, AllowedIPs: slices.Clone(p.allowed)}
	if p.psk != nil {
		psk := *p.psk
		pc.PresharedKey = &psk
	}
	if p.endpoint != nil {
		ep := *p.endpoint
		pc.Endpoint = &ep
	}
	return pc
}

// view is p as a device read reports a peer out of the device.
func (p *lazyPeer) view(k wgtypes.Key) wgtypes.Peer {
	v := wgtypes.Peer{PublicKey: k, PersistentKeepaliveInterval: p.keepalive, AllowedIPs: slices.Clone(p.allowed), ProtocolVersion: 1}
	if p.psk != nil {
		v.PresharedKey = *p.psk
	}
	if p.endpoint != nil {
		ep := *p.endpoint
		v.Endpoint = &ep
	}
	return v
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// idleOwner returns the peer out of the device whose allowed IPs route dst
// (longest prefix first), if any.
func (v *lazyView) idleOwner(dst netip.Addr) (wgtypes.Key, bool) {
	f := family(dst)
	for _, bits := range v.lens[f] {
		pfx, err := dst.Prefix(bits)
		if err != nil {
			continue
		}
		if k, ok := v.owner[pfx]; ok {
			return k, v.idle[k]
		}
	}
	return wgtypes.Key{}, false
}

// isIdle reports whether k is a configured peer out of the device.
func (l *lazyPeers) isIdle(k wgtypes.Key) bool { return l.view.Load().idle[k] }

// outbound is called with each batch read from the TUN device, before the
// device routes it: it puts in the peers out of the device the packets are
// for.
func (l *lazyPeers) outbound(bufs [][]byte, sizes []int, offset int) {
	var deadline time.Time
	for i := range sizes {
		v := l.view.Load()
		if v.nIdle == 0 {
			return
		}
		if sizes[i] < 1 || offset+sizes[i] > len(bufs[i]) {
			continue
		}
		dst, ok := packetDst(bufs[i][offset : offset+sizes[i]])
		if !ok {
			continue
		}
		if k, ok := v.idleOwner(dst); ok && !l.request(k, &deadline) {
			return // waited long enough for this batch
		}
	}
}

// packetDst is the destination address of an IP packet.
func packetDst(pkt []byte) (netip.Addr, bool) {
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return netip.Addr{}, false
		}
		return netip.AddrFrom4([4]byte(pkt[16:20])), true
	case 6:
		if len(pkt) < 40 {
			return netip.Addr{}, false
		}
		return netip.AddrFrom16([16]byte(pkt[24:40])), true
	}
	return netip.Addr{}, false
}

// inbound is called with each batch of datagrams received on the UDP
// socket, before the device reads them: it puts in the peers out of the
// device whose handshake initiations are among them.
//
// It reads every initiation, also from peers in the device, to keep the
// last timestamp of each: a peer taken out of the device and put back by
// a replay of an initiation it had sent while in would otherwise be
// accepted by the device, which forgot it.
func (l *lazyPeers) inbound(bufs [][]byte, sizes []int) {
	if l.view.Load().eager {
		return
	}
	var deadline time.Time
	gaveUp := false
	for i := range sizes {
		if sizes[i] > len(bufs[i]) || !initiation.IsInitiation(bufs[i][:sizes[i]]) {
			continue
		}
		r := l.reader.Load()
		if !r.ValidMAC1(bufs[i][:sizes[i]]) || !l.checks.Allow() {
			continue
		}
		k, ts, ok := r.SenderAt(bufs[i][:sizes[i]])
		if !ok {
			continue
		}
		idle, known := l.view.Load().idle[k]
		if !known || !l.newer(k, ts) {
			continue
		}
		if idle && !gaveUp && !l.request(k, &deadline) {
			gaveUp = true // waited long enough for this batch; go on recording
		}
	}
}

// newer records ts as the last initiation timestamp of peer k if it is
// after the last one, and reports whether it was.
func (l *lazyPeers) newer(k wgtypes.Key, ts initiation.Timestamp) bool {
	l.tsMu.Lock()
	defer l.tsMu.Unlock()
	if last, ok := l.lastTS[k]; ok && !ts.After(last) {
		l.replays.Add(1)
		return false
	}
	l.lastTS[k] = ts
	return true
}

// request asks the worker to put peer k into the device and waits for it
// until *deadline, which the first request of a batch sets to
// lazyActivateWait from now. It reports false when it gave up waiting.
func (l *lazyPeers) request(k wgtypes.Key, deadline *time.Time) bool {
	if deadline.IsZero() {
		*deadline = time.Now().Add(lazyActivateWait)
	}
	t := time.NewTimer(time.Until(*deadline))
	defer t.Stop()
	r := lazyRequest{key: k, done: make(chan struct{})}
	select {
	case l.reqs <- r:
	case <-t.C:
		l.log.Debug("putting an idle WireGuard peer into the device: busy", "peer", k.String())
		return false
	case <-l.stop:
		return false
	}
	select {
	case <-r.done:
		return true
	case <-t.C:
		l.log.Debug("putting an idle WireGuard peer into the device: still waiting", "peer", k.String())
		return false
	case <-l.stop:
		return false
	}
}

// activate puts peer k into the device, if it is still out of it.
func (l *lazyPeers) activate(k wgtypes.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.peers[k]
	if p == nil || p.active {
		return
	}
	if err := l.inner.ConfigureDevice(l.name, wgtypes.Config{Peers: []wgtypes.PeerConfig{p.config(k)}}); err != nil {
		l.log.Warn("putting an idle WireGuard peer into the device", "peer", k.String(), "err", err)
		return
	}
	l.setActive(p, true, l.now())
	l.publish(false)
	l.activations.Add(1)
	l.log.Debug("WireGuard peer put into the device on traffic", "peer", k.String())
}

// trimIdle takes out of the device the peers that carried no traffic and
// made no handshake for idleAfter, keeping the endpoint the device learned
// for them, and puts back those with a persistent keepalive that are
// missing (taken out by hand, or their forwarding failed).
//
// A peer taken out also gets a floor under the initiation timestamps it
// will be put back for: inbound may not have seen every initiation the
// device took from it (past its rate limit, say while someone floods the
// node with initiations), and one of those replayed must not put it back.
// The device took none for idleAfter (an initiation counts as received
// bytes), so the floor, idleAfter minus lazyClockSkew ago, is below any
// initiation the peer makes from now on unless its clock is more than
// idleAfter - lazyClockSkew behind this node's.
func (l *lazyPeers) trimIdle() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneTimestamps()
	if l.eager {
		return nil // every peer stays in; a missing one is the next Set's
	}
	cur, err := l.inner.Device(l.name)
	if err != nil {
		return err
	}
	if l.syncPresent(cur.Peers) {
		l.publish(false)
	}
	now := l.now()
	gone := l.idleFor(cur.Peers, now)
	var out []wgtypes.PeerConfig
	for _, g := range gone {
		out = append(out, wgtypes.PeerConfig{PublicKey: g.key, Remove: true})
	}
	var back []*lazyPeer
	for k, p := range l.peers {
		if !p.active && p.keepalive > 0 {
			out = append(out, p.config(k))
			back = append(back, p)
		}
	}
	if len(out) == 0 {
		return nil
	}
	if err := l.inner.ConfigureDevice(l.name, wgtypes.Config{Peers: out}); err != nil {
		return err
	}
	floor := initiation.TimestampAt(now.Add(-l.idleAfter + min(lazyClockSkew, l.idleAfter/2)))
	for _, g := range gone {
		if g.endpoint != nil {
			ep := *g.endpoint
			g.p.endpoint = &ep // learned by roaming: where to start next time
		}
		l.setActive(g.p, false, now)
		l.raiseTimestamp(g.key, floor)
	}
	for _, p := range back {
		l.setActive(p, true, now)
	}
	l.publish(false)
	l.trims.Add(uint64(len(gone)))
	l.log.Debug("idle WireGuard peers taken out of the device", "peers", len(gone), "keepalivePeersPutBack", len(back))
	return nil
}

// trimmed is a peer trimIdle takes out, with the endpoint the device has
// for it.
type trimmed struct {
	key      wgtypes.Key
	p        *lazyPeer
	endpoint *net.UDPAddr
}

// idleFor returns the peers in the device (as read: in) without traffic or
// handshake for idleAfter, and notes the traffic of the others.
func (l *lazyPeers) idleFor(in []wgtypes.Peer, now time.Time) []trimmed {
	var gone []trimmed
	for i := range in {
		c := &in[i]
		p := l.peers[c.PublicKey]
		if p == nil || !p.active {
			continue
		}
		if c.ReceiveBytes != p.rx || c.TransmitBytes != p.tx || !c.LastHandshakeTime.Equal(p.hs) {
			p.rx, p.tx, p.hs, p.seen = c.ReceiveBytes, c.TransmitBytes, c.LastHandshakeTime, now
			continue
		}
		if p.keepalive > 0 || now.Sub(p.seen) < l.idleAfter {
			continue
		}
		gone = append(gone, trimmed{key: c.PublicKey, p: p, endpoint: c.Endpoint})
	}
	return gone
}

// raiseTimestamp makes ts the last initiation timestamp of peer k if it is
// later than the one recorded.
func (l *lazyPeers) raiseTimestamp(k wgtypes.Key, ts initiation.Timestamp) {
	l.tsMu.Lock()
	defer l.tsMu.Unlock()
	if last, ok := l.lastTS[k]; !ok || ts.After(last) {
		l.lastTS[k] = ts
	}
}

// pruneTimestamps forgets the initiation timestamps of peers no longer
// configured.
func (l *lazyPeers) pruneTimestamps() {
	l.tsMu.Lock()
	defer l.tsMu.Unlock()
	for k := range l.lastTS {
		if l.peers[k] == nil {
			delete(l.lastTS, k)
		}
	}
}

// LazyStats is what the lazy-peer layer of a device reports.
type LazyStats struct {
	Idle        int    // peers kept out of the device now
	Activations uint64 // peers put into the device on traffic, so far
	Trims       uint64 // peers taken out after lazyIdleAfter without traffic, so far
	Replays     uint64 // initiations refused as no later than the peer's last, so far
}

func (l *lazyPeers) stats() LazyStats {
	return LazyStats{Idle: l.view.Load().nIdle, Activations: l.activations.Load(), Trims: l.trims.Load(), Replays: l.replays.Load()}
}
