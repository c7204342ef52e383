//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/e2e/testbed"
)

// meshctlAdmin runs meshctl with the admin kubeconfig from an outside host
// on the WAN (an operator's workstation) and returns its stdout, stderr and
// exit code. meshctl gets no mesh flags: it takes them from what the nodes
// publish (meshd.io/settings).
func (s *scenario) meshctlAdmin(args ...string) (stdout, stderr string, code int) {
	s.t.Helper()
	if s.adminExt == nil {
		a, err := tb.AddExternal(s.ctx, "ops")
		if err != nil {
			s.t.Fatal(err)
		}
		s.adminExt = a
	}
	dir := s.t.TempDir()
	out, errf := filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr")
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	script := fmt.Sprintf("%s --kubeconfig %s %s >%s 2>%s; echo $?", meshctl(s.t), tb.Kubeconfig, strings.Join(q, " "), out, errf)
	res, err := s.adminExt.Exec(s.ctx, "bash", "-c", script)
	if err != nil {
		s.t.Fatalf("meshctl %v: %v: %s", args, err, res)
	}
	code, err = strconv.Atoi(strings.TrimSpace(res))
	if err != nil {
		s.t.Fatalf("meshctl %v: exit code %q", args, res)
	}
	o, _ := os.ReadFile(out)
	e, _ := os.ReadFile(errf)
	return string(o), string(e), code
}

// checkJSON is the part of `meshctl check -o json` the test reads.
type checkJSON struct {
	Passed, Failed int
	Pairs          []struct {
		From, To, Kind, Path, Address, FailedHop string
		OK                                       bool
		Sent, Received                           int
		Hops                                     []struct {
			Name, Detail string
			OK           bool
		}
	}
}

// TestMeshctlCheck: meshctl (without any mesh flag: the settings come from
// the nodes) proves every pair of a 2x2 location mesh reachable through
// the real path, reports the WireGuard hop between the two leaders when
// their tunnel is cut on the WAN (UDP 51820 dropped by the router, the
// probes still pass), and meshctl diagnose reports the node's plan, wg
// show, routes, rules, chains, Events and metrics, with no key in any
// output.
func TestMeshctlCheck(t *testing.T) {
	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	nodes := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "a1", Location: "a", Annotations: map[string]string{"meshd.io/leader": "true"}}),
		s.node(testbed.NodeOptions{Name: "a2", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "b1", Location: "b", Annotations: map[string]string{"meshd.io/leader": "true"}}),
		s.node(testbed.NodeOptions{Name: "b2", Location: "b"}),
	}
	// The DaemonSet listens on the node's own address; 0.0.0.0 covers it
	// and the testbed's 127.0.0.1 readiness checks.
	s.startMeshd(nodes, "--mesh-granularity", "location", "--listen", "0.0.0.0:9477")
	pairs(nodes, func(x, y *testbed.Node) { s.pingEventually(pod(x), pod(y).IP, 60*time.Second) })

	st, _, code := s.meshctlAdmin("status", "-o", "json")
	var status struct {
		SettingsFrom string
		Granularity  string
		Problems     []string
	}
	if err := json.Unmarshal([]byte(st), &status); err != nil || code != 0 || status.SettingsFrom != "published by 4 of 4 nodes" {
		t.Fatalf("meshctl status: exit %d, %+v (%v)\n%s", code, status, err, st)
	}

	// All pairs pass.
	start := time.Now()
	out, errOut, code := s.meshctlAdmin("check", "-o", "json")
	t.Logf("meshctl check of 12 pairs (3 echo requests each) took %s", time.Since(start).Round(time.Millisecond))
	var r checkJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("check -o json: %v\n%s\n%s", err, out, errOut)
	}
	if code != 0 || r.Failed != 0 || r.Passed != 12 || len(r.Pairs) != 12 {
		t.Fatalf("check: exit %d, %d passed, %d failed\n%s\n%s", code, r.Passed, r.Failed, out, errOut)
	}
	for _, p := range r.Pairs {
		if p.Received == 0 || p.Sent != 3 {
			t.Errorf("%s -> %s: %d of %d answered", p.From, p.To, p.Received, p.Sent)
		}
		if cross := p.From[0] != p.To[0]; cross != (p.Kind == "locations") || cross != strings.Contains(p.Path, "a1 => b1") && cross != strings.Contains(p.Path, "b1 => a1") {
			t.Errorf("%s -> %s: kind %s, path %s", p.From, p.To, p.Kind, p.Path)
		}
	}
	table, _, code := s.meshctlAdmin("check")
	if code != 0 || !strings.Contains(table, "12 pairs, 12 passed, 0 failed") {
		t.Errorf("check (table): exit %d\n%s", code, table)
	}
	t.Logf("meshctl check:\n%s", table)

	// Cut the tunnel between the leaders on the WAN: WireGuard's port only,
	// so the underlay probes (UDP 51821) still pass and the leaders stay.
	b1 := tb.Node("b1")
	for _, rule := range [][]string{
		{"-d", b1.IP.String(), "-p", "udp", "--dport", "51820"},
		{"-s", b1.IP.String(), "-p", "udp", "--sport", "51820"},
	} {
		if out, err := tb.RouterExec(s.ctx, append([]string{"iptables", "-I", "FORWARD"}, append(rule, "-j", "DROP")...)...); err != nil {
			t.Fatalf("cutting the tunnel: %v: %s", err, out)
		}
		// The router namespace outlives the scenario (Reset keeps it).
		t.Cleanup(func() {
			if out, err := tb.RouterExec(context.Background(), append([]string{"iptables", "-D", "FORWARD"}, append(rule, "-j", "DROP")...)...); err != nil {
				t.Errorf("removing the tunnel cut: %v: %s", err, out)
			}
		})
	}
	out, errOut, code = s.meshctlAdmin("check", "-o", "json")
	r = checkJSON{}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("check -o json: %v\n%s\n%s", err, out, errOut)
	}
	if code != 1 || r.Failed != 8 || r.Passed != 4 {
		t.Errorf("check with the tunnel cut: exit %d, %d passed, %d failed (want 8 across locations)\n%s", code, r.Passed, r.Failed, out)
	}
	for _, p := range r.Pairs {
		want := ""
		if p.Kind == "locations" {
			want = "wireguard a1 => b1"
			if p.From[0] == 'b' {
				want = "wireguard b1 => a1"
			}
		}
		if p.FailedHop != want || p.OK != (want == "") {
			t.Errorf("%s -> %s: ok %v, failed hop %q, want %q: %+v", p.From, p.To, p.OK, p.FailedHop, want, p.Hops)
		}
	}
	table, _, _ = s.meshctlAdmin("check", "--from", "a2", "--to", "b2")
	if !strings.Contains(table, "FAIL wireguard a1 => b1: packets sent into the tunnel, nothing came back") {
		t.Errorf("check a2 -> b2 does not name the broken tunnel:\n%s", table)
	}
	t.Logf("meshctl check --from a2 --to b2 with the tunnel cut:\n%s", table)

	// diagnose: one report with everything.
	start = time.Now()
	diag, errOut, code := s.meshctlAdmin("diagnose", "a1")
	t.Logf("meshctl diagnose a1 took %s, %d bytes", time.Since(start).Round(time.Millisecond), len(diag))
	for _, want := range []string{
		"Node a1: location a, leader a1, live", "PLAN", "leaders a=a1 b=b1", "WIREGUARD (wg show meshd0", s.pubKey(b1),
		"ROUTES (meshd's, in the kernel)", b1.PodCIDR.String(), "RULES", "lookup 51820", "IPTABLES", ":MESHD-", "PROBES", "b1 up",
		"EVENTS", "METRICS (meshd_*)", "meshd_wireguard_peers{kind=\"location\"} 1",
	} {
		if !strings.Contains(diag, want) {
			t.Errorf("meshctl diagnose a1 lacks %q", want)
		}
	}
	if code != 0 {
		t.Errorf("diagnose: exit %d: %s", code, errOut)
	}
	t.Logf("meshctl diagnose a1:\n%s", diag)
	dj, _, code := s.meshctlAdmin("diagnose", "b2", "-o", "json")
	var d struct {
		Node, Leader string
		State        struct {
			Ready bool
			Plan  struct {
				Leader  bool
				Leaders map[string]string
			}
			Kernel struct{ Routes []string }
		}
		Metrics []string
	}
	if err := json.Unmarshal([]byte(dj), &d); err != nil || code != 0 || d.Node != "b2" || d.Leader != "b1" || !d.State.Ready || d.State.Plan.Leader ||
		d.State.Plan.Leaders["a"] != "a1" || len(d.State.Kernel.Routes) == 0 || len(d.Metrics) == 0 {
		t.Errorf("diagnose b2 -o json: exit %d, %v\n%s", code, err, dj)
	}
	// An Event shows up in the report.
	if _, err := tb.Kube.CoreV1().Events("default").Create(s.ctx, nodeEvent("a1", "CheckE2E", "an Event of node a1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if diag2, _, _ := s.meshctlAdmin("diagnose", "a1"); !strings.Contains(diag2, "CheckE2E: an Event of node a1") {
		t.Errorf("diagnose a1 does not show the node's Event:\n%s", diag2)
	}
	s.assertNoKeyLeaked(nil, out, table, diag, dj)
}

// nodeEvent is an Event about a Node, as a component would record it.
func nodeEvent(node, reason, msg string) *corev1.Event {
	now := metav1.Now()
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: node + "-", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, APIVersion: "v1"},
		Reason:         reason, Message: msg, Type: corev1.EventTypeNormal,
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		Source: corev1.EventSource{Component: "meshd-e2e"},
	}
}

// TestMeshctlCheckLinked: with two clusters linked by meshctl link, meshctl
// check on cluster 1 proves its leader reaches cluster 2's leader through
// their WireGuard tunnel (kind "cluster"), besides its own pairs.
func TestMeshctlCheckLinked(t *testing.T) {
	s := newScenario(t, true)
	b := s.twoClusters(false)
	s.link(b)
	s.crossPing(b, 60*time.Second)
	// Cluster 1's meshd on the nodes' addresses (as the DaemonSet does).
	for _, n := range b.one {
		if err := n.StopMeshd(syscall.SIGTERM, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	s.startMeshd(b.one, "--mesh-granularity", "location", "--listen", "0.0.0.0:9477")
	s.crossPing(b, 60*time.Second)

	out, errOut, code := s.meshctlAdmin("check", "-o", "json")
	var r checkJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("check -o json: %v\n%s\n%s", err, out, errOut)
	}
	l1, l2 := s.leaderOf(b.one), s.leaderOf(b.two)
	cluster := 0
	for _, p := range r.Pairs {
		if p.Kind != "cluster" {
			continue
		}
		cluster++
		if p.From != l1.Name || p.To != "cluster cluster2: cluster-cluster2-"+l2.Name || !p.OK || p.Received == 0 {
			t.Errorf("pair to the linked cluster: %+v", p)
		}
	}
	if code != 0 || r.Failed != 0 || cluster != 1 || len(r.Pairs) != 3 {
		t.Errorf("check: exit %d, %d pairs (%d to the linked cluster), %d failed\n%s\n%s", code, len(r.Pairs), cluster, r.Failed, out, errOut)
	}
	table, _, _ := s.meshctlAdmin("check")
	t.Logf("meshctl check with a linked cluster:\n%s", table)
}
