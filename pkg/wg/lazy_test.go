package wg

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/wg/internal/initiation/initiationtest"
)

// lazyPair is the same desired state applied through two Devices: one
// over a plain FakeClient (every peer in the device, the reference) and one
// over lazyPeers over another FakeClient (the device holds the active
// peers only).
type lazyPair struct {
	eager, lazy      *Device
	eagerFake, inner *FakeClient
	l                *lazyPeers
	now              time.Time
	keys             []wgtypes.Key
	own              wgtypes.Key
}

func newLazyPair(t *testing.T, keys int) *lazyPair { return newLazyPairAbove(t, keys, 0) }

// newLazyPairAbove is newLazyPair with a lazyPeers lazy only above peers
// (Options.LazyPeersAbove).
func newLazyPairAbove(t *testing.T, keys, above int) *lazyPair {
	t.Helper()
	p := &lazyPair{eagerFake: NewFakeClient(), inner: NewFakeClient(), now: time.Unix(1_700_000_000, 0)}
	p.eagerFake.AddDevice("wg0")
	p.inner.AddDevice("wg0")
	p.l = newLazyPeers("wg0", testLogger(t), above)
	p.l.now = func() time.Time { return p.now }
	p.l.start(p.inner)
	t.Cleanup(p.l.close)
	links := NewFakeLinks()
	links.AddLink("wg0", 7, 1420)
	p.eager = NewWithClient("wg0", p.eagerFake, links, 1420, nil)
	p.lazy = NewWithClient("wg0", p.l, links, 1420, nil)
	p.lazy.lazy = p.l
	p.eager.now = func() time.Time { return p.now }
	p.lazy.now = func() time.Time { return p.now }
	for range keys {
		p.keys = append(p.keys, privKey(t).PublicKey())
	}
	p.own = privKey(t)
	return p
}

// randomConfig is a desired Config over a random subset of p.keys, each
// with random allowed IPs (unique), keepalive, endpoint and preshared key.
func (p *lazyPair) randomConfig(r *rand.Rand) Config {
	cfg := Config{PrivateKey: p.own, ListenPort: 51820}
	for i, k := range p.keys {
		if r.IntN(4) == 0 {
			continue
		}
		peer := Peer{PublicKey: k}
		for j := range 1 + r.IntN(3) {
			switch r.IntN(3) {
			case 0:
				peer.AllowedIPs = append(peer.AllowedIPs, netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", i, j)))
			case 1:
				peer.AllowedIPs = append(peer.AllowedIPs, netip.MustParsePrefix(fmt.Sprintf("10.200.%d.%d/32", i, j)))
			default:
				peer.AllowedIPs = append(peer.AllowedIPs, netip.MustParsePrefix(fmt.Sprintf("fd00:%x:%x::/64", i, j)))
			}
		}
		if r.IntN(4) == 0 {
			peer.PersistentKeepalive = 25 * time.Second
		}
		if r.IntN(3) > 0 {
			peer.Endpoint = &net.UDPAddr{IP: net.IPv4(192, 0, 2, byte(1+r.IntN(3))), Port: 51820}
		}
		if r.IntN(3) == 0 {
			psk := wgtypes.Key{byte(i + 1), byte(r.IntN(2))}
			peer.PresharedKey = &psk
		}
		cfg.Peers = append(cfg.Peers, peer)
	}
	return cfg
}

// comparablePeer is what configuration says of a peer, normalised.
type comparablePeer struct {
	psk       wgtypes.Key
	endpoint  string
	keepalive time.Duration
	allowed   string
}

func configured(t *testing.T, peers []wgtypes.Peer) map[wgtypes.Key]comparablePeer {
	t.Helper()
	out := map[wgtypes.Key]comparablePeer{}
	for _, c := range peers {
		if _, dup := out[c.PublicKey]; dup {
			t.Fatalf("peer %s listed twice", c.PublicKey)
		}
		ps := normalizeIPNets(c.AllowedIPs)
		sortPrefixes(ps)
		ep := ""
		if c.Endpoint != nil {
			ep = c.Endpoint.String()
		}
		out[c.PublicKey] = comparablePeer{psk: c.PresharedKey, endpoint: ep, keepalive: c.PersistentKeepaliveInterval, allowed: fmt.Sprint(ps)}
	}
	return out
}

// check compares the lazy Device's view with the reference and the inner
// device with the active peers.
func (p *lazyPair) check(t *testing.T, step string) {
	t.Helper()
	ref, err := p.eagerFake.Device("wg0")
	if err != nil {
		t.Fatal(err)
	}
	view, err := p.l.Device("wg0")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := p.inner.Device("wg0")
	if err != nil {
		t.Fatal(err)
	}
	want, got := configured(t, ref.Peers), configured(t, view.Peers)
	if !mapsEqual(want, got) {
		t.Fatalf("%s: lazy view differs from the reference:\nwant %v\ngot  %v", step, want, got)
	}
	if view.PrivateKey != ref.PrivateKey || view.ListenPort != ref.ListenPort {
		t.Fatalf("%s: device fields differ", step)
	}
	in := configured(t, inner.Peers)
	idle := 0
	for k, c := range got {
		lp := p.l.peers[k]
		if lp == nil {
			t.Fatalf("%s: peer %s not recorded", step, k)
		}
		ic, ok := in[k]
		if ok != lp.active {
			t.Fatalf("%s: peer %s in the device %v, active %v", step, k, ok, lp.active)
		}
		if !ok {
			idle++
			if c.keepalive > 0 {
				t.Fatalf("%s: peer %s with a persistent keepalive kept out of the device", step, k)
			}
			continue
		}
		if ic != c {
			t.Fatalf("%s: peer %s in the device as %v, configured %v", step, k, ic, c)
		}
	}
	if len(in) != len(got)-idle {
		t.Fatalf("%s: the device has %d peers, %d active", step, len(in), len(got)-idle)
	}
	if p.l.stats().Idle != idle {
		t.Fatalf("%s: idle count %d, want %d", step, p.l.stats().Idle, idle)
	}
	if wantEager := p.l.above > 0 && len(got) <= p.l.above; p.l.eager != wantEager || (p.l.eager && idle > 0) {
		t.Fatalf("%s: %d peers, lazy above %d: eager %v with %d idle; want eager %v and none idle when eager", step, len(got), p.l.above, p.l.eager, idle, wantEager)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestLazyPeersMatchEager replays random desired configs, with random
// activations, trims and roaming between them, through a Device over lazy
// peers and through a plain one: the lazy Device reads back what the plain
// one has, its device holds exactly the active peers as configured, and a
// peer with a persistent keepalive is always in it.
//
// Each seed runs three times: always lazy, lazy only above 4 peers (the
// random configs have 0 to 8, so the layer turns eager and lazy again), and
// above 100 (always eager).
func TestLazyPeersMatchEager(t *testing.T) {
	var flips [2]int // above 4: to eager, to lazy
	for seed := range uint64(40) {
		for _, above := range []int{0, 4, 100} {
			t.Run(fmt.Sprintf("%d/above-%d", seed, above), func(t *testing.T) {
				toEager, toLazy := replayLazy(t, seed, above)
				if above == 4 {
					flips[0] += toEager
					flips[1] += toLazy
				} else if toEager+toLazy > 0 {
					t.Fatalf("lazy above %d: turned eager %d times, lazy %d", above, toEager, toLazy)
				}
			})
		}
	}
	t.Logf("lazy above 4: turned eager %d times, lazy %d times", flips[0], flips[1])
	if flips[0] == 0 || flips[1] == 0 {
		t.Fatalf("lazy above 4: turned eager %d times and lazy %d times over the seeds; the replay does not cross the threshold both ways", flips[0], flips[1])
	}
}

// replayLazy is one seed of TestLazyPeersMatchEager; it returns how often
// the layer turned eager and lazy.
func replayLazy(t *testing.T, seed uint64, above int) (toEager, toLazy int) {
	r := rand.New(rand.NewPCG(seed, 7))
	p := newLazyPairAbove(t, 8, above)
	for step := range 30 {
		cfg := p.randomConfig(r)
		mustSet(t, p.eager, cfg)
		was := p.l.eager
		mustSet(t, p.lazy, cfg)
		switch {
		case p.l.eager && !was:
			toEager++
		case was && !p.l.eager:
			toLazy++
		}
		p.check(t, fmt.Sprintf("step %d set", step))
		if w := p.lazy.Writes(); step > 0 && w > p.eager.Writes() {
			t.Fatalf("step %d: lazy device written %d times, the eager one %d", step, w, p.eager.Writes())
		}
		// Traffic to some peers puts them in.
		for _, k := range p.keys {
			if r.IntN(3) == 0 {
				p.l.activate(k)
			}
		}
		p.check(t, fmt.Sprintf("step %d activated", step))
		// Some active peers see traffic or roam; time passes;
		// idle ones are trimmed.
		inner, _ := p.inner.Device("wg0")
		for _, c := range inner.Peers {
			switch r.IntN(4) {
			case 0:
				p.inner.SetReceived("wg0", c.PublicKey, c.ReceiveBytes+100)
			case 1:
				ep := &net.UDPAddr{IP: net.IPv4(198, 51, 100, byte(1+r.IntN(9))), Port: 4000}
				p.inner.SetEndpoint("wg0", c.PublicKey, ep)
				p.eagerFake.SetEndpoint("wg0", c.PublicKey, ep)
			}
		}
		if err := p.lazy.trimIdle(); err != nil {
			t.Fatal(err)
		}
		p.now = p.now.Add(time.Duration(r.IntN(4)) * 2 * time.Minute)
		if err := p.lazy.trimIdle(); err != nil {
			t.Fatal(err)
		}
		p.check(t, fmt.Sprintf("step %d trimmed", step))
	}
	return toEager, toLazy
}

// TestLazyPeersTrim: an active peer leaves the device only after
// lazyIdleAfter with no traffic, keeps the endpoint it roamed to, and a
// peer with a persistent keepalive never leaves.
func TestLazyPeersTrim(t *testing.T) {
	p := newLazyPair(t, 2)
	ep := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 51820}
	cfg := Config{PrivateKey: p.own, Peers: []Peer{
		{PublicKey: p.keys[0], Endpoint: ep, AllowedIPs: pfx("10.0.1.0/24")},
		{PublicKey: p.keys[1], Endpoint: ep, AllowedIPs: pfx("10.0.2.0/24"), PersistentKeepalive: 25 * time.Second},
	}}
	mustSet(t, p.lazy, cfg)
	in := func() int {
		d, _ := p.inner.Device("wg0")
		return len(d.Peers)
	}
	if n := in(); n != 1 || !p.l.isIdle(p.keys[0]) {
		t.Fatalf("after Set: %d peers in the device, want only the one with a keepalive", n)
	}
	p.l.activate(p.keys[0])
	if n := in(); n != 2 {
		t.Fatalf("after activation: %d peers in the device", n)
	}
	trim := func() {
		t.Helper()
		if err := p.lazy.trimIdle(); err != nil {
			t.Fatal(err)
		}
	}
	trim()
	roamed := &net.UDPAddr{IP: net.IPv4(203, 0, 113, 9), Port: 3333}
	p.inner.SetEndpoint("wg0", p.keys[0], roamed)
	p.inner.SetReceived("wg0", p.keys[0], 500)
	p.now = p.now.Add(4 * time.Minute)
	trim() // traffic seen: the idle clock restarts
	p.now = p.now.Add(4 * time.Minute)
	trim()
	if n := in(); n != 2 {
		t.Fatalf("trimmed 4 min after traffic: %d peers left", n)
	}
	p.now = p.now.Add(2 * time.Minute)
	trim()
	if n := in(); n != 1 || !p.l.isIdle(p.keys[0]) {
		t.Fatalf("not trimmed 6 min after traffic: %d peers", n)
	}
	if st := p.l.stats(); st.Trims != 1 || st.Activations != 1 || st.Idle != 1 {
		t.Fatalf("stats %+v", st)
	}
	view, _ := p.l.Device("wg0")
	for _, c := range view.Peers {
		if c.PublicKey == p.keys[0] && c.Endpoint.String() != roamed.String() {
			t.Fatalf("trimmed peer's endpoint %v, want the roamed %v", c.Endpoint, roamed)
		}
	}
	// Set again: nothing to write (the view is the desired state, and the
	// desired endpoint is the one last written, left to roaming).
	w := p.lazy.Writes()
	mustSet(t, p.lazy, cfg)
	if p.lazy.Writes() != w {
		t.Fatal("a repeated Set wrote to the device")
	}
	p.l.activate(p.keys[0])
	d, _ := p.inner.Device("wg0")
	for _, c := range d.Peers {
		if c.PublicKey == p.keys[0] && c.Endpoint.String() != roamed.String() {
			t.Fatalf("re-activated at %v, want %v", c.Endpoint, roamed)
		}
	}
}

func ipv4Packet(dst string) []byte {
	pkt := make([]byte, 20)
	pkt[0] = 0x45
	a := netip.MustParseAddr(dst).As4()
	copy(pkt[16:], a[:])
	return pkt
}

func ipv6Packet(dst string) []byte {
	pkt := make([]byte, 40)
	pkt[0] = 0x60
	a := netip.MustParseAddr(dst).As16()
	copy(pkt[24:], a[:])
	return pkt
}

// TestLazyPeersOutbound: a packet read from the TUN device puts the peer
// whose allowed IPs route it (longest prefix) into the device, and nothing
// else; a short or foreign packet puts nothing in.
func TestLazyPeersOutbound(t *testing.T) {
	p := newLazyPair(t, 3)
	mustSet(t, p.lazy, Config{PrivateKey: p.own, Peers: []Peer{
		{PublicKey: p.keys[0], AllowedIPs: pfx("10.0.0.0/16")},
		{PublicKey: p.keys[1], AllowedIPs: pfx("10.0.1.0/24")},
		{PublicKey: p.keys[2], AllowedIPs: pfx("fd00:1::/64")},
	}})
	const offset = 16
	send := func(pkts ...[]byte) {
		bufs := make([][]byte, len(pkts))
		sizes := make([]int, len(pkts))
		for i, pkt := range pkts {
			bufs[i] = append(make([]byte, offset), pkt...)
			sizes[i] = len(pkt)
		}
		p.l.outbound(bufs, sizes, offset)
	}
	active := func() []wgtypes.Key {
		d, _ := p.inner.Device("wg0")
		var ks []wgtypes.Key
		for _, c := range d.Peers {
			ks = append(ks, c.PublicKey)
		}
		slices.SortFunc(ks, compareKeys)
		return ks
	}
	want := func(ks ...wgtypes.Key) {
		t.Helper()
		slices.SortFunc(ks, compareKeys)
		if got := active(); !slices.Equal(got, ks) {
			t.Fatalf("in the device: %v, want %v", got, ks)
		}
	}
	send(ipv4Packet("10.9.0.1"), ipv6Packet("fd00:2::1"), []byte{0x45, 0, 0}, []byte{0x60})
	want()
	send(ipv4Packet("10.0.1.7"))
	want(p.keys[1])
	send(ipv4Packet("10.0.1.8"), ipv4Packet("10.0.2.1"))
	want(p.keys[0], p.keys[1])
	send(ipv6Packet("fd00:1::99"))
	want(p.keys...)
	if p.l.stats().Idle != 0 {
		t.Fatalf("idle %d", p.l.stats().Idle)
	}
}

// TestRootLazyPeers: two in-process devices with lazy peers in fresh
// namespaces. Neither holds the other until traffic: a ping from a puts b
// into a's device (the packet read from the TUN device) and a into b's (a's
// handshake initiation, identified before b's device reads it), and goes
// through. Once idle past the trim delay both take the other out again, and
// a ping the other way brings both back.
func TestRootLazyPeers(t *testing.T) {
	requireRoot(t)
	log := testLogger(t)
	a, b := nodePair(t, 24)
	for i := range 20 { // idle peers a packet must not wake
		k := privKey(t).PublicKey()
		a.cfg.Peers = append(a.cfg.Peers, Peer{PublicKey: k, Endpoint: udp(fmt.Sprintf("198.51.100.%d:51820", 100+i)), AllowedIPs: pfx(fmt.Sprintf("10.77.1.%d/32", i))})
	}
	for _, n := range []*node{a, b} {
		n.dev = mustOpenIn(t, n.ns, Options{Name: n.name, Mode: ModeUserspace, MTU: 1420, Logger: log, LazyPeers: true})
		t.Cleanup(func() { n.dev.Delete() })
		mustSet(t, n.dev, n.cfg)
	}
	inDevice := func(n *node) int { return len(wgDevice(t, n.name).Peers) }
	if inDevice(a) != 0 || inDevice(b) != 0 {
		t.Fatalf("peers in the devices before any traffic: a %d, b %d", inDevice(a), inDevice(b))
	}
	if st, err := a.dev.Stats(); err != nil || len(st) != 21 {
		t.Fatalf("Stats lists %d peers (%v), want every configured one", len(st), err)
	}
	ping := func(from *node, to string) {
		t.Helper()
		if out, err := execIn(t, from.ns, "ping", "-c", "3", "-i", "0.2", "-W", "2", to); err != nil {
			t.Fatalf("ping %s through the tunnel: %v\n%s", to, err, out)
		}
	}
	ping(a, "10.77.0.2")
	if inDevice(a) != 1 || inDevice(b) != 1 {
		t.Fatalf("after a ping: %d peers in a's device, %d in b's; want 1 each", inDevice(a), inDevice(b))
	}
	sa, _ := a.dev.LazyStats()
	sb, _ := b.dev.LazyStats()
	if sa.Activations != 1 || sb.Activations != 1 || sa.Idle != 20 || sb.Idle != 0 {
		t.Fatalf("lazy stats: a %+v, b %+v", sa, sb)
	}
	tcpEcho(t, a.ns, b.ns, "10.77.0.2:7777")

	// Idle: trimmed on both sides once the delay passes with no traffic.
	for _, n := range []*node{a, b} {
		n.dev.mu.Lock()
		n.dev.lazy.idleAfter = time.Second
		n.dev.mu.Unlock()
	}
	deadline := time.Now().Add(20 * time.Second)
	for inDevice(a)+inDevice(b) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not trimmed: %d peers in a's device, %d in b's", inDevice(a), inDevice(b))
		}
		for _, n := range []*node{a, b} {
			if err := n.dev.trimIdle(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	ping(b, "10.77.0.1")
	tcpEcho(t, b.ns, a.ns, "10.77.0.1:7778")
	sa, _ = a.dev.LazyStats()
	sb, _ = b.dev.LazyStats()
	if sa.Activations != 2 || sb.Activations != 2 || sa.Trims != 1 || sb.Trims != 1 {
		t.Fatalf("lazy stats after the trim and a ping back: a %+v, b %+v", sa, sb)
	}
}

// TestLazyPeersRecreated: a peer in the device that a handshake retry
// re-creates (Remove and add in one call) stays in the device, with the
// whole sequence forwarded; an idle one re-created stays out.
func TestLazyPeersRecreated(t *testing.T) {
	p := newLazyPair(t, 2)
	ep := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 51820}
	mustSet(t, p.lazy, Config{PrivateKey: p.own, Peers: []Peer{
		{PublicKey: p.keys[0], Endpoint: ep, AllowedIPs: pfx("10.0.1.0/24")},
		{PublicKey: p.keys[1], Endpoint: ep, AllowedIPs: pfx("10.0.2.0/24")},
	}})
	p.l.activate(p.keys[0])
	ka := 25 * time.Second
	zero := time.Duration(0)
	var peers []wgtypes.PeerConfig
	for _, k := range p.keys {
		peers = append(peers,
			wgtypes.PeerConfig{PublicKey: k, Remove: true},
			wgtypes.PeerConfig{PublicKey: k, Endpoint: ep, PersistentKeepaliveInterval: &ka, ReplaceAllowedIPs: true, AllowedIPs: toIPNets(pfx("10.0.9.0/24"))},
			wgtypes.PeerConfig{PublicKey: k, UpdateOnly: true, PersistentKeepaliveInterval: &zero},
		)
		peers[len(peers)-2].AllowedIPs[0].IP[2] = byte(len(peers))
	}
	p.inner.Reset()
	if err := p.l.ConfigureDevice("wg0", wgtypes.Config{Peers: peers}); err != nil {
		t.Fatal(err)
	}
	if p.l.isIdle(p.keys[0]) || !p.l.isIdle(p.keys[1]) {
		t.Fatalf("after re-creation: idle %v, %v; want false, true", p.l.isIdle(p.keys[0]), p.l.isIdle(p.keys[1]))
	}
	got := p.inner.Configs
	if len(got) != 1 || len(got[0].Peers) != 3 || got[0].Peers[0].PublicKey != p.keys[0] || !got[0].Peers[0].Remove {
		t.Fatalf("forwarded %+v, want the active peer's remove, create and update", got)
	}
	if p.l.stats().Idle != 1 {
		t.Fatalf("idle count %d", p.l.stats().Idle)
	}
}

// TestLazyPeersRefuseReplays: an initiation puts its idle sender into the
// device; once the peer is trimmed (the device forgets the last timestamp
// it took from it) the same initiation replayed puts nothing in, and a
// later one does. An initiation from an unknown key does nothing.
func TestLazyPeersRefuseReplays(t *testing.T) {
	p := newLazyPair(t, 0)
	a := privKey(t)
	mustSet(t, p.lazy, Config{PrivateKey: p.own, Peers: []Peer{{PublicKey: a.PublicKey(), AllowedIPs: pfx("10.0.1.0/24")}}})
	first := initiationtest.Capture(t, a, p.own)
	// Initiation timestamps have a granularity of 2^24 ns (wireguard-go
	// whitens the rest): the second is later once that much has passed.
	time.Sleep(50 * time.Millisecond)
	second := initiationtest.Capture(t, a, p.own)
	stranger := initiationtest.Capture(t, privKey(t), p.own)
	receive := func(msg []byte) {
		buf := append([]byte(nil), msg...)
		p.l.inbound([][]byte{buf}, []int{len(buf)})
	}
	receive(stranger)
	if st := p.l.stats(); st.Idle != 1 || st.Activations != 0 {
		t.Fatalf("after a stranger's initiation: %+v", st)
	}
	receive(first)
	if p.l.isIdle(a.PublicKey()) {
		t.Fatal("an initiation did not put its sender into the device")
	}
	p.now = p.now.Add(lazyIdleAfter + time.Minute)
	if err := p.lazy.trimIdle(); err != nil {
		t.Fatal(err)
	}
	if err := p.lazy.trimIdle(); err != nil {
		t.Fatal(err)
	}
	if !p.l.isIdle(a.PublicKey()) {
		t.Fatal("not trimmed")
	}
	receive(first)
	if !p.l.isIdle(a.PublicKey()) {
		t.Fatal("a replayed initiation put its sender back into the device")
	}
	if st := p.l.stats(); st.Replays != 1 || st.Activations != 1 {
		t.Fatalf("after the replay: %+v", st)
	}
	receive(second)
	if p.l.isIdle(a.PublicKey()) {
		t.Fatal("a later initiation did not put its sender into the device")
	}
}

// TestLazyPeersKeepaliveRestored: a peer with a persistent keepalive taken
// out of the device by hand is put back by the next trim; one also dropped
// from the configuration is gone for good, its allowed IPs going to the
// peer that took them.
func TestLazyPeersKeepaliveRestored(t *testing.T) {
	p := newLazyPair(t, 2)
	cfg := Config{PrivateKey: p.own, Peers: []Peer{{PublicKey: p.keys[0], Endpoint: udp("192.0.2.1:51820"), AllowedIPs: pfx("10.0.1.0/24"), PersistentKeepalive: 25 * time.Second}}}
	mustSet(t, p.lazy, cfg)
	removeByHand := func() {
		t.Helper()
		if err := p.inner.ConfigureDevice("wg0", wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: p.keys[0], Remove: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	removeByHand()
	if err := p.lazy.trimIdle(); err != nil {
		t.Fatal(err)
	}
	d, _ := p.inner.Device("wg0")
	if len(d.Peers) != 1 || d.Peers[0].PersistentKeepaliveInterval != 25*time.Second {
		t.Fatalf("the keepalive peer is not back in the device: %+v", d.Peers)
	}
	removeByHand()
	mustSet(t, p.lazy, Config{PrivateKey: p.own, Peers: []Peer{{PublicKey: p.keys[1], AllowedIPs: pfx("10.0.1.0/24")}}})
	p.l.outbound([][]byte{ipv4Packet("10.0.1.5")}, []int{20}, 0)
	if err := p.lazy.trimIdle(); err != nil {
		t.Fatal(err)
	}
	d, _ = p.inner.Device("wg0")
	if len(d.Peers) != 1 || d.Peers[0].PublicKey != p.keys[1] || len(d.Peers[0].AllowedIPs) != 1 {
		t.Fatalf("in the device: %+v; want only the peer that took 10.0.1.0/24", d.Peers)
	}
	if st := p.l.stats(); st.Idle != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLazyPeersTrimFloorsTimestamps: an initiation the lazy layer never
// saw (the device took it while the peer was in, say past the rate limit)
// does not put the peer back once it is trimmed: the trim puts a floor
// under the timestamps it accepts.
func TestLazyPeersTrimFloorsTimestamps(t *testing.T) {
	p := newLazyPair(t, 0)
	p.now = time.Now()
	a := privKey(t)
	mustSet(t, p.lazy, Config{PrivateKey: p.own, Peers: []Peer{{PublicKey: a.PublicKey(), AllowedIPs: pfx("10.0.1.0/24")}}})
	unseen := initiationtest.Capture(t, a, p.own)
	p.l.activate(a.PublicKey()) // by a packet; the initiation went by unseen
	p.now = p.now.Add(lazyIdleAfter + time.Minute)
	for range 2 {
		if err := p.lazy.trimIdle(); err != nil {
			t.Fatal(err)
		}
	}
	if !p.l.isIdle(a.PublicKey()) {
		t.Fatal("not trimmed")
	}
	p.l.inbound([][]byte{unseen}, []int{len(unseen)})
	if !p.l.isIdle(a.PublicKey()) {
		t.Fatal("an initiation older than the trim put its sender back")
	}
	if st := p.l.stats(); st.Replays != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// activatingClient is a FakeClient whose reads start an activation of
// peer key by the lazy layer l (as a packet would) and give it time to
// run before they return.
type activatingClient struct {
	*FakeClient
	l    *lazyPeers
	key  wgtypes.Key
	done chan struct{}
}

func (c *activatingClient) Device(name string) (*wgtypes.Device, error) {
	d, err := c.FakeClient.Device(name)
	if c.done == nil {
		c.done = make(chan struct{})
		go func() { c.l.activate(c.key); close(c.done) }()
		time.Sleep(20 * time.Millisecond)
	}
	return d, err
}

// TestLazyPeersNoStaleRead: a peer put into the device while a Set reads
// the device is still removed by that Set when it is no longer wanted.
func TestLazyPeersNoStaleRead(t *testing.T) {
	p := newLazyPair(t, 2)
	mustSet(t, p.lazy, Config{PrivateKey: p.own, Peers: []Peer{
		{PublicKey: p.keys[0], AllowedIPs: pfx("10.0.1.0/24")},
		{PublicKey: p.keys[1], AllowedIPs: pfx("10.0.2.0/24")},
	}})
	ac := &activatingClient{FakeClient: p.inner, l: p.l, key: p.keys[0]}
	p.l.inner = ac
	mustSet(t, p.lazy, Config{PrivateKey: p.own, Peers: []Peer{{PublicKey: p.keys[1], AllowedIPs: pfx("10.0.2.0/24")}}})
	<-ac.done
	d, _ := p.inner.Device("wg0")
	for _, c := range d.Peers {
		if c.PublicKey == p.keys[0] {
			t.Fatalf("peer removed by Set still in the device: %+v", c)
		}
	}
}

// TestRootLazyPeersRebindUnderInitiations: the device's UDP socket is
// rebound (a listen port write, which waits for the receive goroutines)
// again and again while handshake initiations keep arriving, which the
// receive goroutines read for the lazy layer: nothing may wait on the other
// for good.
func TestRootLazyPeersRebindUnderInitiations(t *testing.T) {
	requireRoot(t)
	log := testLoggerAt(t, slog.LevelInfo)
	a, b := nodePair(t, 24)
	b.cfg.Peers = append(b.cfg.Peers, Peer{PublicKey: privKey(t).PublicKey(), AllowedIPs: pfx("10.77.1.1/32")}) // stays idle
	a.dev = mustOpenIn(t, a.ns, Options{Name: a.name, Mode: ModeUserspace, MTU: 1420, Logger: log})
	b.dev = mustOpenIn(t, b.ns, Options{Name: b.name, Mode: ModeUserspace, MTU: 1420, Logger: log, LazyPeers: true})
	t.Cleanup(func() { a.dev.Delete(); b.dev.Delete() })
	mustSet(t, a.dev, a.cfg)
	mustSet(t, b.dev, b.cfg)

	watchdog := time.AfterFunc(60*time.Second, func() {
		buf := make([]byte, 1<<20)
		panic("rebinding under initiations hung; goroutines:\n" + string(buf[:runtime.Stack(buf, true)]))
	})
	defer watchdog.Stop()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a re-creates its peer b again and again: one initiation each
		defer close(done)
		ka := time.Second
		bk := b.cfg.PrivateKey.PublicKey()
		for {
			select {
			case <-stop:
				return
			default:
			}
			a.dev.mu.Lock()
			err := a.dev.client.ConfigureDevice(a.name, wgtypes.Config{Peers: []wgtypes.PeerConfig{
				{PublicKey: bk, Remove: true},
				{PublicKey: bk, Endpoint: udp("198.51.100.2:51820"), PersistentKeepaliveInterval: &ka, AllowedIPs: toIPNets(pfx("10.77.0.2/32"))},
			}})
			a.dev.mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	port := 51820
	for range 200 {
		b.dev.mu.Lock()
		err := b.dev.client.ConfigureDevice(b.name, wgtypes.Config{ListenPort: &port})
		b.dev.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	if st, _ := b.dev.LazyStats(); st.Activations != 1 || st.Idle != 1 {
		t.Fatalf("lazy stats %+v: want a put in once, the other peer idle", st)
	}
}

// TestLazyPeersEagerBelowThreshold: at or below LazyPeersAbove peers the
// layer forwards every write exactly as a plain device gets it (created
// peers' first handshakes nudged and awaited alike), a peer removed from
// the device by hand reads as missing and the next Set puts it back, the
// trim neither reads nor writes the device, and initiations are not read.
func TestLazyPeersEagerBelowThreshold(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 9))
	p := newLazyPairAbove(t, 6, 6)
	same := func(step string) {
		t.Helper()
		if !reflect.DeepEqual(p.inner.Configs, p.eagerFake.Configs) {
			t.Fatalf("%s: forwarded\n%+v\nthe plain device got\n%+v", step, p.inner.Configs, p.eagerFake.Configs)
		}
		if !slices.Equal(slices.SortedFunc(maps.Keys(p.lazy.pending), compareKeys), slices.SortedFunc(maps.Keys(p.eager.pending), compareKeys)) {
			t.Fatalf("%s: awaiting handshakes of %d peers, the plain device %d", step, len(p.lazy.pending), len(p.eager.pending))
		}
		p.check(t, step)
	}
	for step := range 20 {
		cfg := p.randomConfig(r)
		mustSet(t, p.eager, cfg)
		mustSet(t, p.lazy, cfg)
		same(fmt.Sprintf("step %d", step))
	}
	cfg := p.randomConfig(r)
	for len(cfg.Peers) < 2 {
		cfg = p.randomConfig(r)
	}
	mustSet(t, p.eager, cfg)
	mustSet(t, p.lazy, cfg)
	gone := cfg.Peers[1].PublicKey
	for _, c := range []*FakeClient{p.inner, p.eagerFake} {
		if err := c.ConfigureDevice("wg0", wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: gone, Remove: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	view, err := p.l.Device("wg0")
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(view.Peers, func(c wgtypes.Peer) bool { return c.PublicKey == gone }) {
		t.Fatal("a peer removed by hand still reads as configured")
	}
	mustSet(t, p.eager, cfg)
	mustSet(t, p.lazy, cfg)
	same("after a peer was removed by hand")

	reads, writes := p.inner.DeviceCalls, len(p.inner.Configs)
	p.now = p.now.Add(time.Hour)
	if err := p.lazy.trimIdle(); err != nil {
		t.Fatal(err)
	}
	if p.inner.DeviceCalls != reads || len(p.inner.Configs) != writes {
		t.Fatalf("the trim read the device %d times and wrote it %d times", p.inner.DeviceCalls-reads, len(p.inner.Configs)-writes)
	}
	msg := initiationtest.Capture(t, privKey(t), p.own)
	p.l.inbound([][]byte{msg}, []int{len(msg)})
	if p.l.checks.Tokens() < lazyChecksBurst-0.5 {
		t.Fatal("an initiation was checked while every peer is in the device")
	}
}
