package mesh

import (
	"errors"
	"flag"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

type planCase struct {
	name  string
	nodes []Node
	peers []Peer
	local Local
	opts  Options
}

// twoByTwo is location x = {a, b}, location y = {c, d}.
func twoByTwo(mods map[string][]func(*Node)) []Node {
	return []Node{
		node("a", "x", "192.168.0.1", "10.1.1.0/24", mods["a"]...),
		node("b", "x", "192.168.0.2", "10.1.2.0/24", mods["b"]...),
		node("c", "y", "172.16.0.3", "10.1.3.0/24", mods["c"]...),
		node("d", "y", "172.16.0.4", "10.1.4.0/24", mods["d"]...),
	}
}

func planCases() []planCase {
	full := v4opts()
	full.Granularity = GranularityFull
	localRoutes := v4opts()
	localRoutes.LocalRoutes = true
	custom := v4opts()
	custom.Port, custom.Interface, custom.RouteTable, custom.RulePriority = 4000, "wg9", 100, 1000
	dual := dualOpts()
	dual.LocalRoutes = true
	dualNodes := []Node{
		node("a", "x", "192.168.0.1", "10.1.1.0/24", extra("fd00::1", "fd10:1::/64")),
		node("b", "x", "192.168.0.2", "10.1.2.0/24", extra("fd00::2", "fd10:2::/64")),
		node("c", "y", "172.16.0.3", "10.1.3.0/24", extra("fd00::3", "fd10:3::/64")),
		node("d", "y", "172.16.0.4", "10.1.4.0/24"), // v4 only
	}
	return []planCase{
		{name: "full-3", opts: full, local: Local{NodeName: "b"}, nodes: []Node{
			node("a", "x", "192.168.0.1", "10.1.1.0/24"),
			node("b", "x", "192.168.0.2", "10.1.2.0/24"),
			node("c", "", "192.168.0.3", "10.1.3.0/24"),
		}},
		{name: "location-leader", opts: v4opts(), local: Local{NodeName: "a"}, nodes: twoByTwo(nil)},
		{name: "location-member", opts: v4opts(), local: Local{NodeName: "b"}, nodes: twoByTwo(nil)},
		{name: "location-member-localroutes", opts: localRoutes, local: Local{NodeName: "b"}, nodes: twoByTwo(nil)},
		{name: "location-leader-localroutes-custom", opts: func() Options {
			o := custom
			o.LocalRoutes = true
			return o
		}(), local: Local{NodeName: "a"}, nodes: twoByTwo(nil)},
		{name: "leader-preferred", opts: v4opts(), local: Local{NodeName: "b"},
			nodes: twoByTwo(map[string][]func(*Node){"b": {preferLeader}, "d": {preferLeader}, "c": {public("203.0.113.3:51820")}})},
		{name: "leader-public-endpoint", opts: v4opts(), local: Local{NodeName: "a"},
			nodes: twoByTwo(map[string][]func(*Node){"d": {public("203.0.113.4:51820")}})},
		{name: "leader-dead", opts: v4opts(),
			local: Local{NodeName: "b", Live: map[string]bool{"b": true, "c": true, "d": true}},
			nodes: twoByTwo(map[string][]func(*Node){"a": {preferLeader}, "d": {preferLeader}})},
		{name: "leader-all-dead", opts: v4opts(),
			local: Local{NodeName: "a", Live: map[string]bool{"a": true, "b": true}},
			nodes: twoByTwo(nil)},
		{name: "sparse-nodes", opts: v4opts(), local: Local{NodeName: "a"}, nodes: []Node{
			node("a", "", "192.168.0.1", "10.1.1.0/24", noKey),
			node("b", "", "192.168.0.2", "10.1.2.0/24", noEndpoint),
			node("c", "", "192.168.0.3", "10.1.3.0/24", noKey),
			{Name: "d"},
			{Name: "e", PublicKey: key("e")},
			{},
		}},
		{name: "sparse-local", opts: v4opts(), local: Local{NodeName: "z"}, nodes: []Node{
			node("a", "", "192.168.0.1", "10.1.1.0/24"),
			{Name: "z"},
		}},
		{name: "peers-leader", opts: v4opts(), local: Local{NodeName: "a"}, nodes: twoByTwo(nil), peers: []Peer{
			func() Peer { p := peer("laptop", "10.5.0.1/32"); p.PersistentKeepalive = 25 * time.Second; return p }(),
			func() Peer {
				p := peer("office", "10.6.0.0/24", "10.6.1.7/24", "10.6.0.128/25")
				p.Endpoint, p.PresharedKey = ep("198.51.100.7:51820"), psk("office")
				return p
			}(),
			func() Peer { p := peer("dns", "10.7.0.1/32"); p.Endpoint = Endpoint{Host: "vpn.example.com"}; return p }(),
			{Name: "nokey", AllowedIPs: []netip.Prefix{pfx("10.8.0.0/24")}},
			peer("overlap-pods", "10.1.3.0/25", "10.9.0.0/24"),
			peer("overlap-peer", "10.6.0.5/32"),
			{Name: "zz-dupkey", PublicKey: key("peer-laptop")},
		}},
		{name: "peers-member", opts: v4opts(), local: Local{NodeName: "b"}, nodes: twoByTwo(nil), peers: []Peer{
			peer("laptop", "10.5.0.1/32"),
			func() Peer { p := peer("office", "10.6.0.0/24"); p.Endpoint = ep("198.51.100.7:51820"); return p }(),
		}},
		{name: "dual-stack-leader", opts: dual, local: Local{NodeName: "a"}, nodes: dualNodes},
		{name: "dual-stack-member", opts: dual, local: Local{NodeName: "b"}, nodes: dualNodes,
			peers: []Peer{peer("laptop", "10.5.0.1/32", "fd05::1/128")}},
		{name: "dual-stack-leader-v4-only", opts: dual, local: Local{NodeName: "c"},
			nodes: append(dualNodes[:3:3], node("d", "y", "172.16.0.4", "10.1.4.0/24", preferLeader))},
		{name: "allowed-location-ips", opts: v4opts(), local: Local{NodeName: "a"},
			nodes: twoByTwo(map[string][]func(*Node){
				"a": {alis("192.168.10.0/24", "10.20.0.0/16")},
				"b": {alis("192.168.10.128/25")},
				"c": {alis("192.168.10.0/23", "10.20.5.0/24", "10.30.0.0/16", "10.1.0.0/16")},
				"d": {alis("172.16.0.0/24")},
			}),
			peers: []Peer{peer("laptop", "10.30.1.1/32", "10.5.0.1/32")}},
		{name: "discovered-endpoint", opts: v4opts(), local: Local{NodeName: "a"},
			nodes: twoByTwo(map[string][]func(*Node){
				"a": {discoveredEP(key("c"), "198.51.100.3:40000"), keepalive(10 * time.Second)},
				"b": {discoveredEP(key("c"), "198.51.100.3:40001")},
				"c": {keepalive(25 * time.Second)},
				"d": {discoveredEP(key("c"), "198.51.100.3:40001"), discoveredEP(key("e"), "198.51.100.5:1")},
			})},
		{name: "discovered-no-endpoint", opts: full, local: Local{NodeName: "a"}, nodes: []Node{
			node("a", "", "192.168.0.1", "10.1.1.0/24", discoveredEP(key("b"), "198.51.100.2:51820")),
			node("b", "", "192.168.0.2", "10.1.2.0/24", noEndpoint),
			node("c", "", "192.168.0.3", "10.1.3.0/24", noEndpoint),
		}},
		{name: "published-mesh-ips", opts: v4opts(), local: Local{NodeName: "b"}, nodes: twoByTwo(map[string][]func(*Node){
			"a": {wgIP("10.4.0.10")},
			"b": {wgIP("10.4.0.10")},    // collision: a keeps it
			"c": {wgIP("10.5.0.1")},     // outside the CIDR
			"d": {wgIP("10.4.255.255")}, // broadcast
		})},
		{name: "localroutes-missing-internal-ip", opts: localRoutes, local: Local{NodeName: "a"}, nodes: []Node{
			node("a", "x", "192.168.0.1", "10.1.1.0/24", preferLeader),
			node("b", "x", "", "10.1.2.0/24"),                   // no internal IP at all
			node("c", "x", "192.168.0.3", "10.1.3.0/24", noKey), // not a member
			node("d", "x", "192.168.0.4", "10.1.4.0/24", extra("fd00::4", "fd10:4::/64")),
		}},
		{name: "duplicates", opts: v4opts(), local: Local{NodeName: "a"}, nodes: []Node{
			node("a", "x", "192.168.0.1", "10.1.1.0/24"),
			node("b", "y", "192.168.0.2", "10.1.2.0/24"),
			node("b", "y", "192.168.0.9", "10.1.9.0/24"),
			node("c", "y", "192.168.0.3", "10.1.2.0/24", func(n *Node) { n.PublicKey = key("b") }),
			node("d", "z", "192.168.0.4", "10.1.2.0/24"),
		}},
	}
}

func TestBuildGolden(t *testing.T) {
	for _, c := range planCases() {
		t.Run(c.name, func(t *testing.T) {
			p, err := Build(c.nodes, c.peers, c.local, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			got := p.String()
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if got != string(want) {
				t.Errorf("plan differs from %s (run go test -update and review the diff):\n%s", path, got)
			}
		})
	}
}

// TestBuildInvariants checks every golden case for order independence,
// untouched inputs and internal consistency.
func TestBuildInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range planCases() {
		t.Run(c.name, func(t *testing.T) {
			nodes, peers := deepCopy(c.nodes, c.peers)
			want, err := Build(c.nodes, c.peers, c.local, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(nodes, c.nodes) || !reflect.DeepEqual(peers, c.peers) {
				t.Fatal("Build modified its input")
			}
			for range 5 {
				rng.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
				rng.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
				got, err := Build(nodes, peers, c.local, c.opts)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("shuffled input gives another plan:\n%s\nwant:\n%s", got, want)
				}
			}
			checkPlan(t, want)
		})
	}
}

// checkPlan verifies structural properties every plan must have.
func checkPlan(t *testing.T, p *Plan) {
	t.Helper()
	seen := map[netip.Addr]string{}
	for n, ips := range p.MeshIPs {
		for _, a := range ips {
			if o, dup := seen[a]; dup {
				t.Errorf("mesh IP %v given to %s and %s", a, o, n)
			}
			seen[a] = n
		}
	}
	for i := 1; i < len(p.WireGuard.Peers); i++ {
		a, b := p.WireGuard.Peers[i-1].PublicKey, p.WireGuard.Peers[i].PublicKey
		if string(a[:]) >= string(b[:]) {
			t.Errorf("peers not sorted by key")
		}
	}
	owner := map[netip.Prefix]string{}
	for _, pe := range p.WireGuard.Peers {
		for i, a := range pe.AllowedIPs {
			if o, dup := owner[a]; dup {
				t.Errorf("allowed IP %v on peers %s and %s", a, o, pe.Name)
			}
			owner[a] = pe.Name
			if i > 0 && (pe.AllowedIPs[i-1].Overlaps(a) || comparePrefix(pe.AllowedIPs[i-1], a) >= 0) {
				t.Errorf("allowed IPs of %s not sorted and disjoint: %v", pe.Name, pe.AllowedIPs)
			}
		}
	}
	dsts := map[netip.Prefix]bool{}
	for _, r := range p.Routes {
		if dsts[r.Dst] {
			t.Errorf("two routes to %v", r.Dst)
		}
		dsts[r.Dst] = true
		if (r.Device == "") == !r.Gateway.IsValid() {
			t.Errorf("route %v needs exactly one of device and gateway", r)
		}
	}
}

func TestBuildErrors(t *testing.T) {
	nodes := []Node{node("a", "", "192.168.0.1", "10.1.1.0/24")}
	cases := []struct {
		name  string
		local string
		opts  Options
		want  error
	}{
		{"no mesh cidr", "a", Options{}, ErrInvalidOptions},
		{"two v4 cidrs", "a", Options{MeshCIDRs: []netip.Prefix{pfx("10.4.0.0/16"), pfx("10.5.0.0/16")}}, ErrInvalidOptions},
		{"tiny cidr", "a", Options{MeshCIDRs: []netip.Prefix{pfx("10.4.0.0/31")}}, ErrInvalidOptions},
		{"invalid cidr", "a", Options{MeshCIDRs: []netip.Prefix{{}}}, ErrInvalidOptions},
		{"granularity", "a", Options{MeshCIDRs: v4opts().MeshCIDRs, Granularity: "zone"}, ErrInvalidOptions},
		{"port", "a", Options{MeshCIDRs: v4opts().MeshCIDRs, Port: 70000}, ErrInvalidOptions},
		{"table", "a", Options{MeshCIDRs: v4opts().MeshCIDRs, RouteTable: 254}, ErrInvalidOptions},
		{"interface", "a", Options{MeshCIDRs: v4opts().MeshCIDRs, Interface: "a-very-long-interface"}, ErrInvalidOptions},
		{"missing local", "zz", v4opts(), ErrLocalNodeNotFound},
		{"empty local", "", v4opts(), ErrLocalNodeNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Build(nodes, nil, Local{NodeName: c.local}, c.opts)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	// IPv6-only is fine.
	if _, err := Build(nodes, nil, Local{NodeName: "a"}, Options{MeshCIDRs: []netip.Prefix{pfx("fd4e::/64")}}); err != nil {
		t.Fatal(err)
	}
}

func TestDefaults(t *testing.T) {
	p, err := Build([]Node{node("a", "", "192.168.0.1", "10.1.1.0/24"), node("b", "", "192.168.0.2", "10.1.2.0/24")},
		nil, Local{NodeName: "a"}, Options{MeshCIDRs: v4opts().MeshCIDRs})
	if err != nil {
		t.Fatal(err)
	}
	if p.WireGuard.ListenPort != DefaultPort || len(p.Routes) == 0 || p.Routes[0].Device != DefaultInterface ||
		p.Routes[0].Table != DefaultRouteTable || p.Rules[0] != (Rule{Priority: DefaultRulePriority, Table: DefaultRouteTable}) {
		t.Fatalf("defaults not applied:\n%s", p)
	}
}

// meshIP returns the local node's mesh IP of the family of cidr.
func meshIPOf(t *testing.T, nodes []Node, local string, opts Options) []netip.Addr {
	t.Helper()
	p, err := Build(nodes, nil, Local{NodeName: local}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p.MeshIPs[local]
}

func TestMeshIPsStable(t *testing.T) {
	opts := dualOpts()
	var nodes []Node
	for i := range 40 {
		nodes = append(nodes, node(string(rune('a'+i%26))+strings.Repeat("x", i/26), "", "", ""))
	}
	const local = "m"
	base := meshIPOf(t, nodes, local, opts)
	if len(base) != 2 {
		t.Fatalf("want one address per family, got %v", base)
	}
	// Other nodes come and go: the local (unpublished, hashed) address holds
	// as long as nobody claims it; published addresses always hold.
	for _, sub := range [][]Node{nodes[13:20], nil, append(nodes[:3:3], nodes[20:]...)} {
		sub = append(sub[:len(sub):len(sub)], nodes[12]) // "m"
		if got := meshIPOf(t, sub, local, opts); !reflect.DeepEqual(got, base) {
			t.Fatalf("local mesh IP changed from %v to %v with %d nodes", base, got, len(sub))
		}
	}
	// Once published, the address survives even a newcomer whose hash
	// lands on it.
	published := append([]Node(nil), nodes...)
	for i := range published {
		p, err := Build(nodes, nil, Local{NodeName: published[i].Name}, opts)
		if err != nil {
			t.Fatal(err)
		}
		published[i].WireGuardIPs = p.MeshIPs[published[i].Name]
	}
	before, err := Build(published, nil, Local{NodeName: local}, opts)
	if err != nil {
		t.Fatal(err)
	}
	for n, ips := range before.MeshIPs {
		for i := range published {
			if published[i].Name == n && !reflect.DeepEqual(published[i].WireGuardIPs, ips) {
				t.Fatalf("%s: published %v, allocated %v", n, published[i].WireGuardIPs, ips)
			}
		}
	}
	more := append(published[:len(published):len(published)], node("newcomer", "", "", ""))
	after, err := Build(more, nil, Local{NodeName: local}, opts)
	if err != nil {
		t.Fatal(err)
	}
	for n, ips := range before.MeshIPs {
		if !reflect.DeepEqual(after.MeshIPs[n], ips) {
			t.Fatalf("%s moved from %v to %v", n, ips, after.MeshIPs[n])
		}
	}
}

func TestMeshIPCollision(t *testing.T) {
	nodes := []Node{
		node("b", "", "", "", wgIP("10.4.0.7")),
		node("a", "", "", "", wgIP("10.4.0.7")),
	}
	ips := meshIPOf(t, nodes, "b", v4opts())
	a := meshIPOf(t, nodes, "a", v4opts())
	if a[0] != addr("10.4.0.7") || ips[0] == addr("10.4.0.7") {
		t.Fatalf("a should keep 10.4.0.7: a=%v b=%v", a, ips)
	}
	// The hash probes past taken addresses: a tiny pool fills up exactly.
	small := Options{MeshCIDRs: []netip.Prefix{pfx("10.4.0.0/29")}} // 6 hosts
	var six []Node
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		six = append(six, node(n, "", "", ""))
	}
	p, err := Build(six, nil, Local{NodeName: "a"}, small)
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, p)
	if len(p.MeshIPs) != 6 || len(p.Warnings) != 0 {
		t.Fatalf("want 6 addresses, no warnings:\n%s", p)
	}
	seven := append(six, node("g", "", "", ""))
	if p, err = Build(seven, nil, Local{NodeName: "a"}, small); err != nil {
		t.Fatal(err)
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "exhausted") {
		t.Fatalf("want an exhaustion warning:\n%s", p)
	}
}

func TestMeshIPProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	opts := Options{MeshCIDRs: []netip.Prefix{pfx("10.4.0.0/26"), pfx("fd4e::/120")}}
	for iter := range 200 {
		n := 1 + rng.IntN(70)
		var nodes []Node
		for i := range n {
			nd := node("n"+strings.Repeat("x", rng.IntN(3))+string(rune('a'+rng.IntN(26)))+string(rune('a'+i%26)), "", "", "")
			if rng.IntN(2) == 0 {
				nd.WireGuardIPs = []netip.Addr{
					netip.AddrFrom4([4]byte{10, 4, 0, byte(rng.IntN(70))}),
					netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x4e, 15: byte(rng.IntN(256))}),
				}
			}
			nodes = append(nodes, nd)
		}
		p, err := Build(nodes, nil, Local{NodeName: nodes[0].Name}, opts)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, p)
		for name, ips := range p.MeshIPs {
			for _, a := range ips {
				c := opts.MeshCIDRs[family(a)]
				if !c.Contains(a) || a == c.Addr() || a == lastAddr(c) {
					t.Fatalf("iteration %d: %s got %v outside the hosts of %v", iter, name, a, c)
				}
			}
		}
	}
}

func TestTopologyPeerConfig(t *testing.T) {
	nodes := twoByTwo(map[string][]func(*Node){"c": {alis("10.50.0.0/16")}})
	laptop := peer("laptop", "10.5.0.1/32", "fd05::1/128")
	laptop.PresharedKey = psk("laptop")
	laptop.PersistentKeepalive = 25 * time.Second
	topo, err := NewTopology(nodes, []Peer{laptop}, Local{}, v4opts())
	if err != nil {
		t.Fatal(err)
	}
	if topo.LocalSegment != -1 || len(topo.Segments) != 2 {
		t.Fatalf("unexpected topology %+v", topo)
	}
	cfg, err := topo.PeerConfig("laptop")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Addresses, []netip.Prefix{pfx("10.5.0.1/32"), pfx("fd05::1/128")}) {
		t.Errorf("addresses %v", cfg.Addresses)
	}
	if len(cfg.Peers) != 2 {
		t.Fatalf("want one peer per segment, got %d", len(cfg.Peers))
	}
	y := cfg.Peers[1]
	want := []netip.Prefix{pfx("10.1.3.0/24"), pfx("10.1.4.0/24"), topo.Segments[1].AllowedIPs[2], topo.Segments[1].AllowedIPs[3], pfx("10.50.0.0/16"), pfx("172.16.0.4/32")}
	if y.Name != "y" || y.PublicKey != key("c") || y.Endpoint != ep("172.16.0.3:51820") ||
		y.PersistentKeepalive != 25*time.Second || y.PresharedKey == nil || *y.PresharedKey != *laptop.PresharedKey ||
		!reflect.DeepEqual(y.AllowedIPs, want) {
		t.Errorf("segment y as seen by the laptop: %+v\nwant allowed %v", y, want)
	}
	wantConf := "[Interface]\nAddress = 10.5.0.1/32, fd05::1/128\n\n[Peer]\n# x\nPublicKey = " + key("a").String() +
		"\nPresharedKey = " + laptop.PresharedKey.String() + "\nEndpoint = 192.168.0.1:51820\nAllowedIPs = " +
		joinPrefixesSep(topo.Segments[0].AllowedIPs, ", ") + "\nPersistentKeepalive = 25\n"
	if got := cfg.String(); !strings.HasPrefix(got, wantConf) || !strings.Contains(got, "# y\n") {
		t.Errorf("wg-quick rendering:\n%s\nwant prefix:\n%s", got, wantConf)
	}
	if _, err := topo.PeerConfig("nobody"); err == nil {
		t.Error("unknown peer accepted")
	}
	// The config is a copy.
	cfg.Peers[0].AllowedIPs[0] = pfx("1.2.3.4/32")
	if topo.Segments[0].AllowedIPs[0] == pfx("1.2.3.4/32") {
		t.Error("PeerConfig shares memory with the topology")
	}
}

func TestTopologySegmentAsPeer(t *testing.T) {
	nodes := twoByTwo(map[string][]func(*Node){"c": {keepalive(5 * time.Second)}})
	topo, err := NewTopology(nodes, nil, Local{NodeName: "b"}, v4opts())
	if err != nil {
		t.Fatal(err)
	}
	p, ok := topo.SegmentAsPeer("c")
	if !ok {
		t.Fatal("c leads y")
	}
	if p.Name != "c" || p.PublicKey != key("c") || p.Endpoint != ep("172.16.0.3:51820") ||
		p.PersistentKeepalive != 5*time.Second || !reflect.DeepEqual(p.AllowedIPs, topo.Segments[1].AllowedIPs) {
		t.Errorf("unexpected peer %+v", p)
	}
	for _, n := range []string{"b", "d", "nobody"} {
		if _, ok := topo.SegmentAsPeer(n); ok {
			t.Errorf("%s does not lead a segment", n)
		}
	}
	// Round trip: cluster 1's leader as a Peer of cluster 2.
	other := []Node{node("z", "", "10.200.0.1", "10.201.0.0/24")}
	p2, err := Build(other, []Peer{p}, Local{NodeName: "z"}, Options{MeshCIDRs: []netip.Prefix{pfx("10.202.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(p2.WireGuard.Peers) != 1 || !reflect.DeepEqual(p2.WireGuard.Peers[0].AllowedIPs, p.AllowedIPs) {
		t.Errorf("cluster 2 does not peer with c:\n%s", p2)
	}
}

func TestOutsideConfigFromNoKeyLeader(t *testing.T) {
	// A segment whose only member is the local node without a key is skipped.
	nodes := []Node{node("a", "", "192.168.0.1", "10.1.1.0/24", noKey), node("b", "", "192.168.0.2", "10.1.2.0/24")}
	topo, err := NewTopology(nodes, []Peer{peer("laptop", "10.5.0.1/32")}, Local{NodeName: "a"}, v4opts())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := topo.PeerConfig("laptop")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Peers) != 1 || cfg.Peers[0].Name != "b" {
		t.Fatalf("want only b: %+v", cfg.Peers)
	}
	if _, ok := topo.SegmentAsPeer("a"); ok {
		t.Fatal("a has no key")
	}
}

func TestSortU64(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 255, 256, 1000, 5000} {
		ks := make([]uint64, n)
		for i := range ks {
			switch i % 3 {
			case 0:
				ks[i] = rng.Uint64()
			case 1:
				ks[i] = rng.Uint64() & 0xff00ff
			default:
				ks[i] = uint64(rng.IntN(10)) << 56
			}
		}
		want := slices.Clone(ks)
		slices.Sort(want)
		sortU64(ks)
		if !slices.Equal(ks, want) {
			t.Fatalf("n=%d: radix sort differs", n)
		}
	}
}

func TestDuplicateKeys(t *testing.T) {
	// Keys sharing their first bytes exercise the slow path of dedupeKeys.
	k := func(last byte) wgtypes.Key { var k wgtypes.Key; k[0], k[31] = 7, last; return k }
	withKey := func(kk wgtypes.Key) func(*Node) { return func(n *Node) { n.PublicKey = kk } }
	nodes := []Node{
		node("a", "", "192.168.0.1", "10.1.1.0/24", withKey(k(3))),
		node("b", "", "192.168.0.2", "10.1.2.0/24", withKey(k(1))),
		node("c", "", "192.168.0.3", "10.1.3.0/24", withKey(k(1))), // same as b
		node("d", "", "192.168.0.4", "10.1.4.0/24", withKey(k(2))),
		node("e", "", "192.168.0.5", "10.1.5.0/24", withKey(k(3))), // same as a
	}
	peers := []Peer{{Name: "p", PublicKey: k(2)}, {Name: "q", PublicKey: k(4)}, {Name: "r", PublicKey: k(4)}}
	p, err := Build(nodes, peers, Local{NodeName: "e"}, v4opts())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"node a has the same public key as node e; ignored",
		"node c has the same public key as node b; ignored",
		"peer p has the same public key as node d; ignored",
		"peer r has the same public key as peer q; ignored",
	}
	if !reflect.DeepEqual(p.Warnings, want) {
		t.Fatalf("warnings %q, want %q", p.Warnings, want)
	}
	var names []string
	for _, pe := range p.WireGuard.Peers {
		names = append(names, pe.Name)
	}
	slices.Sort(names)
	if !reflect.DeepEqual(names, []string{"b", "d", "q"}) {
		t.Fatalf("peers %v", names)
	}
}

func FuzzBuild(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(0))
	f.Add([]byte("some arbitrary bytes for nodes and peers"), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, flags uint8) {
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		var nodes []Node
		var peers []Peer
		for len(data) > 0 && len(nodes) < 20 {
			b := next()
			n := Node{Name: string(rune('a' + b%8)), Location: string(rune('a' + next()%3))}
			if b&8 != 0 {
				n.PublicKey = key(n.Name + string(rune(next()%4)))
			}
			if b&16 != 0 {
				n.InternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 0, next() % 8})}
			}
			if b&32 != 0 {
				n.PodCIDRs = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, next() % 4, next() % 4, 0}), 16+int(next()%16))}
			}
			if b&64 != 0 {
				n.WireGuardIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 4, 0, next() % 8}), netip.AddrFrom16([16]byte{0: 0xfd, 15: next()})}
				n.AllowedLocationIPs = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{next(), next(), 0, 0}), int(next()%33))}
			}
			if b&128 != 0 {
				n.Endpoint = Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 168, 0, next() % 8}), 51820)}
				n.PreferLeader = next()%2 == 0
				n.PersistentKeepalive = time.Duration(next()%3) * time.Second
				n.DiscoveredEndpoints = map[wgtypes.Key]netip.AddrPort{key(string(rune('a' + next()%8))): netip.AddrPortFrom(netip.AddrFrom4([4]byte{1, 2, 3, next()}), 1)}
			}
			nodes = append(nodes, n)
			if b%5 == 0 {
				p := Peer{Name: string(rune('p' + next()%4)), AllowedIPs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, next() % 8, 0, 0}), int(next()%33))}}
				if next()%4 != 0 {
					p.PublicKey = key("peer" + string(rune(next()%4)))
				}
				peers = append(peers, p)
			}
		}
		if len(nodes) == 0 {
			return
		}
		opts := Options{MeshCIDRs: []netip.Prefix{pfx("10.4.0.0/29"), pfx("fd00::/125")}, LocalRoutes: flags&1 != 0}
		if flags&2 != 0 {
			opts.Granularity = GranularityFull
		}
		var live map[string]bool
		if flags&4 != 0 {
			live = map[string]bool{"a": true, "c": true}
		}
		p, err := Build(nodes, peers, Local{NodeName: nodes[0].Name, Live: live}, opts)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, p)
		_ = p.String()
	})
}

// TestUsesDiscoveredEndpoint: the nodes whose discovered endpoints every
// node publishes, and the only ones the plan reaches at one.
func TestUsesDiscoveredEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    Node
		want bool
	}{
		{"an endpoint, no keepalive", node("a", "", "192.168.0.1", ""), false},
		{"an endpoint and a keepalive: behind NAT", node("a", "", "192.168.0.1", "", keepalive(25*time.Second)), true},
		{"no endpoint", node("a", "", "", ""), true},
		{"no key", func() Node { n := node("a", "", "", ""); n.PublicKey = wgtypes.Key{}; return n }(), false},
	} {
		if got := UsesDiscoveredEndpoint(&tc.n); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNodeCloneSharesNothing: every slice and map field of a Node is copied
// by Clone (a field added later and forgotten fails here).
func TestNodeCloneSharesNothing(t *testing.T) {
	var n Node
	v := reflect.ValueOf(&n).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Map:
			m := reflect.MakeMap(f.Type())
			m.SetMapIndex(reflect.Zero(f.Type().Key()), reflect.Zero(f.Type().Elem()))
			f.Set(m)
		case reflect.Pointer, reflect.Chan, reflect.Func, reflect.Interface:
			t.Errorf("field %s (%s): Clone does not know how to copy it", v.Type().Field(i).Name, f.Kind())
		}
	}
	c := n.Clone()
	if !reflect.DeepEqual(c, n) {
		t.Fatalf("clone differs: %+v, want %+v", c, n)
	}
	cv := reflect.ValueOf(c)
	for i := range v.NumField() {
		if k := v.Field(i).Kind(); (k == reflect.Slice || k == reflect.Map) && v.Field(i).Pointer() == cv.Field(i).Pointer() {
			t.Errorf("field %s is shared with the clone", v.Type().Field(i).Name)
		}
	}
}
