//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"meshd.io/meshd/e2e/testbed"
)

// Kernel WireGuard scenarios. The development host has no wireguard module,
// so they run only inside the VM that `make e2e-kernel` boots
// (hack/e2e-kernel.sh), which sets E2E_KERNEL=1 and E2E_WIREGUARD=kernel
// (so TestFullMesh, TestLocationMesh and TestDrift run on kernel devices
// there too).

func requireKernelScenario(t *testing.T) {
	t.Helper()
	if os.Getenv("E2E_KERNEL") != "1" {
		t.Skip("kernel WireGuard scenario: runs in the VM of `make e2e-kernel` (E2E_KERNEL=1)")
	}
}

// linkType is the kind of meshd0 on n: "wireguard" (kernel) or "tun"
// (userspace), from `ip -d link show meshd0`.
func (s *scenario) linkType(n *testbed.Node) string {
	s.t.Helper()
	out, err := n.Exec(s.ctx, "ip", "-d", "link", "show", "meshd0")
	if err != nil {
		s.t.Fatalf("ip -d link show meshd0 on %s: %v\n%s", n.Name, err, out)
	}
	ls := lines(out)
	if len(ls) < 3 {
		s.t.Fatalf("ip -d link show meshd0 on %s:\n%s", n.Name, out)
	}
	return strings.Fields(ls[2])[0]
}

func (s *scenario) linkIndex(n *testbed.Node) string {
	s.t.Helper()
	out, err := n.Exec(s.ctx, "cat", "/sys/class/net/meshd0/ifindex")
	if err != nil {
		s.t.Fatalf("meshd0 on %s: %v %s", n.Name, err, out)
	}
	return strings.TrimSpace(out)
}

// record logs, for the test log, the kernel, `ip -d link show meshd0` and
// `wg show meshd0` of n.
func (s *scenario) record(n *testbed.Node) {
	s.t.Helper()
	for _, c := range [][]string{{"uname", "-r"}, {"ip", "-d", "link", "show", "meshd0"}, {"wg", "show", "meshd0"}} {
		out, err := n.Exec(s.ctx, c...)
		if err != nil {
			s.t.Fatalf("%s on %s: %v\n%s", strings.Join(c, " "), n.Name, err, out)
		}
		s.t.Logf("%s on %s:\n%s", strings.Join(c, " "), n.Name, strings.TrimRight(out, "\n"))
	}
}

// --wireguard auto creates a kernel link when the module is there: `ip -d
// link` shows a wireguard link, wg(8) reads it over generic netlink (no UAPI
// socket), meshd reports the kernel kind, and pods talk through it.
func TestKernelAuto(t *testing.T) {
	requireKernelScenario(t)
	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	n1 := s.node(testbed.NodeOptions{Name: "n1", Location: "a"})
	n2 := s.node(testbed.NodeOptions{Name: "n2", Location: "b"})
	nodes := []*testbed.Node{n1, n2}
	s.startMeshd(nodes, "--mesh-granularity", "full", "--wireguard", "auto")
	pairs(nodes, func(a, b *testbed.Node) { s.pingEventually(pod(a), pod(b).IP, 60*time.Second) })
	for _, n := range nodes {
		if typ := s.linkType(n); typ != "wireguard" {
			t.Errorf("%s: meshd0 is a %q link with --wireguard auto, want wireguard", n.Name, typ)
		}
		if _, err := os.Stat(n.Dir + "/run/wireguard/meshd0.sock"); err == nil {
			t.Errorf("%s: a UAPI socket exists: the userspace device was started", n.Name)
		}
		if log := testbed.Tail(n.MeshdLog(), 400); !strings.Contains(log, "wireguard=kernel") {
			t.Errorf("%s: meshd's log does not report wireguard=kernel:\n%s", n.Name, testbed.Tail(n.MeshdLog(), 30))
		}
	}
	s.eventually(30*time.Second, time.Second, "n1 has a handshake with n2", func() error {
		d, err := n1.WG(s.ctx, "meshd0")
		if err != nil {
			return err
		}
		if len(d.Peers) != 1 || d.Peers[0].LatestHandshake.IsZero() {
			return fmt.Errorf("peers %+v", d.Peers)
		}
		return nil
	})
	if err := pod(n1).Transfer(s.ctx, pod(n2), pod(n2).IP, 1<<20); err != nil {
		t.Errorf("TCP n1 -> n2: %v", err)
	}
	s.record(n1)
}

// The reason users want kernel mode: meshd restarts (SIGTERM, start again)
// while the kernel device outlives it. Under a 10 pps ping (from 2 s before
// the restart to 3 s after the new meshd is ready) nothing is lost,
// the interface is the same link (same index), and its WireGuard
// configuration (key, port, peers, allowed IPs, keepalives) is unchanged.
func TestKernelRestart(t *testing.T) {
	requireKernelScenario(t)
	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	n1 := s.node(testbed.NodeOptions{Name: "n1", Location: "a"})
	n2 := s.node(testbed.NodeOptions{Name: "n2", Location: "b"})
	s.startMeshd([]*testbed.Node{n1, n2}, "--mesh-granularity", "full", "--wireguard", "kernel")
	s.pingEventually(pod(n2), pod(n1).IP, 60*time.Second)
	s.pingEventually(pod(n1), pod(n2).IP, 10*time.Second)
	s.eventually(20*time.Second, 500*time.Millisecond, "both nodes have one peer", func() error {
		if a, b := s.wgPeerCount(n1), s.wgPeerCount(n2); a != 1 || b != 1 {
			return fmt.Errorf("peers: n1 %d, n2 %d", a, b)
		}
		return nil
	})
	if typ := s.linkType(n1); typ != "wireguard" {
		t.Fatalf("meshd0 on n1 is a %q link, want wireguard", typ)
	}
	before, index := s.wgConfig(n1), s.linkIndex(n1)
	sent, lost, took := s.restartUnderPing(n1, pod(n2), pod(n1))
	after := s.wgConfig(n1)
	t.Logf("meshd restart on %s with the kernel device: %d of %d pings lost; restart to ready %s", n1.Name, lost, sent, took.Round(time.Millisecond))
	if lost != 0 {
		t.Errorf("%d pings lost across the restart (want 0: the kernel device outlives meshd)", lost)
	}
	if before != after {
		t.Errorf("WireGuard configuration changed across the restart:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if i := s.linkIndex(n1); i != index {
		t.Errorf("meshd0 was re-created across the restart (index %s, before %s)", i, index)
	}
	s.pingOK(pod(n1), pod(n2).IP, 3)
}

// A mixed mesh: kernel nodes and userspace nodes in one full mesh, in the
// same location and across locations; every pod pair talks (ping and TCP)
// and each node's link is the kind it was asked for.
func TestKernelMixedMesh(t *testing.T) {
	requireKernelScenario(t)
	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	k1 := s.node(testbed.NodeOptions{Name: "k1", Location: "a"})
	u1 := s.node(testbed.NodeOptions{Name: "u1", Location: "a"})
	k2 := s.node(testbed.NodeOptions{Name: "k2", Location: "b"})
	u2 := s.node(testbed.NodeOptions{Name: "u2", Location: "b"})
	nodes := []*testbed.Node{k1, u1, k2, u2}
	mode := map[*testbed.Node]string{k1: "kernel", k2: "kernel", u1: "userspace", u2: "userspace"}
	for _, n := range nodes {
		if err := n.StartMeshd("--mesh-granularity", "full", "--wireguard", mode[n]); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := n.WaitMeshdReady(s.ctx, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	pairs(nodes, func(a, b *testbed.Node) { s.pingEventually(pod(a), pod(b).IP, 60*time.Second) })
	pairs(nodes, func(a, b *testbed.Node) {
		if err := pod(a).Transfer(s.ctx, pod(b), pod(b).IP, 1<<20); err != nil {
			t.Errorf("TCP %s -> %s: %v", a.Name, b.Name, err)
		}
	})
	want := map[string]string{"kernel": "wireguard", "userspace": "tun"}
	for _, n := range nodes {
		if typ := s.linkType(n); typ != want[mode[n]] {
			t.Errorf("%s (--wireguard %s): meshd0 is a %q link, want %q", n.Name, mode[n], typ, want[mode[n]])
		}
		if c := s.wgPeerCount(n); c != len(nodes)-1 {
			t.Errorf("%s: %d peers, want %d", n.Name, c, len(nodes)-1)
		}
	}
}

// restartUnderPing pings from -> to at 10/s from 2 s before meshd on node
// restarts (SIGTERM, start again) until 3 s after the new meshd is ready,
// and returns how many pings were sent and lost. Unlike restartDuringPing it
// has no fixed count, so a slow restart (the VM emulates its CPU, on a
// shared machine) never outlasts the measurement.
func (s *scenario) restartUnderPing(node *testbed.Node, from, to *testbed.Pod) (sent, lost int, took time.Duration) {
	s.t.Helper()
	p, err := from.Start("ping-kernel-restart-"+node.Name, "ping", "-n", "-i", "0.1", "-W", "1", to.IP.String())
	if err != nil {
		s.t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	t0 := time.Now()
	if err := node.RestartMeshd(syscall.SIGTERM, 30*time.Second); err != nil {
		s.t.Errorf("meshd on %s did not stop cleanly on SIGTERM: %v", node.Name, err)
	}
	if err := node.WaitMeshdReady(s.ctx, 60*time.Second); err != nil {
		s.t.Fatal(err)
	}
	took = time.Since(t0)
	time.Sleep(3 * time.Second)
	if err := p.Signal(syscall.SIGINT); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(15 * time.Second):
		s.t.Fatal("ping did not exit on SIGINT")
	}
	// Count up to the last answered ping: SIGINT ends ping with the echo it
	// sent last still in flight, which its statistics count as lost.
	answered := answeredSeqs(p.LogPath)
	for n := range answered {
		sent = max(sent, n)
	}
	lost = sent - len(answered)
	if sent < 30 {
		s.t.Fatalf("only %d pings answered up to the last one across the restart:\n%s", sent, testbed.Tail(p.LogPath, 10))
	}
	if lost != 0 {
		s.t.Logf("lost icmp_seq %s (seq n is sent n×100 ms after the ping started)", lostRanges(p.LogPath, sent))
	}
	return sent, lost, took
}
