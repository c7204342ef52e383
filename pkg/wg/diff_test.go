package wg

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

const fakeName = "meshd0"

func newFake(t testing.TB) (*Device, *FakeClient, *FakeLinks) {
	t.Helper()
	c := NewFakeClient()
	c.AddDevice(fakeName)
	l := NewFakeLinks()
	l.AddLink(fakeName, 7, 1500)
	return NewWithClient(fakeName, c, l, 1420, nil), c, l
}

func key(t testing.TB, i int) wgtypes.Key {
	t.Helper()
	var k wgtypes.Key
	k[0], k[1], k[31] = byte(i>>8), byte(i), 0x42
	return k
}

func pfx(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, v := range s {
		out[i] = netip.MustParsePrefix(v)
	}
	return out
}

func udp(s string) *net.UDPAddr { return net.UDPAddrFromAddrPort(netip.MustParseAddrPort(s)) }

func privKey(t testing.TB) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func baseConfig(t testing.TB) Config {
	psk := key(t, 999)
	return Config{
		PrivateKey: privKey(t),
		ListenPort: 51820,
		Addresses:  pfx("10.4.0.1/16", "fd4::1/64"),
		Peers: []Peer{
			{PublicKey: key(t, 1), Endpoint: udp("198.51.100.1:51820"), AllowedIPs: pfx("10.4.0.2/32", "10.244.1.0/24")},
			{PublicKey: key(t, 2), Endpoint: udp("198.51.100.2:51820"), PersistentKeepalive: 25 * time.Second, AllowedIPs: pfx("10.4.0.3/32")},
			{PublicKey: key(t, 3), PresharedKey: &psk, AllowedIPs: pfx("10.244.3.0/24", "fd4::3/128")},
		},
	}
}

// checkState asserts the fake device is exactly cfg (endpoints only where
// cfg sets one).
func checkState(t testing.TB, c *FakeClient, cfg Config) {
	t.Helper()
	dev, err := c.Device(fakeName)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PrivateKey != (wgtypes.Key{}) && dev.PrivateKey != cfg.PrivateKey {
		t.Errorf("private key differs")
	}
	if cfg.ListenPort != 0 && dev.ListenPort != cfg.ListenPort {
		t.Errorf("listen port %d, want %d", dev.ListenPort, cfg.ListenPort)
	}
	if len(dev.Peers) != len(cfg.Peers) {
		t.Fatalf("device has %d peers, want %d", len(dev.Peers), len(cfg.Peers))
	}
	for _, w := range cfg.Peers {
		i := slices.IndexFunc(dev.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == w.PublicKey })
		if i < 0 {
			t.Fatalf("peer %s missing", w.PublicKey)
		}
		p := dev.Peers[i]
		var psk wgtypes.Key
		if w.PresharedKey != nil {
			psk = *w.PresharedKey
		}
		if p.PresharedKey != psk {
			t.Errorf("peer %s: psk differs", w.PublicKey)
		}
		if w.Endpoint != nil && udpToAddrPort(p.Endpoint) != udpToAddrPort(w.Endpoint) {
			t.Errorf("peer %s: endpoint %v, want %v", w.PublicKey, p.Endpoint, w.Endpoint)
		}
		if p.PersistentKeepaliveInterval != w.PersistentKeepalive.Truncate(time.Second) {
			t.Errorf("peer %s: keepalive %v, want %v", w.PublicKey, p.PersistentKeepaliveInterval, w.PersistentKeepalive)
		}
		want, _ := normalizePrefixes(w.AllowedIPs)
		if got := normalizeIPNets(p.AllowedIPs); !slices.Equal(got, want) {
			t.Errorf("peer %s: allowed IPs %v, want %v", w.PublicKey, got, want)
		}
	}
}

func mustSet(t testing.TB, d *Device, cfg Config) {
	t.Helper()
	if err := d.Set(cfg); err != nil {
		t.Fatalf("Set: %v", err)
	}
}

func TestSetCreatesThenNoWrites(t *testing.T) {
	d, c, l := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	checkState(t, c, cfg)
	if c.ConfigureCalls != 1 {
		t.Fatalf("ConfigureDevice called %d times, want 1", c.ConfigureCalls)
	}
	st, _ := l.Link(fakeName)
	if !st.Up || st.MTU != 1420 || !slices.Equal(sortCompact(st.Addrs), sortCompact(pfx("10.4.0.1/16", "fd4::1/64"))) {
		t.Fatalf("link state %+v", st)
	}
	w, lc := d.Writes(), l.Calls
	for range 3 {
		mustSet(t, d, cfg)
	}
	if c.ConfigureCalls != 1 || d.Writes() != w || l.Calls != lc {
		t.Fatalf("unchanged config wrote: configure=%d writes %d->%d link calls %d->%d", c.ConfigureCalls, w, d.Writes(), lc, l.Calls)
	}
}

func TestSetCreatedPeersAreFullAndNeverReplacePeers(t *testing.T) {
	d, c, _ := newFake(t)
	mustSet(t, d, baseConfig(t))
	got := c.Configs[0]
	if got.ReplacePeers {
		t.Fatal("ReplacePeers set")
	}
	for _, p := range got.Peers {
		if p.Remove || (p.UpdateOnly && p.PersistentKeepaliveInterval == nil) {
			t.Fatalf("unexpected entry %+v", p)
		}
	}
}

func TestOnePeerChangeIsOnePeerDelta(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	c.Reset()
	cfg.Peers[1].AllowedIPs = append(slices.Clone(cfg.Peers[1].AllowedIPs), netip.MustParsePrefix("10.244.2.0/24"))
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 1 || len(c.Configs[0].Peers) != 1 {
		t.Fatalf("want one call with one peer, got %d calls %+v", c.ConfigureCalls, c.Configs)
	}
	p := c.Configs[0].Peers[0]
	if p.PublicKey != key(t, 2) || !p.UpdateOnly || !p.ReplaceAllowedIPs || p.Endpoint != nil || p.PresharedKey != nil || p.PersistentKeepaliveInterval != nil || len(p.AllowedIPs) != 2 {
		t.Fatalf("delta entry %+v", p)
	}
	if c.Configs[0].PrivateKey != nil || c.Configs[0].ListenPort != nil {
		t.Fatal("device fields rewritten")
	}
	checkState(t, c, cfg)
}

func TestRemovePeer(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	c.Reset()
	cfg.Peers = cfg.Peers[1:]
	mustSet(t, d, cfg)
	want := []wgtypes.PeerConfig{{PublicKey: key(t, 1), Remove: true}}
	if c.ConfigureCalls != 1 || !slices.EqualFunc(c.Configs[0].Peers, want, func(a, b wgtypes.PeerConfig) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) {
		t.Fatalf("configs %+v", c.Configs)
	}
	checkState(t, c, cfg)
	if _, ok := d.last[key(t, 1)]; ok {
		t.Fatal("removed peer's endpoint still remembered")
	}
}

func TestKeepaliveAndPSKChanges(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	c.Reset()
	cfg.Peers[0].PersistentKeepalive = 10 * time.Second
	cfg.Peers[2].PresharedKey = nil
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 1 || len(c.Configs[0].Peers) != 2 {
		t.Fatalf("configs %+v", c.Configs)
	}
	checkState(t, c, cfg)
	// Sub-second keepalives compare in whole seconds.
	cfg.Peers[0].PersistentKeepalive = 10*time.Second + 300*time.Millisecond
	c.Reset()
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 0 {
		t.Fatalf("fractional keepalive rewrote: %+v", c.Configs)
	}
}

func TestEndpointRoamingRule(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	pk := key(t, 1)

	// WireGuard roams: desired unchanged, so meshd must not fight it.
	c.SetEndpoint(fakeName, pk, udp("203.0.113.9:40000"))
	c.Reset()
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 0 {
		t.Fatalf("roamed endpoint was reset: %+v", c.Configs)
	}
	// A nil or zero desired endpoint never resets it either.
	cfg.Peers[0].Endpoint = nil
	mustSet(t, d, cfg)
	cfg.Peers[0].Endpoint = &net.UDPAddr{IP: net.IPv4zero, Port: 51820}
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 0 {
		t.Fatalf("nil endpoint wrote: %+v", c.Configs)
	}
	// A new desired endpoint is written once.
	cfg.Peers[0].Endpoint = udp("198.51.100.77:51820")
	mustSet(t, d, cfg)
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 1 || len(c.Configs[0].Peers) != 1 || c.Configs[0].Peers[0].Endpoint.String() != "198.51.100.77:51820" {
		t.Fatalf("configs %+v", c.Configs)
	}
	// IPv4-mapped spelling of the same endpoint is the same endpoint.
	cfg.Peers[0].Endpoint = &net.UDPAddr{IP: net.ParseIP("198.51.100.77").To16(), Port: 51820}
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 1 {
		t.Fatalf("mapped endpoint rewrote: %+v", c.Configs)
	}
}

func TestEndpointAfterRestartComparesWithDevice(t *testing.T) {
	d, c, l := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	// Restart: a new Device with no memory over the same device.
	d2 := NewWithClient(fakeName, c, l, 1420, nil)
	c.Reset()
	mustSet(t, d2, cfg)
	if c.ConfigureCalls != 0 || d2.Writes() != 0 {
		t.Fatalf("restart rewrote: %+v", c.Configs)
	}
	// After roaming, the restart compares with the device and writes once;
	// from then on the roamed endpoint is left alone again.
	c.SetEndpoint(fakeName, key(t, 2), udp("203.0.113.5:1000"))
	d3 := NewWithClient(fakeName, c, l, 1420, nil)
	mustSet(t, d3, cfg)
	if c.ConfigureCalls != 1 || len(c.Configs[0].Peers) != 1 || c.Configs[0].Peers[0].PublicKey != key(t, 2) {
		t.Fatalf("configs %+v", c.Configs)
	}
	c.SetEndpoint(fakeName, key(t, 2), udp("203.0.113.5:1000"))
	mustSet(t, d3, cfg)
	if c.ConfigureCalls != 1 {
		t.Fatalf("roaming fought after restart: %+v", c.Configs)
	}
}

func TestDeviceFieldsOnlyWhenDifferent(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	c.Reset()
	cfg.ListenPort = 51821
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 1 || c.Configs[0].ListenPort == nil || c.Configs[0].PrivateKey != nil || len(c.Configs[0].Peers) != 0 {
		t.Fatalf("configs %+v", c.Configs)
	}
	cfg.PrivateKey = privKey(t)
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 2 || c.Configs[1].PrivateKey == nil || c.Configs[1].ListenPort != nil {
		t.Fatalf("configs %+v", c.Configs)
	}
	// Zero values mean "leave as is".
	cfg.PrivateKey, cfg.ListenPort = wgtypes.Key{}, 0
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 2 {
		t.Fatalf("zero fields wrote: %+v", c.Configs)
	}
}

func TestHandshakeNudgeOnCreate(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	// Peer 1: endpoint, no keepalive: keepalive on, then off again.
	// Peer 2: endpoint and keepalive: one entry. Peer 3: no endpoint: none.
	if c.Keepalives[key(t, 1)] != 1 || c.Keepalives[key(t, 2)] != 1 || c.Keepalives[key(t, 3)] != 0 {
		t.Fatalf("keepalives %v", c.Keepalives)
	}
	n := 0
	for _, p := range c.Configs[0].Peers {
		if p.PublicKey == key(t, 1) {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("peer 1 has %d entries, want 2", n)
	}
	checkState(t, c, cfg) // keepalive back to 0
}

// A new private key nudges every kept peer with an endpoint in the same
// write (its keepalive starts the new key's handshake at once), whatever its
// keepalive, which ends as desired; peers without an endpoint and removed
// ones are left alone, and a repeat writes nothing.
func TestHandshakeNudgeOnKeyChange(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	c.Reset()
	cfg.PrivateKey = privKey(t)
	removed := key(t, 3)
	cfg.Peers = []Peer{cfg.Peers[0], cfg.Peers[1], {PublicKey: key(t, 4), AllowedIPs: pfx("10.244.4.0/24")}}
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 1 || c.Configs[0].PrivateKey == nil {
		t.Fatalf("configs %+v", c.Configs)
	}
	// Peer 1 (keepalive off) and peer 2 (25 s) are nudged; peer 4 (new, no
	// endpoint) and peer 3 (removed) are not.
	if c.Keepalives[key(t, 1)] != 1 || c.Keepalives[key(t, 2)] != 1 || c.Keepalives[key(t, 4)] != 0 || c.Keepalives[removed] != 0 {
		t.Fatalf("keepalives %v", c.Keepalives)
	}
	// The private key comes first in the write, so the nudge is as the new
	// key.
	checkState(t, c, cfg)
	c.Reset()
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 0 {
		t.Fatalf("repeat wrote: %+v", c.Configs)
	}
}

func TestInputsNotMutated(t *testing.T) {
	d, _, _ := newFake(t)
	cfg := baseConfig(t)
	cfg.Peers[0].AllowedIPs = pfx("10.244.9.0/24", "10.4.0.2/32", "10.244.9.0/24")
	cfg.Addresses = pfx("fd4::1/64", "10.4.0.1/16")
	before := fmt.Sprintf("%+v", cfg)
	mustSet(t, d, cfg)
	if after := fmt.Sprintf("%+v", cfg); after != before {
		t.Fatalf("Set mutated its input:\n%s\n%s", before, after)
	}
}

func TestInvalidEntriesSkippedAndConverge(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	own := cfg.PrivateKey.PublicKey()
	cfg.Peers = append(cfg.Peers,
		Peer{PublicKey: own, AllowedIPs: pfx("10.9.9.9/32")},
		Peer{PublicKey: key(t, 1), AllowedIPs: pfx("10.9.9.8/32")},
		Peer{PublicKey: key(t, 4), AllowedIPs: pfx("10.4.0.2/32", "10.4.0.9/32")}, // 10.4.0.2 is peer 1's
	)
	err := d.Set(cfg)
	if err == nil || !strings.Contains(err.Error(), "own public key") || !strings.Contains(err.Error(), "listed twice") || !strings.Contains(err.Error(), "already belongs") {
		t.Fatalf("Set error %v", err)
	}
	c.Reset()
	_ = d.Set(cfg)
	if c.ConfigureCalls != 0 {
		t.Fatalf("did not converge: %+v", c.Configs)
	}
	dev, _ := c.Device(fakeName)
	if len(dev.Peers) != 4 {
		t.Fatalf("%d peers", len(dev.Peers))
	}
}

func TestBatchFailureFallsBackPerPeer(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	bad := key(t, 2)
	c.Fail = func(_ string, cfg wgtypes.Config) error {
		for _, p := range cfg.Peers {
			if p.PublicKey == bad {
				return errors.New("invalid argument")
			}
		}
		return nil
	}
	err := d.Set(cfg)
	if err == nil || !strings.Contains(err.Error(), bad.String()) {
		t.Fatalf("Set error %v", err)
	}
	dev, _ := c.Device(fakeName)
	if len(dev.Peers) != 2 || dev.ListenPort != 51820 {
		t.Fatalf("other peers not applied: %+v", dev.Peers)
	}
	c.Fail = nil
	mustSet(t, d, cfg)
	checkState(t, c, cfg)
}

func TestLinkAddressesAndMTU(t *testing.T) {
	d, _, l := newFake(t)
	ll := netip.MustParsePrefix("fe80::1/64")
	_ = l.AddAddr(fakeName, ll)
	_ = l.AddAddr(fakeName, netip.MustParsePrefix("10.99.0.1/32"))
	cfg := Config{Addresses: pfx("10.4.0.1/16"), MTU: 1380}
	mustSet(t, d, cfg)
	st, _ := l.Link(fakeName)
	if st.MTU != 1380 || !st.Up || !slices.Equal(sortCompact(st.Addrs), sortCompact([]netip.Prefix{netip.MustParsePrefix("10.4.0.1/16"), ll})) {
		t.Fatalf("link %+v", st)
	}
	calls := l.Calls
	mustSet(t, d, cfg)
	if l.Calls != calls {
		t.Fatal("unchanged link rewritten")
	}
	cfg.Addresses = pfx("10.4.0.1/16", "2001:db8::1/128")
	mustSet(t, d, cfg)
	if l.Calls != calls+1 {
		t.Fatalf("adding one address made %d calls", l.Calls-calls)
	}
}

// TestLinkAddressPrefixLengthChange: the mesh address is on the link with
// another prefix length (an older meshd, or set by hand). IPv6 holds one
// entry per address, so the old entry is removed before the new one is
// added (adding first is refused); IPv4 holds both, so the new one is added
// first. Either way the wanted address ends up on the link, alone.
func TestLinkAddressPrefixLengthChange(t *testing.T) {
	for _, c := range []struct{ name, have, want string }{
		{"ipv6 /64 to /128", "fd00:4::1/64", "fd00:4::1/128"},
		{"ipv6 /128 to /64", "fd00:4::1/128", "fd00:4::1/64"},
		{"ipv4 /24 to /32", "10.4.0.1/24", "10.4.0.1/32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, _, l := newFake(t)
			ll := netip.MustParsePrefix("fe80::1/64")
			for _, p := range pfx(c.have, ll.String()) {
				if err := l.AddAddr(fakeName, p); err != nil {
					t.Fatal(err)
				}
			}
			cfg := Config{Addresses: pfx(c.want)}
			mustSet(t, d, cfg)
			st, _ := l.Link(fakeName)
			if want := sortCompact(pfx(c.want, ll.String())); !slices.Equal(sortCompact(st.Addrs), want) {
				t.Fatalf("addresses on the link after Set = %v, want %v", st.Addrs, want)
			}
			calls := l.Calls
			mustSet(t, d, cfg)
			if l.Calls != calls {
				t.Fatalf("a repeated Set made %d link writes, want 0", l.Calls-calls)
			}
		})
	}
}

// TestRandomConfigsReplay replays random configurations in random order:
// after each Set the device equals the config, repeating it writes nothing,
// and changing one peer writes exactly that peer.
func TestRandomConfigsReplay(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	priv := privKey(t)
	psk := key(t, 5000)
	gen := func() Config {
		cfg := Config{PrivateKey: priv, ListenPort: 51820 + rng.IntN(2)}
		for i := range 12 {
			if rng.IntN(3) == 0 {
				continue
			}
			p := Peer{PublicKey: key(t, i+1)}
			if rng.IntN(2) == 0 {
				p.Endpoint = udp(fmt.Sprintf("198.51.100.%d:%d", 1+rng.IntN(3), 51820+rng.IntN(2)))
			}
			if rng.IntN(3) == 0 {
				p.PersistentKeepalive = time.Duration(rng.IntN(3)*10) * time.Second
			}
			if rng.IntN(4) == 0 {
				p.PresharedKey = &psk
			}
			for j := range rng.IntN(4) {
				p.AllowedIPs = append(p.AllowedIPs, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), byte(rng.IntN(3)), 0}), 24+j))
			}
			rng.Shuffle(len(p.AllowedIPs), func(a, b int) { p.AllowedIPs[a], p.AllowedIPs[b] = p.AllowedIPs[b], p.AllowedIPs[a] })
			cfg.Peers = append(cfg.Peers, p)
		}
		rng.Shuffle(len(cfg.Peers), func(a, b int) { cfg.Peers[a], cfg.Peers[b] = cfg.Peers[b], cfg.Peers[a] })
		return cfg
	}
	configs := make([]Config, 40)
	for i := range configs {
		configs[i] = gen()
	}
	d, c, _ := newFake(t)
	for round := range 200 {
		cfg := configs[rng.IntN(len(configs))]
		mustSet(t, d, cfg)
		checkState(t, c, cfg)
		c.Reset()
		mustSet(t, d, cfg)
		if c.ConfigureCalls != 0 {
			t.Fatalf("round %d: repeat wrote %+v", round, c.Configs)
		}
		if len(cfg.Peers) == 0 {
			continue
		}
		// Change one peer (on a copy: configs are reused).
		mod := cfg
		mod.Peers = slices.Clone(cfg.Peers)
		i := rng.IntN(len(mod.Peers))
		mod.Peers[i].AllowedIPs = append(slices.Clone(mod.Peers[i].AllowedIPs), netip.MustParsePrefix(fmt.Sprintf("10.200.%d.0/24", i)))
		mustSet(t, d, mod)
		if c.ConfigureCalls != 1 || len(c.Configs[0].Peers) != 1 || c.Configs[0].Peers[0].PublicKey != mod.Peers[i].PublicKey {
			t.Fatalf("round %d: one-peer change gave %+v", round, c.Configs)
		}
		checkState(t, c, mod)
	}
}

func BenchmarkSetOnePeerChangeOf1000(b *testing.B) {
	d, c, _ := newFake(b)
	cfg := Config{PrivateKey: privKey(b), ListenPort: 51820}
	for i := range 1000 {
		cfg.Peers = append(cfg.Peers, Peer{
			PublicKey:           key(b, i+1),
			Endpoint:            udp(fmt.Sprintf("198.51.%d.%d:51820", 100+i/250, i%250+1)),
			PersistentKeepalive: 25 * time.Second,
			AllowedIPs:          []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), 32), netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i/256), byte(i), 0}), 24)},
		})
	}
	mustSet(b, d, cfg)
	// Established peers: first handshakes done, so no handshake retry
	// (a fake device never handshakes by itself) mixes into the deltas.
	for _, p := range cfg.Peers {
		c.SetHandshake(fakeName, p.PublicKey, time.Now())
	}
	extra := [2]netip.Prefix{netip.MustParsePrefix("10.250.0.0/24"), netip.MustParsePrefix("10.250.1.0/24")}
	c.Reset()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		cfg.Peers[500].AllowedIPs = []netip.Prefix{cfg.Peers[500].AllowedIPs[0], extra[i%2]}
		if err := d.Set(cfg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for _, cf := range c.Configs {
		if len(cf.Peers) != 1 {
			b.Fatalf("delta has %d peers, want 1", len(cf.Peers))
		}
	}
	b.ReportMetric(float64(len(c.Configs[len(c.Configs)-1].Peers)), "peers/delta")
}

// BenchmarkComputeDelta1000 is the comparison alone (no fake device work).
func BenchmarkComputeDelta1000(b *testing.B) {
	d, c, _ := newFake(b)
	cfg := Config{PrivateKey: privKey(b), ListenPort: 51820}
	for i := range 1000 {
		cfg.Peers = append(cfg.Peers, Peer{
			PublicKey:  key(b, i+1),
			Endpoint:   udp(fmt.Sprintf("198.51.%d.%d:51820", 100+i/250, i%250+1)),
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), 32)},
		})
	}
	mustSet(b, d, cfg)
	cur, _ := c.Device(fakeName)
	cfg.Peers[500].AllowedIPs = pfx("10.250.0.0/24")
	for b.Loop() {
		dl, err := computeDelta(cur, cfg, d.last)
		if err != nil || dl.peerCount() != 1 {
			b.Fatal(err, dl.peerCount())
		}
	}
}
