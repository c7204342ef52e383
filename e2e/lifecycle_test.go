//go:build e2e

package e2e

import (
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"meshd.io/meshd/e2e/testbed"
)

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// wgConfig is the static WireGuard configuration of meshd0 on n (public
// key, port, and per peer key, allowed IPs, keepalive), normalized.
func (s *scenario) wgConfig(n *testbed.Node) string {
	s.t.Helper()
	d, err := n.WG(s.ctx, "meshd0")
	if err != nil {
		s.t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "key=%s port=%d\n", d.PublicKey, d.ListenPort)
	var peers []string
	for _, p := range d.Peers {
		ips := append([]string(nil), p.AllowedIPs...)
		sort.Strings(ips)
		peers = append(peers, fmt.Sprintf("peer=%s allowed=%s keepalive=%s", p.PublicKey, strings.Join(ips, ","), p.Keepalive))
	}
	sort.Strings(peers)
	b.WriteString(strings.Join(peers, "\n"))
	return b.String()
}

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// pingStatistics returns how many packets the ping p (ended) sent and how
// many of them got no reply, from the statistics it printed last.
func (s *scenario) pingStatistics(p *testbed.Proc) (sent, lost int) {
	s.t.Helper()
	m := pingStats.FindStringSubmatch(testbed.Tail(p.LogPath, 5))
	if m == nil {
		s.t.Fatalf("no ping statistics in %s:\n%s", p.LogPath, testbed.Tail(p.LogPath, 10))
	}
	sent, _ = strconv.Atoi(m[1])
	rx, _ := strconv.Atoi(m[2])
	return sent, sent - rx
}

// restartDuringPing pings from -> to at 10/s for count packets while meshd
// on node restarts (SIGTERM, start again) and returns sent and lost.
func (s *scenario) restartDuringPing(node *testbed.Node, from, to *testbed.Pod, count int) (sent, lost int, took time.Duration) {
	s.t.Helper()
	p, err := from.Start("ping-restart-"+node.Name, "ping", "-n", "-i", "0.1", "-c", fmt.Sprint(count), "-W", "1", to.IP.String())
	if err != nil {
		s.t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	t0 := time.Now()
	if err := node.RestartMeshd(syscall.SIGTERM, 15*time.Second); err != nil {
		s.t.Errorf("meshd on %s did not stop cleanly on SIGTERM: %v", node.Name, err)
	}
	if err := node.WaitMeshdReady(s.ctx, 30*time.Second); err != nil {
		s.t.Fatal(err)
	}
	took = time.Since(t0)
	window := time.Duration(count)*100*time.Millisecond - 1500*time.Millisecond
	if took > window-time.Second {
		s.t.Fatalf("restart took %s, longer than the measurement window", took)
	}
	select {
	case <-p.Done():
	case <-time.After(time.Duration(count)*100*time.Millisecond + 10*time.Second):
		s.t.Fatal("ping did not finish")
	}
	sent, lost = s.pingStatistics(p)
	return sent, lost, took
}

// Scenario 5: restart without disruption. n1 runs `meshd device` as a
// separate process and meshd with --wireguard auto adopts it: a restart of
// meshd loses at most 1 of the pings at 10/s and does not reconfigure
// WireGuard. n2 uses the in-process device: traffic is back within 1 s
// (at most 10 lost).
func TestRestart(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	s.location("b", false)
	n1 := s.node(testbed.NodeOptions{Name: "n1", Location: "a"})
	n2 := s.node(testbed.NodeOptions{Name: "n2", Location: "b"})
	dev, err := n1.StartDevice(ctx, "meshd0")
	if err != nil {
		t.Fatal(err)
	}
	s.startMeshd([]*testbed.Node{n1, n2}, "--mesh-granularity", "full", "--wireguard", "auto")
	s.pingEventually(pod(n2), pod(n1).IP, 60*time.Second)
	s.pingEventually(pod(n1), pod(n2).IP, 10*time.Second)
	// Let the configuration settle (both keys published, peers complete).
	s.eventually(20*time.Second, 500*time.Millisecond, "both nodes have one peer", func() error {
		if a, b := s.wgPeerCount(n1), s.wgPeerCount(n2); a != 1 || b != 1 {
			return fmt.Errorf("peers: n1 %d, n2 %d", a, b)
		}
		return nil
	})

	t.Run("separate device", func(t *testing.T) {
		before := s.wgConfig(n1)
		sent, lost, took := s.restartDuringPing(n1, pod(n2), pod(n1), 100)
		after := s.wgConfig(n1)
		t.Logf("meshd restart on %s with a separate device: %d of %d pings lost; restart to ready %s", n1.Name, lost, sent, took.Round(time.Millisecond))
		if lost > 1 {
			t.Errorf("%d pings lost (want <= 1)", lost)
		}
		if before != after {
			t.Errorf("WireGuard configuration changed across the restart:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if dev.Exited() {
			t.Errorf("the separate device process exited: %v", dev.Err())
		}
	})

	t.Run("in-process device", func(t *testing.T) {
		sent, lost, took := s.restartDuringPing(n2, pod(n1), pod(n2), 100)
		t.Logf("meshd restart on %s with the in-process device: %d of %d pings lost (~%d ms without traffic); restart to ready %s",
			n2.Name, lost, sent, lost*100, took.Round(time.Millisecond))
		if lost > 10 {
			t.Errorf("%d pings lost (want <= 10, i.e. traffic back within 1 s)", lost)
		}
	})
}

// Scenario 6: drift. Deleting a meshd route from table 51820 and flushing
// MESHD-POSTROUTING by hand: both come back and traffic recovers without a
// restart of meshd.
func TestDrift(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	s.location("b", false)
	n1 := s.node(testbed.NodeOptions{Name: "n1", Location: "a"})
	n2 := s.node(testbed.NodeOptions{Name: "n2", Location: "b"})
	s.startMeshd([]*testbed.Node{n1, n2}, "--mesh-granularity", "full")
	s.pingEventually(pod(n1), pod(n2).IP, 60*time.Second)
	s.pingEventually(pod(n2), pod(n1).IP, 10*time.Second)

	routes := func() []string {
		out, err := n1.Exec(ctx, "ip", "route", "show", "table", "51820")
		if err != nil {
			t.Fatal(err)
		}
		l := lines(out)
		sort.Strings(l)
		return l
	}
	natRules := func() []string {
		out, err := n1.Exec(ctx, "iptables", "-t", "nat", "-S", "MESHD-POSTROUTING")
		if err != nil {
			t.Fatal(err)
		}
		return lines(out)
	}
	// Let it settle, then snapshot.
	time.Sleep(2 * time.Second)
	routesBefore, natBefore := routes(), natRules()
	var victim string
	for _, r := range routesBefore {
		if strings.HasPrefix(r, n2.PodCIDR.String()+" ") {
			victim = r
		}
	}
	if victim == "" {
		t.Fatalf("no route for %s in table 51820 on %s:\n%s", n2.PodCIDR, n1.Name, strings.Join(routesBefore, "\n"))
	}
	if len(natBefore) < 2 {
		t.Logf("note: MESHD-POSTROUTING has no rules: %v", natBefore)
	}
	pid := n1.Meshd().Pid()

	if out, err := n1.Exec(ctx, "ip", "route", "del", n2.PodCIDR.String(), "table", "51820"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if out, err := n1.Exec(ctx, "iptables", "-t", "nat", "-F", "MESHD-POSTROUTING"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t0 := time.Now()
	if err := pod(n1).Ping(ctx, pod(n2).IP, 1); err == nil {
		t.Logf("note: traffic still flowed right after the route was deleted (already repaired?)")
	}
	s.eventually(15*time.Second, 200*time.Millisecond, "route and MESHD-POSTROUTING restored", func() error {
		if r := routes(); strings.Join(r, "\n") != strings.Join(routesBefore, "\n") {
			return fmt.Errorf("table 51820:\n%s\nwant:\n%s", strings.Join(r, "\n"), strings.Join(routesBefore, "\n"))
		}
		if r := natRules(); strings.Join(r, "\n") != strings.Join(natBefore, "\n") {
			return fmt.Errorf("MESHD-POSTROUTING:\n%s\nwant:\n%s", strings.Join(r, "\n"), strings.Join(natBefore, "\n"))
		}
		return nil
	})
	t.Logf("drift repaired after %s", time.Since(t0).Round(time.Millisecond))
	s.pingEventually(pod(n1), pod(n2).IP, 5*time.Second)
	s.pingOK(pod(n2), pod(n1).IP, 3)
	if n1.Meshd().Exited() || n1.Meshd().Pid() != pid {
		t.Errorf("meshd on %s restarted", n1.Name)
	}

	// The interface itself deleted by hand: meshd opens it again (same key,
	// same peers) and restores the routes through it, without a restart.
	if out, err := n1.Exec(ctx, "ip", "link", "del", "meshd0"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t1 := time.Now()
	s.eventually(10*time.Second, 20*time.Millisecond, "routes through the new interface restored", func() error {
		if r := routes(); strings.Join(r, "\n") != strings.Join(routesBefore, "\n") {
			return fmt.Errorf("table 51820:\n%s\nwant:\n%s", strings.Join(r, "\n"), strings.Join(routesBefore, "\n"))
		}
		return nil
	})
	back := time.Since(t1)
	s.pingEventually(pod(n1), pod(n2).IP, 20*time.Second)
	t.Logf("WireGuard interface deleted: interface and routes back after %s, traffic after %s",
		back.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	if n1.Meshd().Exited() || n1.Meshd().Pid() != pid {
		t.Errorf("meshd on %s restarted", n1.Name)
	}
}

// Scenario 8: node removal. After deleting a Node object, within one resync
// its WireGuard peer, its routes and any rule mentioning it are gone from
// every other node, and the others still talk.
func TestNodeRemoval(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	s.location("b", false)
	n1 := s.node(testbed.NodeOptions{Name: "n1", Location: "a"})
	n2 := s.node(testbed.NodeOptions{Name: "n2", Location: "a"})
	n3 := s.node(testbed.NodeOptions{Name: "n3", Location: "b"})
	nodes := []*testbed.Node{n1, n2, n3}
	s.startMeshd(nodes, "--mesh-granularity", "full")
	pairs(nodes, func(a, b *testbed.Node) { s.pingEventually(pod(a), pod(b).IP, 60*time.Second) })

	key3 := s.pubKey(n3)
	wgip3 := strings.Split(s.annotation(n3, testbed.AnnotationWGIP), "/")[0]
	for _, n := range []*testbed.Node{n1, n2} {
		d, err := n.WG(ctx, "meshd0")
		if err != nil || d.Peer(key3) == nil {
			t.Fatalf("%s has no peer for n3 before the removal (%v)", n.Name, err)
		}
	}
	if err := n3.StopMeshd(syscall.SIGTERM, 15*time.Second); err != nil {
		t.Errorf("meshd on n3: %v", err)
	}
	t0 := time.Now()
	if err := tb.DeleteNode(ctx, n3.Name); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*testbed.Node{n1, n2} {
		s.eventually(5*time.Second+3*time.Second-time.Since(t0), 200*time.Millisecond, "n3 gone from "+n.Name, func() error {
			d, err := n.WG(ctx, "meshd0")
			if err != nil {
				return err
			}
			if d.Peer(key3) != nil {
				return fmt.Errorf("WireGuard peer %s still present", key3)
			}
			for _, c := range [][]string{
				{"ip", "route", "show", "table", "51820"},
				{"ip", "rule"},
				{"ip", "route"},
			} {
				out, err := n.Exec(ctx, c...)
				if err != nil {
					return err
				}
				for _, l := range lines(out) {
					if strings.Contains(l, n3.PodCIDR.String()) || (wgip3 != "" && strings.Contains(l, wgip3+" ")) {
						return fmt.Errorf("%s: %s", strings.Join(c, " "), l)
					}
				}
			}
			return nil
		})
	}
	t.Logf("n3 removed from n1 and n2 after %s", time.Since(t0).Round(time.Millisecond))
	s.pingOK(pod(n1), pod(n2).IP, 3)
	s.pingOK(pod(n2), pod(n1).IP, 3)
}
