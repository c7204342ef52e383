package mesh

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// fuzzBytes hands out the fuzzer's bytes one decision at a time; once they
// run out every decision is zero, so any input decodes to some topology.
type fuzzBytes []byte

func (b *fuzzBytes) next() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

// n returns a number in [0, m).
func (b *fuzzBytes) n(m int) int { return int(b.next()) % m }

func (b *fuzzBytes) bool() bool { return b.next()&1 == 1 }

// addr4 draws from a small IPv4 universe so that collisions, containment
// and endpoints inside ranges are frequent: 10.{0,1,4,96}.x.y, 192.168.0.y
// and a public-looking 203.0.113.y.
func (b *fuzzBytes) addr4() netip.Addr {
	switch b.n(4) {
	case 0:
		return netip.AddrFrom4([4]byte{192, 168, 0, byte(b.n(8))})
	case 1:
		return netip.AddrFrom4([4]byte{203, 0, 113, byte(b.n(8))})
	}
	second := [...]byte{0, 1, 4, 96}[b.n(4)]
	return netip.AddrFrom4([4]byte{10, second, byte(b.n(4)), byte(b.n(8))})
}

// addr6 draws from fd00:0:0:{0..3}::{0..7}, 2001:db8::{0..7}, and now and
// then an IPv4-mapped address (the planner must unmap it).
func (b *fuzzBytes) addr6() netip.Addr {
	switch b.n(8) {
	case 0:
		return netip.AddrFrom16(b.addr4().As16()) // ::ffff:a.b.c.d
	case 1:
		return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(b.n(8))})
	}
	return netip.AddrFrom16([16]byte{0: 0xfd, 7: byte(b.n(4)), 15: byte(b.n(8))})
}

func (b *fuzzBytes) addr() netip.Addr {
	if b.n(3) == 0 {
		return b.addr6()
	}
	return b.addr4()
}

// prefix is a prefix of a drawn address, unmasked on purpose (the planner
// must mask), with lengths biased to the interesting ones.
func (b *fuzzBytes) prefix() netip.Prefix {
	a := b.addr()
	lens := []int{0, 8, 16, 24, 29, 30, 32}
	if a.Is6() {
		lens = []int{0, 48, 64, 120, 125, 126, 128}
		if a.Is4In6() {
			lens = []int{96, 120, 128}
		}
	}
	bits := lens[b.n(len(lens))]
	if b.n(8) == 0 {
		bits = b.n(a.BitLen() + 1)
	}
	return netip.PrefixFrom(a, bits)
}

func (b *fuzzBytes) endpoint() Endpoint {
	port := []uint16{DefaultPort, 51821, 0}[b.n(3)]
	switch b.n(6) {
	case 0:
		return Endpoint{}
	case 1:
		return Endpoint{Host: fmt.Sprintf("n%d.example.org", b.n(3)), Addr: netip.AddrPortFrom(netip.Addr{}, port)}
	}
	return Endpoint{Addr: netip.AddrPortFrom(b.addr(), port)}
}

// fuzzKey is one of a few deterministic keys (collisions on purpose); 0 is
// the zero key.
func (b *fuzzBytes) key(kind string) wgtypes.Key {
	i := b.n(9)
	if i == 0 {
		return wgtypes.Key{}
	}
	if i == 8 { // shares its first five bytes with key 7: the slow paths
		k := key(kind + "7")
		k[31] ^= 1
		return k
	}
	return key(fmt.Sprintf("%s%d", kind, i))
}

// decodeTopology turns fuzz bytes into nodes, peers and options.
func decodeTopology(data []byte) ([]Node, []Peer, Options, map[string]bool) {
	b := fuzzBytes(data)
	flags := b.next()
	opts := Options{LocalRoutes: flags&1 != 0}
	if flags&2 != 0 {
		opts.Granularity = GranularityFull
	}
	switch (flags >> 2) & 3 {
	case 0:
		opts.MeshCIDRs = []netip.Prefix{pfx("10.4.0.0/16")}
	case 1:
		opts.MeshCIDRs = []netip.Prefix{pfx("fd4e::/64")}
	case 2:
		opts.MeshCIDRs = []netip.Prefix{pfx("10.4.0.0/29"), pfx("fd4e::/125")} // tiny: exhaustion
	default:
		opts.MeshCIDRs = []netip.Prefix{pfx("10.4.0.0/16"), pfx("fd4e::/64")}
	}
	if flags&16 != 0 {
		opts.ServiceCIDRs = []netip.Prefix{pfx("10.96.0.0/12"), pfx("fd96::/108")}
	}
	nn := 1 + b.n(7)
	nodes := make([]Node, nn)
	for i := range nodes {
		n := &nodes[i]
		n.Name = string(rune('a' + b.n(8))) // duplicates possible
		if i == 0 {
			n.Name = "a"
		}
		n.Location = []string{"", "x", "y", "z"}[b.n(4)]
		n.PublicKey = b.key("node")
		f := b.next()
		if f&1 != 0 {
			n.InternalIPs = append(n.InternalIPs, b.addr4())
		}
		if f&2 != 0 {
			n.InternalIPs = append(n.InternalIPs, b.addr6())
		}
		if f&4 != 0 {
			n.Endpoint = b.endpoint()
			n.PublicEndpoint = b.bool()
		} else if len(n.InternalIPs) > 0 {
			n.Endpoint = Endpoint{Addr: netip.AddrPortFrom(n.InternalIPs[0], DefaultPort)}
		}
		for range b.n(3) {
			n.PodCIDRs = append(n.PodCIDRs, b.prefix())
		}
		if f&8 != 0 {
			n.WireGuardIPs = append(n.WireGuardIPs, b.addr())
		}
		if f&16 != 0 {
			for range 1 + b.n(2) {
				n.AllowedLocationIPs = append(n.AllowedLocationIPs, b.prefix())
			}
		}
		if f&32 != 0 {
			n.PreferLeader = true
		}
		if f&64 != 0 {
			n.PersistentKeepalive = time.Duration(b.n(3)) * 10 * time.Second
		}
		if f&128 != 0 {
			n.DiscoveredEndpoints = map[wgtypes.Key]netip.AddrPort{}
			for range 1 + b.n(2) {
				n.DiscoveredEndpoints[b.key("node")] = netip.AddrPortFrom(b.addr(), uint16(51820+b.n(2)))
			}
		}
	}
	peers := make([]Peer, b.n(4))
	for i := range peers {
		p := &peers[i]
		p.Name = fmt.Sprintf("p%d", b.n(3))
		p.PublicKey = b.key([]string{"peer", "node"}[b.n(2)]) // sometimes a node's key
		for range b.n(4) {
			p.AllowedIPs = append(p.AllowedIPs, b.prefix())
		}
		p.Endpoint = b.endpoint()
		if b.bool() {
			p.PresharedKey = psk(p.Name)
		}
		p.PersistentKeepalive = time.Duration(b.n(2)) * 25 * time.Second
	}
	var live map[string]bool
	if flags&32 != 0 {
		live = map[string]bool{}
		for _, n := range nodes {
			live[n.Name] = b.bool()
		}
	}
	return nodes, peers, opts, live
}

// FuzzBuildMesh decodes a small dual-stack topology with endpoints (DNS
// names, IPv4, IPv6, mapped addresses), duplicates and overlaps, builds the
// plan of every node and checks what every plan must hold, whatever the
// input: see checkFuzzPlan. Besides, all nodes agree on leaders and mesh IPs,
// the plan does not depend on the input order and the input is not modified.
func FuzzBuildMesh(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x0c, 3, 0, 1, 2, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add([]byte("\x1f\x05a location mesh with peers, endpoints and pods in both families"))
	f.Add([]byte{0x3e, 6, 1, 1, 1, 0x07, 2, 3, 4, 1, 5, 6, 2, 1, 0, 3, 0x17, 4, 2, 2, 2, 2, 3, 2, 1, 1, 3, 3, 3, 3, 1, 0, 0, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		nodes, peers, opts, live := decodeTopology(data)
		inNodes, inPeers := deepCopy(nodes, peers)
		var names []string
		for _, n := range nodes {
			if !slices.Contains(names, n.Name) {
				names = append(names, n.Name)
			}
		}
		// Nodes that see the same members agree on leaders and mesh IPs
		// (the members differ when a node without a published key, or one
		// whose key another node also has, is the local one). Duplicate
		// names, which the API server never gives, are exempt: which
		// duplicate wins may depend on who looks.
		views := map[string]*Plan{}
		agree := len(names) == len(nodes)
		for _, name := range names {
			local := Local{NodeName: name, Live: live}
			p, err := Build(nodes, peers, local, opts)
			if err != nil {
				t.Fatalf("Build for %s: %v", name, err)
			}
			if !reflect.DeepEqual(nodes, inNodes) || !reflect.DeepEqual(peers, inPeers) {
				t.Fatalf("Build for %s modified its input", name)
			}
			topo, err := NewTopology(nodes, peers, local, opts)
			if err != nil {
				t.Fatal(err)
			}
			checkFuzzPlan(t, name, p, topo)
			var members []string
			for _, m := range topo.members {
				members = append(members, m.n.Name)
			}
			view := fmt.Sprint(members)
			if first, ok := views[view]; !ok {
				views[view] = p
			} else if agree {
				if !reflect.DeepEqual(p.Leaders, first.Leaders) {
					t.Errorf("nodes disagree on leaders: %v vs %v", p.Leaders, first.Leaders)
				}
				if !reflect.DeepEqual(p.MeshIPs, first.MeshIPs) {
					t.Errorf("nodes disagree on mesh IPs: %v vs %v", p.MeshIPs, first.MeshIPs)
				}
			}
			// The same input in another order gives the same plan.
			sn, sp := deepCopy(nodes, peers)
			rng := rand.New(rand.NewPCG(uint64(len(data)), 7))
			rng.Shuffle(len(sn), func(i, j int) { sn[i], sn[j] = sn[j], sn[i] })
			rng.Shuffle(len(sp), func(i, j int) { sp[i], sp[j] = sp[j], sp[i] })
			q, err := Build(sn, sp, local, opts)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, q) {
				t.Errorf("plan of %s depends on the input order:\n%s\n---\n%s", name, p, q)
			}
			if t.Failed() {
				t.FailNow()
			}
		}
	})
}

// checkFuzzPlan checks the invariants of one node's plan.
func checkFuzzPlan(t *testing.T, local string, p *Plan, topo *Topology) {
	t.Helper()
	checkPlan(t, p)
	o := topo.Options

	// Every WireGuard endpoint the plan uses, and the node's own addresses.
	var endpoints []netip.Addr
	for _, pe := range p.WireGuard.Peers {
		if pe.Endpoint.Addr.IsValid() {
			endpoints = append(endpoints, pe.Endpoint.Addr.Addr())
		}
		if pe.PublicKey == (wgtypes.Key{}) {
			t.Errorf("%s: peer %s has no key", local, pe.Name)
		}
	}
	var lm *Node
	for i := range topo.members {
		if topo.members[i].n.Name == local {
			lm = topo.members[i].n
		}
	}
	if lm == nil {
		t.Fatalf("%s: local node is not a member", local)
	}
	var self []netip.Addr
	for _, a := range lm.InternalIPs {
		self = append(self, normAddr(a))
	}
	self = append(self, p.MeshIPs[local]...)
	var pods []netip.Prefix
	for _, c := range lm.PodCIDRs {
		if c, ok := normPrefix(c); ok {
			pods = append(pods, c)
		}
	}

	// Mesh IPs: inside the mesh CIDR of their family, host addresses, at
	// most one per family; the interface carries the local ones.
	for n, ips := range p.MeshIPs {
		var fams [2]int
		for _, a := range ips {
			fams[family(a)]++
			c := topo.opts.mesh[family(a)]
			if !c.Contains(a) || a == c.Addr() || a == lastAddr(c) {
				t.Errorf("%s: mesh IP %v of %s is not a host address of %v", local, a, n, c)
			}
		}
		if fams[v4] > 1 || fams[v6] > 1 {
			t.Errorf("%s: %s has mesh IPs %v", local, n, ips)
		}
	}
	var wantAddrs []netip.Prefix
	for _, a := range p.MeshIPs[local] {
		wantAddrs = append(wantAddrs, hostPrefix(a))
	}
	if !slices.Equal(p.WireGuard.Addresses, wantAddrs) {
		t.Errorf("%s: interface addresses %v, want %v", local, p.WireGuard.Addresses, wantAddrs)
	}

	// Leaders: one per location, a member of it; the plan's own flag agrees.
	for _, seg := range topo.Segments {
		if p.Leaders[seg.Location] != seg.Leader || !slices.Contains(seg.Nodes, seg.Leader) {
			t.Errorf("%s: location %s: leader %q of %v", local, seg.Location, p.Leaders[seg.Location], seg.Nodes)
		}
	}
	if len(p.Leaders) != len(topo.Segments) {
		t.Errorf("%s: %d leaders for %d locations", local, len(p.Leaders), len(topo.Segments))
	}
	if p.Leader != (p.Leaders[p.Location] == local) {
		t.Errorf("%s: Leader=%v but the leader of %s is %s", local, p.Leader, p.Location, p.Leaders[p.Location])
	}
	if !p.Leader && len(p.WireGuard.Peers) != 0 {
		t.Errorf("%s: not a leader but has %d WireGuard peers", local, len(p.WireGuard.Peers))
	}

	var used [2]bool
	for i, r := range p.Routes {
		d := r.Dst
		used[family(d.Addr())] = true
		if d != d.Masked() || d.Addr().Is4In6() || d.Addr().Zone() != "" {
			t.Errorf("%s: route destination %v is not normalized", local, d)
		}
		if i > 0 && comparePrefix(p.Routes[i-1].Dst, d) >= 0 {
			t.Errorf("%s: routes not sorted: %v before %v", local, p.Routes[i-1].Dst, d)
		}
		if r.Table != o.RouteTable {
			t.Errorf("%s: route %v in table %d", local, r, r.Table)
		}
		// No route covers a WireGuard endpoint: the tunnel's own packets
		// would be routed into the tunnel.
		for _, e := range endpoints {
			if d.Contains(e) {
				t.Errorf("%s: route %v covers WireGuard endpoint %v", local, r, e)
			}
		}
		// Nor the node itself.
		for _, a := range self {
			if d.Contains(a) {
				t.Errorf("%s: route %v covers the node's own address %v", local, r, a)
			}
		}
		for _, c := range pods {
			if d.Overlaps(c) {
				t.Errorf("%s: route %v overlaps the node's pod CIDR %v", local, r, c)
			}
		}
		if r.Device != "" {
			// A route into the tunnel goes to exactly one peer that has it
			// as an allowed IP.
			if !p.Leader || r.Device != o.Interface {
				t.Errorf("%s: route %v into the interface, leader=%v", local, r, p.Leader)
			}
			owners := 0
			for _, pe := range p.WireGuard.Peers {
				if slices.Contains(pe.AllowedIPs, d) {
					owners++
				}
			}
			if owners != 1 {
				t.Errorf("%s: route %v is an allowed IP of %d peers", local, r, owners)
			}
		} else {
			// A route via a gateway goes to another node's internal IP.
			if slices.Contains(self, r.Gateway) {
				t.Errorf("%s: route %v via the node itself", local, r)
			}
			if family(r.Gateway) != family(d.Addr()) {
				t.Errorf("%s: route %v via a gateway of the other family", local, r)
			}
			found := false
			for _, n := range topo.nodes {
				for _, a := range n.InternalIPs {
					found = found || normAddr(a) == r.Gateway
				}
			}
			if !found {
				t.Errorf("%s: route %v via an address that is no node's internal IP", local, r)
			}
		}
	}
	var wantRules []Rule
	for f, u := range used {
		if u {
			wantRules = append(wantRules, Rule{Priority: o.RulePriority, Table: o.RouteTable, IPv6: f == v6})
		}
	}
	if !slices.Equal(p.Rules, wantRules) {
		t.Errorf("%s: rules %v, want %v", local, p.Rules, wantRules)
	}

	// A leader routes every allowed IP of its peers unless it covers the
	// node itself (then a warning says so).
	if p.Leader {
		for _, pe := range p.WireGuard.Peers {
			for _, a := range pe.AllowedIPs {
				if a != a.Masked() {
					t.Errorf("%s: allowed IP %v of %s is not masked", local, a, pe.Name)
				}
				if !slices.ContainsFunc(p.Routes, func(r Route) bool { return r.Dst == a }) && !coversSelf(a, self, pods) {
					t.Errorf("%s: allowed IP %v of %s is not routed", local, a, pe.Name)
				}
			}
		}
	}
}

func coversSelf(d netip.Prefix, self []netip.Addr, pods []netip.Prefix) bool {
	return slices.ContainsFunc(self, d.Contains) || slices.ContainsFunc(pods, d.Overlaps)
}

// TestNoRouteCoversEndpoint is the readable form of what FuzzBuildMesh found:
// a pod CIDR or a Peer's allowed IP containing a WireGuard endpoint is
// dropped, reported once, and never routed.
func TestNoRouteCoversEndpoint(t *testing.T) {
	nodes := []Node{
		node("a", "x", "192.168.0.1", "10.1.1.0/24"),
		node("b", "y", "192.168.1.1", "203.0.113.0/24", public("203.0.113.5:51820")),
		node("c", "y", "192.168.1.2", "203.0.113.0/24"), // the same pod CIDR again
	}
	p := peer("p", "198.51.100.0/24", "10.9.0.0/24")
	p.Endpoint = ep("198.51.100.1:51820")
	plan, err := Build(nodes, []Peer{p}, Local{NodeName: "a"}, v4opts())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range plan.Routes {
		for _, e := range []string{"203.0.113.5", "198.51.100.1"} {
			if r.Dst.Contains(addr(e)) {
				t.Errorf("route %v covers endpoint %s", r, e)
			}
		}
	}
	if !slices.ContainsFunc(plan.Routes, func(r Route) bool { return r.Dst == pfx("10.9.0.0/24") }) {
		t.Errorf("the peer's other allowed IP is not routed: %v", plan.Routes)
	}
	want := []string{
		"203.0.113.0/24 of location y contains WireGuard endpoint 203.0.113.5; dropped from y",
		"allowed IP 198.51.100.0/24 of peer p contains WireGuard endpoint 198.51.100.1; dropped from peer p",
	}
	for _, w := range want {
		if n := slices.Index(plan.Warnings, w); n < 0 || slices.Index(plan.Warnings[n+1:], w) >= 0 {
			t.Errorf("want warning %q once, got %q", w, plan.Warnings)
		}
	}
}
