//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"meshd.io/meshd/e2e/testbed"
)

// Scenario 1: full mesh of 3 nodes (in 2 locations, which full granularity
// ignores): pod-to-pod ping and a TCP transfer between every pair; every
// node's wg lists the other two with a recent handshake.
func TestFullMesh(t *testing.T) {
	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	nodes := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "n1", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "n2", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "n3", Location: "b"}),
	}
	s.startMeshd(nodes, "--mesh-granularity", "full")

	pairs(nodes, func(a, b *testbed.Node) {
		s.pingEventually(pod(a), pod(b).IP, 60*time.Second)
	})
	pairs(nodes, func(a, b *testbed.Node) {
		s.pingOK(pod(a), pod(b).IP, 3)
		if err := pod(a).Transfer(s.ctx, pod(b), pod(b).IP, 4<<20); err != nil {
			t.Errorf("TCP %s -> %s: %v", a.Name, b.Name, err)
		}
	})
	keys := map[string]string{}
	for _, n := range nodes {
		keys[n.Name] = s.pubKey(n)
	}
	for _, n := range nodes {
		s.eventually(30*time.Second, time.Second, "recent handshakes on "+n.Name, func() error {
			d, err := n.WG(s.ctx, "meshd0")
			if err != nil {
				return err
			}
			if d.PublicKey != keys[n.Name] {
				return fmt.Errorf("interface key %s, annotation %s", d.PublicKey, keys[n.Name])
			}
			if len(d.Peers) != len(nodes)-1 {
				return fmt.Errorf("%d peers, want %d", len(d.Peers), len(nodes)-1)
			}
			for _, o := range nodes {
				if o == n {
					continue
				}
				p := d.Peer(keys[o.Name])
				if p == nil {
					return fmt.Errorf("no peer for %s (%s)", o.Name, keys[o.Name])
				}
				if p.LatestHandshake.IsZero() || time.Since(p.LatestHandshake) > 3*time.Minute {
					return fmt.Errorf("peer %s: latest handshake %v", o.Name, p.LatestHandshake)
				}
				if !contains(p.AllowedIPs, o.PodCIDR.String()) {
					return fmt.Errorf("peer %s: allowed IPs %v lack %s", o.Name, p.AllowedIPs, o.PodCIDR)
				}
			}
			return nil
		})
	}
}

// Scenario 2: location mesh, 2 locations x 2 nodes. Cross-location pod
// traffic works through the leaders; within a location traffic does not
// touch WireGuard: non-leaders have no WireGuard peers, and the leaders'
// WireGuard counters do not grow during same-location traffic.
func TestLocationMesh(t *testing.T) {
	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	a := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "a1", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "a2", Location: "a"}),
	}
	b := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "b1", Location: "b"}),
		s.node(testbed.NodeOptions{Name: "b2", Location: "b"}),
	}
	all := append(append([]*testbed.Node{}, a...), b...)
	s.startMeshd(all, "--mesh-granularity", "location")

	pairs(all, func(x, y *testbed.Node) {
		s.pingEventually(pod(x), pod(y).IP, 60*time.Second)
	})
	for _, x := range a {
		for _, y := range b {
			if err := pod(x).Transfer(s.ctx, pod(y), pod(y).IP, 2<<20); err != nil {
				t.Errorf("TCP %s -> %s: %v", x.Name, y.Name, err)
			}
		}
	}

	// Exactly one node per location has WireGuard peers: its leader, with
	// the other location's leader as its single peer.
	leader := func(loc []*testbed.Node) *testbed.Node {
		var l *testbed.Node
		for _, n := range loc {
			c := s.wgPeerCount(n)
			if c > 0 {
				if l != nil {
					t.Fatalf("two nodes with WireGuard peers in location %s: %s and %s", n.Location.Name, l.Name, n.Name)
				}
				if c != 1 {
					t.Errorf("leader %s has %d peers, want 1", n.Name, c)
				}
				l = n
			}
		}
		if l == nil {
			t.Fatalf("no node with WireGuard peers in location %s", loc[0].Location.Name)
		}
		return l
	}
	la, lb := leader(a), leader(b)
	t.Logf("leaders: %s, %s", la.Name, lb.Name)

	counters := func(n *testbed.Node) int64 {
		d, err := n.WG(s.ctx, "meshd0")
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, p := range d.Peers {
			sum += p.RX + p.TX
		}
		return sum
	}
	beforeA, beforeB := counters(la), counters(lb)
	const size = 8 << 20
	for _, loc := range [][]*testbed.Node{a, b} {
		s.pingOK(pod(loc[0]), pod(loc[1]).IP, 5)
		s.pingOK(pod(loc[1]), pod(loc[0]).IP, 5)
		if err := pod(loc[0]).Transfer(s.ctx, pod(loc[1]), pod(loc[1]).IP, size); err != nil {
			t.Errorf("TCP within %s: %v", loc[0].Location.Name, err)
		}
	}
	// Keepalives and handshakes may add a little; the transfer would add
	// more than 8 MiB.
	if d := counters(la) - beforeA; d > 64<<10 {
		t.Errorf("leader %s: WireGuard counters grew by %d bytes during same-location traffic", la.Name, d)
	}
	if d := counters(lb) - beforeB; d > 64<<10 {
		t.Errorf("leader %s: WireGuard counters grew by %d bytes during same-location traffic", lb.Name, d)
	}
	for _, n := range all {
		if n != la && n != lb {
			if c := s.wgPeerCount(n); c > 0 {
				t.Errorf("non-leader %s has %d WireGuard peers", n.Name, c)
			}
		}
	}
	// Cross-location traffic still flows through the leaders' WireGuard.
	before := counters(la)
	if err := pod(a[0]).Transfer(s.ctx, pod(b[1]), pod(b[1]).IP, 1<<20); err != nil {
		t.Error(err)
	}
	if d := counters(la) - before; d < 1<<20 {
		t.Errorf("leader %s: WireGuard counters grew by only %d bytes during a 1 MiB cross-location transfer", la.Name, d)
	}
}

// Scenario 4: dual stack. IPv4 and IPv6 pod CIDRs (and mesh CIDRs); pod
// to pod ping and TCP over both families, across locations.
func TestDualStack(t *testing.T) {
	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	nodes := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "d1", Location: "a", DualStack: true}),
		s.node(testbed.NodeOptions{Name: "d2", Location: "a", DualStack: true}),
		s.node(testbed.NodeOptions{Name: "d3", Location: "b", DualStack: true}),
	}
	s.startMeshd(nodes, "--mesh-granularity", "location")
	pairs(nodes, func(x, y *testbed.Node) {
		s.pingEventually(pod(x), pod(y).IP, 60*time.Second)
		s.pingEventually(pod(x), pod(y).IP6, 30*time.Second)
	})
	pairs(nodes, func(x, y *testbed.Node) {
		if err := pod(x).Transfer(s.ctx, pod(y), pod(y).IP6, 1<<20); err != nil {
			t.Errorf("TCP over IPv6 %s -> %s: %v", x.Name, y.Name, err)
		}
		if err := pod(x).Transfer(s.ctx, pod(y), pod(y).IP, 1<<20); err != nil {
			t.Errorf("TCP over IPv4 %s -> %s: %v", x.Name, y.Name, err)
		}
	})
	for _, n := range nodes {
		ips := s.annotation(n, testbed.AnnotationWGIP)
		t.Logf("%s: %s=%s", n.Name, testbed.AnnotationWGIP, ips)
	}
}

// NAT traversal: c1 sits behind its location's NAT box (MASQUERADE), with
// only a private address; a1 and b1 have public ones. With
// meshd.io/persistent-keepalive on c1, c1 reaches both; a1 and b1 learn
// c1's NATed endpoint from its handshakes, a1 publishes it in
// meshd.io/discovered-endpoints, and traffic towards c1 keeps working
// across resyncs: meshd does not put c1's unreachable private endpoint
// back into WireGuard.
func TestNAT(t *testing.T) {
	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	natted := s.location("c", true)
	a1 := s.node(testbed.NodeOptions{Name: "a1", Location: "a"})
	b1 := s.node(testbed.NodeOptions{Name: "b1", Location: "b"})
	c1 := s.node(testbed.NodeOptions{Name: "c1", Location: "c", Annotations: map[string]string{"meshd.io/persistent-keepalive": "5"}})
	nodes := []*testbed.Node{a1, b1, c1}
	s.startMeshd(nodes, "--mesh-granularity", "full")

	keyC := s.pubKey(c1)
	for _, n := range []*testbed.Node{a1, b1} {
		s.pingEventually(pod(c1), pod(n).IP, 60*time.Second)
		s.pingEventually(pod(n), pod(c1).IP, 30*time.Second)
	}
	natEndpoint := func(n *testbed.Node) error {
		d, err := n.WG(s.ctx, "meshd0")
		if err != nil {
			return err
		}
		p := d.Peer(keyC)
		if p == nil {
			return fmt.Errorf("%s has no peer for c1", n.Name)
		}
		if host, _, _ := strings.Cut(p.Endpoint, ":"); host != natted.PublicIP.String() {
			return fmt.Errorf("%s: c1's endpoint %s, want the NAT box's %s", n.Name, p.Endpoint, natted.PublicIP)
		}
		return nil
	}
	for _, n := range []*testbed.Node{a1, b1} {
		s.eventually(10*time.Second, 250*time.Millisecond, "c1's NATed endpoint on "+n.Name, func() error { return natEndpoint(n) })
	}
	s.eventually(30*time.Second, 500*time.Millisecond, "a1 publishes c1's discovered endpoint", func() error {
		obj, err := a1.Object(s.ctx)
		if err != nil {
			return err
		}
		v := obj.Annotations["meshd.io/discovered-endpoints"]
		if !strings.Contains(v, keyC) || !strings.Contains(v, natted.PublicIP.String()+":") {
			return fmt.Errorf("meshd.io/discovered-endpoints = %q, want c1's key at %s", v, natted.PublicIP)
		}
		return nil
	})

	// Two resyncs later (5 s each in the e2e), the NATed endpoint is still
	// in use and traffic towards c1 still flows.
	time.Sleep(11 * time.Second)
	for _, n := range []*testbed.Node{a1, b1} {
		if err := natEndpoint(n); err != nil {
			t.Error(err)
		}
		s.pingOK(pod(n), pod(c1).IP, 3)
	}
	if err := pod(a1).Transfer(s.ctx, pod(c1), pod(c1).IP, 1<<20); err != nil {
		t.Errorf("TCP a1 -> c1: %v", err)
	}
}

// Full mesh with --wireguard-lazy-peers: each node's device holds no peer
// until traffic, while meshd has them all configured
// (meshd_wireguard_idle_peers 2); pod-to-pod ping and TCP between every
// pair then work, the first packet of each pair putting the peer into both
// devices (one by the packet, the other by the handshake initiation), and
// wg lists both peers with a recent handshake.
func TestFullMeshLazyPeers(t *testing.T) {
	s := newScenario(t, true)
	s.location("a", false)
	nodes := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "n1", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "n2", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "n3", Location: "a"}),
	}
	s.startMeshd(nodes, "--mesh-granularity", "full", "--wireguard-lazy-peers")
	metric := func(n *testbed.Node, name string) (float64, error) {
		text, err := n.Metrics(s.ctx)
		if err != nil {
			return 0, err
		}
		if !strings.Contains(text, "\n"+name+" ") {
			return 0, fmt.Errorf("no %s in /metrics", name)
		}
		return metricSum(text, name), nil
	}
	for _, n := range nodes {
		s.eventually(30*time.Second, 200*time.Millisecond, "every peer configured, none in the device, on "+n.Name, func() error {
			idle, err := metric(n, "meshd_wireguard_idle_peers")
			if err != nil {
				return err
			}
			if idle != 2 {
				return fmt.Errorf("meshd_wireguard_idle_peers %v, want 2", idle)
			}
			return nil
		})
		d, err := n.WG(s.ctx, "meshd0")
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Peers) != 0 {
			t.Fatalf("%s: wg lists %d peers before any traffic, want none", n.Name, len(d.Peers))
		}
	}

	pairs(nodes, func(a, b *testbed.Node) {
		s.pingEventually(pod(a), pod(b).IP, 30*time.Second)
		s.pingOK(pod(b), pod(a).IP, 3)
		if err := pod(a).Transfer(s.ctx, pod(b), pod(b).IP, 1<<20); err != nil {
			t.Errorf("TCP %s -> %s: %v", a.Name, b.Name, err)
		}
	})
	for _, n := range nodes {
		d, err := n.WG(s.ctx, "meshd0")
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Peers) != 2 {
			t.Fatalf("%s: wg lists %d peers after traffic with both others, want 2", n.Name, len(d.Peers))
		}
		for _, p := range d.Peers {
			if p.LatestHandshake.IsZero() || time.Since(p.LatestHandshake) > 3*time.Minute {
				t.Errorf("%s: peer %s: latest handshake %v", n.Name, p.PublicKey, p.LatestHandshake)
			}
		}
		idle, err := metric(n, "meshd_wireguard_idle_peers")
		if err != nil || idle != 0 {
			t.Errorf("%s: meshd_wireguard_idle_peers %v (%v), want 0", n.Name, idle, err)
		}
		if act, err := metric(n, "meshd_wireguard_peer_activations_total"); err != nil || act != 2 {
			t.Errorf("%s: meshd_wireguard_peer_activations_total %v (%v), want 2", n.Name, act, err)
		}
	}
}
