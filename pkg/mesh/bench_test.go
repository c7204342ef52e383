package mesh

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// benchCluster is n nodes in locs locations (0 = full mesh) and peers Peers,
// each node with one IPv4 pod CIDR, an internal IP, a key and a public
// endpoint.
func benchCluster(n, locs, peers int) ([]Node, []Peer, Options) {
	nodes := make([]Node, n)
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		loc := ""
		if locs > 0 {
			loc = fmt.Sprintf("loc-%02d", i%locs)
		}
		nodes[i] = Node{
			Name:           name,
			Location:       loc,
			PublicKey:      key(name),
			Endpoint:       Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), DefaultPort)},
			PublicEndpoint: true,
			InternalIPs:    []netip.Addr{netip.AddrFrom4([4]byte{192, 168, byte(i >> 8), byte(i)})},
			PodCIDRs:       []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(16 + i>>8), byte(i), 0}), 24)},
		}
	}
	ps := make([]Peer, peers)
	for i := range ps {
		name := fmt.Sprintf("peer-%03d", i)
		ps[i] = Peer{
			Name:       name,
			PublicKey:  key(name),
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 5, byte(i >> 8), byte(i)}), 32)},
		}
		if i%2 == 0 {
			ps[i].Endpoint = Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 51820)}
			ps[i].PersistentKeepalive = 25 * time.Second
		}
	}
	opts := Options{
		MeshCIDRs:    []netip.Prefix{pfx("10.4.0.0/16")},
		ServiceCIDRs: []netip.Prefix{pfx("10.96.0.0/12")},
	}
	if locs == 0 {
		opts.Granularity = GranularityFull
	}
	return nodes, ps, opts
}

func benchBuild(b *testing.B, nodes []Node, peers []Peer, opts Options, wantPeers int) {
	local := Local{NodeName: "node-0000"}
	p, err := Build(nodes, peers, local, opts)
	if err != nil {
		b.Fatal(err)
	}
	if !p.Leader || len(p.WireGuard.Peers) != wantPeers {
		b.Fatalf("leader %v with %d peers, want %d", p.Leader, len(p.WireGuard.Peers), wantPeers)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for b.Loop() {
		if _, err := Build(nodes, peers, local, opts); err != nil {
			b.Fatal(err)
		}
	}
	// The machine is shared: CPU time per op (including GC) is a steadier
	// figure than wall time under contention.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the CPU time (user+system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPlanLocation: 1,000 nodes in 50 locations with 200 peers, planned
// for a leader.
func BenchmarkPlanLocation(b *testing.B) {
	nodes, peers, opts := benchCluster(1000, 50, 200)
	benchBuild(b, nodes, peers, opts, 49+200)
}

// BenchmarkPlanFull: 1,000 nodes in a full mesh.
func BenchmarkPlanFull(b *testing.B) {
	nodes, peers, opts := benchCluster(1000, 0, 0)
	benchBuild(b, nodes, peers, opts, 999)
}
