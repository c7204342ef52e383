package wg

import (
	"crypto/sha256"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// fuzzPriv are deterministic private keys; fuzzPub their public keys, which
// the decoded peers use too, so a peer may carry the device's own key.
var fuzzPriv, fuzzPub = func() (priv, pub [3]wgtypes.Key) {
	for i := range priv {
		priv[i] = wgtypes.Key(sha256.Sum256([]byte{'p', byte(i)}))
		pub[i] = priv[i].PublicKey()
	}
	return
}()

type wgFuzz []byte

func (b *wgFuzz) n(m int) int {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return int(c) % m
}

// peerKey is the zero key, one of the device keys' public halves, or one of
// a few other keys.
func (b *wgFuzz) peerKey() wgtypes.Key {
	switch i := b.n(8); {
	case i == 0:
		return wgtypes.Key{}
	case i <= 2:
		return fuzzPub[i]
	default:
		return wgtypes.Key(sha256.Sum256([]byte{'k', byte(i)}))
	}
}

func (b *wgFuzz) prefix() netip.Prefix {
	switch b.n(8) {
	case 0:
		return netip.Prefix{} // invalid: skipped and reported
	case 1:
		return netip.PrefixFrom(netip.AddrFrom16(netip.AddrFrom4([4]byte{10, 0, byte(b.n(2)), 0}).As16()), []int{96, 112, 120, 128, 64}[b.n(5)])
	case 2, 3:
		return netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 7: byte(b.n(3)), 15: byte(b.n(3))}), []int{0, 64, 120, 128}[b.n(4)])
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(b.n(3)), byte(b.n(3))}), []int{0, 8, 16, 24, 31, 32}[b.n(6)])
}

func (b *wgFuzz) endpoint() *net.UDPAddr {
	port := []int{51820, 51821, 0}[b.n(3)]
	switch b.n(7) {
	case 0:
		return nil
	case 1:
		return &net.UDPAddr{IP: net.IPv4zero, Port: port} // "no endpoint"
	case 2:
		return &net.UDPAddr{IP: net.ParseIP("fe80::1"), Port: port, Zone: "eth0"}
	case 3:
		return &net.UDPAddr{IP: net.ParseIP("2001:db8::" + string(rune('1'+b.n(3)))), Port: port}
	case 4:
		return &net.UDPAddr{IP: net.IPv4(198, 51, 100, byte(b.n(3))).To16(), Port: port} // 16-byte form
	}
	return &net.UDPAddr{IP: net.IPv4(198, 51, 100, byte(b.n(3))).To4(), Port: port}
}

func (b *wgFuzz) peers() []Peer {
	var ps []Peer
	for range b.n(6) {
		p := Peer{PublicKey: b.peerKey(), Endpoint: b.endpoint()}
		if b.n(3) == 0 {
			k := wgtypes.Key(sha256.Sum256([]byte{'s', byte(b.n(2))}))
			p.PresharedKey = &k
		}
		p.PersistentKeepalive = []time.Duration{0, 0, 25 * time.Second, 1500 * time.Millisecond, -time.Second}[b.n(5)]
		for range b.n(4) {
			p.AllowedIPs = append(p.AllowedIPs, b.prefix())
		}
		ps = append(ps, p)
	}
	return ps
}

func (b *wgFuzz) config() Config {
	cfg := Config{Peers: b.peers()}
	if i := b.n(4); i > 0 {
		cfg.PrivateKey = fuzzPriv[i-1]
	}
	cfg.ListenPort = []int{0, 51820, 51821, -1}[b.n(4)]
	return cfg
}

// FuzzDelta starts the fake device in a fuzzed state (written with raw
// wgtypes peer entries, plus roaming), then applies fuzzed desired configs
// through Device.Set. After each Set the device holds exactly the valid part
// of the desired config, diffing again gives an empty delta, and a repeated
// Set writes nothing.
func FuzzDelta(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{2, 1, 1, 2, 3, 1, 4, 5, 2, 3, 3, 1, 1, 1, 2, 2, 2, 2, 1, 3, 0, 1, 2, 5, 5, 5, 5, 5, 1, 1, 1, 1, 1, 2, 2})
	f.Add([]byte("\x05\x03the same allowed IP on two peers, then moved, roamed and removed"))
	f.Add([]byte{4, 3, 1, 3, 3, 3, 6, 6, 6, 6, 2, 2, 3, 2, 2, 5, 1, 1, 4, 4, 1, 0, 3, 3, 3, 3, 3, 2, 1, 0, 7, 7, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		b := wgFuzz(data)
		d, c, _ := newFake(t)

		// An arbitrary starting state, as another writer may have left it.
		start := b.config()
		raw := wgtypes.Config{ReplacePeers: true}
		if start.PrivateKey != (wgtypes.Key{}) {
			raw.PrivateKey = &start.PrivateKey
		}
		for _, p := range start.Peers {
			if p.PublicKey == (wgtypes.Key{}) {
				continue
			}
			ka := p.PersistentKeepalive
			pc := wgtypes.PeerConfig{PublicKey: p.PublicKey, PresharedKey: p.PresharedKey, Endpoint: p.Endpoint, PersistentKeepaliveInterval: &ka}
			for _, a := range p.AllowedIPs {
				if a.IsValid() {
					pc.AllowedIPs = append(pc.AllowedIPs, prefixToIPNet(a.Masked()))
				}
			}
			raw.Peers = append(raw.Peers, pc)
		}
		if err := c.ConfigureDevice(fakeName, raw); err != nil {
			t.Fatal(err)
		}

		roamed := false
		for round := range 1 + b.n(3) {
			want := b.config()
			if b.n(3) == 0 { // roaming: the device learns an endpoint
				if dev, _ := c.Device(fakeName); len(dev.Peers) > 0 {
					c.SetEndpoint(fakeName, dev.Peers[b.n(len(dev.Peers))].PublicKey, b.endpoint())
					roamed = true
				}
			}
			_ = d.Set(want) // invalid entries are reported, the rest applied
			checkDevice(t, round, c, want, !roamed)
			cur, err := c.Device(fakeName)
			if err != nil {
				t.Fatal(err)
			}
			dl, _ := computeDelta(cur, want, d.last)
			if !dl.empty() {
				t.Fatalf("round %d: delta after Set is not empty: %+v", round, dl.cfg)
			}
			c.Reset()
			_ = d.Set(want)
			if c.ConfigureCalls != 0 {
				t.Fatalf("round %d: repeating Set wrote %+v", round, c.Configs)
			}
		}
	})
}

// checkDevice checks that the device holds the valid part of want: the
// peers normalizePeers keeps, each with its allowed IPs, preshared key and
// keepalive, and (unless a peer roamed: Set leaves a roamed endpoint alone
// while the desired one is the one it last wrote) its endpoint where want
// sets a usable one.
func checkDevice(t *testing.T, round int, c *FakeClient, want Config, endpoints bool) {
	t.Helper()
	dev, err := c.Device(fakeName)
	if err != nil {
		t.Fatal(err)
	}
	if want.PrivateKey != (wgtypes.Key{}) && dev.PrivateKey != want.PrivateKey {
		t.Errorf("round %d: private key not applied", round)
	}
	if want.ListenPort > 0 && dev.ListenPort != want.ListenPort {
		t.Errorf("round %d: listen port %d, want %d", round, dev.ListenPort, want.ListenPort)
	}
	wants, _ := normalizePeers(want.Peers, dev.PublicKey)
	if len(dev.Peers) != len(wants) {
		t.Fatalf("round %d: device has %d peers, want %d", round, len(dev.Peers), len(wants))
	}
	for _, p := range dev.Peers {
		w, ok := wants[p.PublicKey]
		if !ok {
			t.Fatalf("round %d: unwanted peer %s", round, p.PublicKey)
		}
		if p.PresharedKey != w.psk || p.PersistentKeepaliveInterval != w.keepalive {
			t.Errorf("round %d: peer %s: psk/keepalive %v, want %v", round, p.PublicKey, p.PersistentKeepaliveInterval, w.keepalive)
		}
		if got := normalizeIPNets(p.AllowedIPs); !slices.Equal(got, w.allowedIPs) {
			t.Errorf("round %d: peer %s: allowed IPs %v, want %v", round, p.PublicKey, got, w.allowedIPs)
		}
		if endpoints && w.endpoint.IsValid() && udpToAddrPort(p.Endpoint) != w.endpoint {
			t.Errorf("round %d: peer %s: endpoint %v, want %v", round, p.PublicKey, p.Endpoint, w.endpoint)
		}
	}
}
