package mesh

import (
	"crypto/sha256"
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// key is a deterministic test key for a name.
func key(name string) wgtypes.Key { return wgtypes.Key(sha256.Sum256([]byte(name))) }

// psk returns a pointer to a deterministic preshared key.
func psk(name string) *wgtypes.Key { k := key("psk-" + name); return &k }

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }
func ep(s string) Endpoint      { return Endpoint{Addr: netip.MustParseAddrPort(s)} }

// node builds a member node: key from the name, the internal IP as endpoint
// and one pod CIDR. Empty strings leave fields out.
func node(name, loc, internal, pod string, mods ...func(*Node)) Node {
	n := Node{Name: name, Location: loc, PublicKey: key(name)}
	if internal != "" {
		a := addr(internal)
		n.InternalIPs = []netip.Addr{a}
		n.Endpoint = Endpoint{Addr: netip.AddrPortFrom(a, DefaultPort)}
	}
	if pod != "" {
		n.PodCIDRs = []netip.Prefix{pfx(pod)}
	}
	for _, m := range mods {
		m(&n)
	}
	return n
}

func preferLeader(n *Node) { n.PreferLeader = true }

func public(e string) func(*Node) {
	return func(n *Node) { n.Endpoint = ep(e); n.PublicEndpoint = true }
}

func noKey(n *Node) { n.PublicKey = wgtypes.Key{} }

func noEndpoint(n *Node) { n.Endpoint = Endpoint{} }

func keepalive(d time.Duration) func(*Node) {
	return func(n *Node) { n.PersistentKeepalive = d }
}

func wgIP(ips ...string) func(*Node) {
	return func(n *Node) {
		for _, s := range ips {
			n.WireGuardIPs = append(n.WireGuardIPs, addr(s))
		}
	}
}

func alis(ps ...string) func(*Node) {
	return func(n *Node) {
		for _, s := range ps {
			n.AllowedLocationIPs = append(n.AllowedLocationIPs, pfx(s))
		}
	}
}

func extra(internal, pod string) func(*Node) {
	return func(n *Node) {
		n.InternalIPs = append(n.InternalIPs, addr(internal))
		n.PodCIDRs = append(n.PodCIDRs, pfx(pod))
	}
}

func discoveredEP(k wgtypes.Key, e string) func(*Node) {
	return func(n *Node) {
		if n.DiscoveredEndpoints == nil {
			n.DiscoveredEndpoints = map[wgtypes.Key]netip.AddrPort{}
		}
		n.DiscoveredEndpoints[k] = netip.MustParseAddrPort(e)
	}
}

func peer(name string, allowed ...string) Peer {
	p := Peer{Name: name, PublicKey: key("peer-" + name)}
	for _, s := range allowed {
		p.AllowedIPs = append(p.AllowedIPs, pfx(s))
	}
	return p
}

func v4opts() Options {
	return Options{MeshCIDRs: []netip.Prefix{pfx("10.4.0.0/16")}, ServiceCIDRs: []netip.Prefix{pfx("10.96.0.0/12")}}
}

func dualOpts() Options {
	return Options{
		MeshCIDRs:    []netip.Prefix{pfx("10.4.0.0/16"), pfx("fd4e::/64")},
		ServiceCIDRs: []netip.Prefix{pfx("10.96.0.0/12"), pfx("fd96::/108")},
	}
}

// deepCopy copies nodes and peers so that mutation can be detected.
func deepCopy(nodes []Node, peers []Peer) ([]Node, []Peer) {
	ns := slices.Clone(nodes)
	for i := range ns {
		ns[i].InternalIPs = slices.Clone(ns[i].InternalIPs)
		ns[i].WireGuardIPs = slices.Clone(ns[i].WireGuardIPs)
		ns[i].PodCIDRs = slices.Clone(ns[i].PodCIDRs)
		ns[i].AllowedLocationIPs = slices.Clone(ns[i].AllowedLocationIPs)
		ns[i].DiscoveredEndpoints = maps.Clone(ns[i].DiscoveredEndpoints)
	}
	ps := slices.Clone(peers)
	for i := range ps {
		ps[i].AllowedIPs = slices.Clone(ps[i].AllowedIPs)
		if ps[i].PresharedKey != nil {
			k := *ps[i].PresharedKey
			ps[i].PresharedKey = &k
		}
	}
	return ns, ps
}

// lastAddr is the highest address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr()
	if a.Is4() {
		b := a.As4()
		v := binary.BigEndian.Uint32(b[:])
		if hb := 32 - p.Bits(); hb > 0 {
			v |= uint32(1)<<hb - 1
		}
		binary.BigEndian.PutUint32(b[:], v)
		return netip.AddrFrom4(b)
	}
	b := a.As16()
	hi := binary.BigEndian.Uint64(b[:8])
	lo := binary.BigEndian.Uint64(b[8:])
	hb := 128 - p.Bits()
	switch {
	case hb >= 64:
		lo = ^uint64(0)
		if hb > 64 {
			hi |= uint64(1)<<(hb-64) - 1
		}
	case hb > 0:
		lo |= uint64(1)<<hb - 1
	}
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	return netip.AddrFrom16(b)
}
