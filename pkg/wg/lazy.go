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
//   - a handshake initiation from them, identified by decrypting its static
//     key with the device's private key (package initiation) before the
//     device reads it, so that the device answers it.
//
// A peer out of the device for lazyIdleAfter (5 min) with no byte received
// or sent and no handshake is taken out again by trimIdle, which Manager.Run
// calls every lazyTrimEvery: by then its session keys have expired (after
// 180 s) and the next packet either way starts a fresh handshake. A peer
// with a persistent keepalive is never lazy: the keepalive is there to
// hold a NAT mapping open.
//
// The rest of the package does not see the difference: lazyPeers is the
// Device's Client, whose Device read lists every configured peer (the ones
// out of the device with what was configured for them, no handshake and no
// bytes) and whose ConfigureDevice records every peer and forwards only what
// concerns the ones in the device. wg(8) on the UAPI socket sees the device
// itself: only the active peers.
const (
	lazyIdleAfter = 5 * time.Minute
	lazyTrimEvery = 30 * time.Second
	// lazyActivateWait bounds how long a packet's reader (the TUN reader
	// or a UDP receiver) waits for its peer to be put into the device.
	// Past it the packet goes on without (dropped by the device, as any
	// packet to or from an unknown peer; the sender retries): the bound
	// keeps a device reconfiguration that waits for the readers (a listen
	// port change closes the socket and waits for its receivers) from
	// waiting on an activation that waits on it.
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
	idle   atomic.Int64 // peers out of the device

	mu    sync.RWMutex
	peers map[wgtypes.Key]*lazyPeer
	owner map[netip.Prefix]wgtypes.Key // allowed IP → peer, all peers
	lens  [2][]int                     // prefix lengths in owner, longest first: IPv4, IPv6
	priv  wgtypes.Key

	activations, trims atomic.Uint64
	checks             *rate.Limiter // of inbound's sender checks

	reqs     chan lazyRequest
	stop     chan struct{}
	stopOnce sync.Once
}

type lazyRequest struct {
	key  wgtypes.Key
	done chan struct{}
}

func newLazyPeers(name string, log *slog.Logger) *lazyPeers {
	l := &lazyPeers{
		name: name, log: log, idleAfter: lazyIdleAfter, now: time.Now,
		peers: map[wgtypes.Key]*lazyPeer{}, owner: map[netip.Prefix]wgtypes.Key{},
		reqs: make(chan lazyRequest), stop: make(chan struct{}),
		checks: rate.NewLimiter(lazyChecksPerSecond, lazyChecksBurst),
	}
	l.reader.Store(initiation.NewReader(wgtypes.Key{}))
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
	cur, err := l.inner.Device(name)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur.PrivateKey != l.priv {
		l.setKey(cur.PrivateKey)
	}
	l.syncPresent(cur.Peers)
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
// (it loses them all when it is replaced; wg(8) can add or remove one).
func (l *lazyPeers) syncPresent(in []wgtypes.Peer) {
	present := make(map[wgtypes.Key]bool, len(in))
	for i := range in {
		present[in[i].PublicKey] = true
	}
	now := l.now()
	for k, p := range l.peers {
		if present[k] != p.active {
			l.setActive(p, present[k], now)
		}
	}
}

func (l *lazyPeers) setActive(p *lazyPeer, on bool, now time.Time) {
	if p.active == on {
		return
	}
	p.active = on
	if on {
		l.idle.Add(-1)
		p.rx, p.tx, p.hs, p.seen = 0, 0, time.Time{}, now
	} else {
		l.idle.Add(1)
	}
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
	out, joined := l.record(cfg)
	l.index()
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

// record applies cfg to the recorded peers and returns what to forward to
// the device, and the idle peers that forwarding puts into it.
func (l *lazyPeers) record(cfg wgtypes.Config) (wgtypes.Config, []*lazyPeer) {
	out := wgtypes.Config{PrivateKey: cfg.PrivateKey, ListenPort: cfg.ListenPort, FirewallMark: cfg.FirewallMark, ReplacePeers: cfg.ReplacePeers}
	if cfg.ReplacePeers {
		for k, p := range l.peers {
			if !p.active {
				l.idle.Add(-1)
			}
			delete(l.peers, k)
		}
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
			} else {
				l.idle.Add(-1)
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
			p = &lazyPeer{}
			l.peers[pc.PublicKey] = p
			l.idle.Add(1)
		}
		p.apply(pc)
		if p.active {
			out.Peers = append(out.Peers, pc)
		} else {
			idleTouched = append(idleTouched, pc.PublicKey)
		}
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

// index rebuilds the allowed-IP lookup of every peer.
func (l *lazyPeers) index() {
	clear(l.owner)
	l.lens = [2][]int{}
	for k, p := range l.peers {
		for _, n := range p.allowed {
			pfx, ok := ipNetToPrefix(n)
			if !ok {
				continue
			}
			l.owner[pfx.Masked()] = k
			f := family(pfx.Addr())
			if !slices.Contains(l.lens[f], pfx.Bits()) {
				l.lens[f] = append(l.lens[f], pfx.Bits())
			}
		}
	}
	for f := range l.lens {
		slices.SortFunc(l.lens[f], func(a, b int) int { return b - a })
	}
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// idleOwner returns the peer out of the device whose allowed IPs route dst
// (longest prefix first), if any.
func (l *lazyPeers) idleOwner(dst netip.Addr) (wgtypes.Key, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	f := family(dst)
	for _, bits := range l.lens[f] {
		pfx, err := dst.Prefix(bits)
		if err != nil {
			continue
		}
		if k, ok := l.owner[pfx]; ok {
			p := l.peers[k]
			return k, p != nil && !p.active
		}
	}
	return wgtypes.Key{}, false
}

func (l *lazyPeers) isIdle(k wgtypes.Key) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	p := l.peers[k]
	return p != nil && !p.active
}

// outbound is called with each batch read from the TUN device, before the
// device routes it: it puts in the peers out of the device the packets are
// for.
func (l *lazyPeers) outbound(bufs [][]byte, sizes []int, offset int) {
	for i := range sizes {
		if l.idle.Load() == 0 {
			return
		}
		if sizes[i] < 1 || offset+sizes[i] > len(bufs[i]) {
			continue
		}
		dst, ok := packetDst(bufs[i][offset : offset+sizes[i]])
		if !ok {
			continue
		}
		if k, ok := l.idleOwner(dst); ok {
			l.request(k)
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
func (l *lazyPeers) inbound(bufs [][]byte, sizes []int) {
	for i := range sizes {
		if l.idle.Load() == 0 {
			return
		}
		if sizes[i] > len(bufs[i]) || !initiation.IsInitiation(bufs[i][:sizes[i]]) {
			continue
		}
		r := l.reader.Load()
		if !r.ValidMAC1(bufs[i][:sizes[i]]) || !l.checks.Allow() {
			continue
		}
		k, ok := r.Sender(bufs[i][:sizes[i]])
		if ok && l.isIdle(k) {
			l.request(k)
		}
	}
}

// request asks the worker to put peer k into the device and waits for it,
// at most lazyActivateWait.
func (l *lazyPeers) request(k wgtypes.Key) {
	t := time.NewTimer(lazyActivateWait)
	defer t.Stop()
	r := lazyRequest{key: k, done: make(chan struct{})}
	select {
	case l.reqs <- r:
	case <-t.C:
		l.log.Debug("putting an idle WireGuard peer into the device: busy", "peer", k.String())
		return
	case <-l.stop:
		return
	}
	select {
	case <-r.done:
	case <-t.C:
		l.log.Debug("putting an idle WireGuard peer into the device: still waiting", "peer", k.String())
	case <-l.stop:
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
	l.activations.Add(1)
	l.log.Debug("WireGuard peer put into the device on traffic", "peer", k.String())
}

// trimIdle takes out of the device the peers that carried no traffic and
// made no handshake for idleAfter, keeping the endpoint the device learned
// for them.
func (l *lazyPeers) trimIdle() error {
	cur, err := l.inner.Device(l.name)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.syncPresent(cur.Peers)
	now := l.now()
	var out []wgtypes.PeerConfig
	var gone []*lazyPeer
	var eps []*net.UDPAddr
	for i := range cur.Peers {
		c := &cur.Peers[i]
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
		out = append(out, wgtypes.PeerConfig{PublicKey: c.PublicKey, Remove: true})
		gone = append(gone, p)
		eps = append(eps, c.Endpoint)
	}
	if len(out) == 0 {
		return nil
	}
	if err := l.inner.ConfigureDevice(l.name, wgtypes.Config{Peers: out}); err != nil {
		return err
	}
	for i, p := range gone {
		if eps[i] != nil {
			ep := *eps[i]
			p.endpoint = &ep // learned by roaming: where to start next time
		}
		l.setActive(p, false, now)
	}
	l.trims.Add(uint64(len(gone)))
	l.log.Debug("idle WireGuard peers taken out of the device", "peers", len(gone))
	return nil
}

// LazyStats is what the lazy-peer layer of a device reports.
type LazyStats struct {
	Idle        int    // peers kept out of the device now
	Activations uint64 // peers put into the device on traffic, so far
	Trims       uint64 // peers taken out after lazyIdleAfter without traffic, so far
}

func (l *lazyPeers) stats() LazyStats {
	return LazyStats{Idle: int(l.idle.Load()), Activations: l.activations.Load(), Trims: l.trims.Load()}
}
