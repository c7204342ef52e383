package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	meshdfake "meshd.io/meshd/pkg/k8s/client/clientset/versioned/fake"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/nodestate"
)

// fakeNodes plays meshd's debug endpoints on the fixture's nodes: every
// node routes the mesh CIDR, the leaders eu-1 and us-1 are each other's
// WireGuard peer, and pings are answered unless the tunnel is broken (then
// the leaders' devices send and receive nothing back).
type fakeNodes struct {
	mu     sync.Mutex
	broken bool
	// noPods is a node without routes to the other location's pods.
	noPods  string
	tx, rx  int64
	pinged  []string
	metrics string
}

func (f *fakeNodes) get(_ context.Context, _ *connect.Clients, node string, port int, path string, q url.Values) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if port != defaultMeshdPort {
		return nil, fmt.Errorf("port %d", port)
	}
	switch path {
	case "/metrics":
		return []byte(f.metrics), nil
	case nodestate.PathPing:
		f.pinged = append(f.pinged, node+">"+q.Get("to"))
		p := nodestate.Ping{From: node, Source: "10.4.0.9", To: q.Get("to"), Sent: 3, Received: 3, RTTs: []float64{0.5, 0.4, 0.6}}
		cross := strings.HasPrefix(node, "eu") == (q.Get("to") == "10.4.139.156" || q.Get("to") == "10.4.145.79")
		if f.broken && cross {
			p.Received, p.RTTs = 0, nil
			f.tx += 148
		} else if cross {
			f.tx, f.rx = f.tx+148, f.rx+148
		}
		return json.Marshal(p)
	case nodestate.PathState:
	default:
		return nil, fmt.Errorf("no %s", path)
	}
	hs := now.Add(-30 * time.Second)
	s := nodestate.State{Node: node, Version: "test", Time: now, Ready: true, Readiness: "ok",
		Kernel: nodestate.Kernel{Routes: []string{"10.4.0.0/16 table 51820 ifindex 7 proto 109 metric 0", "unreachable 10.0.0.0/8 table 51820 proto 109 metric 4278190080"},
			Rules: []string{"ipv4 rule pref 51820 lookup 51820 proto 109"}, IPTables: []string{"*nat", ":MESHD-POSTROUTING - [0:0]"}},
		Probes:    nodestate.Probes{Port: 51821, Targets: map[string]string{}},
		WireGuard: nodestate.WireGuard{Interface: "meshd0", Kind: "userspace", PublicKey: "pub"},
		Plan:      &nodestate.Plan{Location: "eu", Leaders: map[string]string{"eu": "eu-1", "us": "us-1"}},
	}
	if node != f.noPods {
		s.Kernel.Routes = append(s.Kernel.Routes, "10.0.0.0/12 table 51820 dev meshd0 proto 109 metric 0")
	}
	peer := map[string]string{"eu-1": pub(3).String(), "us-1": pub(1).String()}[node]
	if peer != "" {
		s.WireGuard.Peers = []nodestate.WGPeer{{PublicKey: peer, Name: "x", Endpoint: "198.51.100.1:51820", LastHandshake: &hs, TransmitBytes: f.tx, ReceiveBytes: f.rx}}
		s.Probes.Targets[map[string]string{"eu-1": "us-1", "us-1": "eu-1"}[node]] = "up"
	}
	return json.Marshal(s)
}

func checkRun(t *testing.T, f *fakeNodes, args ...string) (result, checkReport) {
	t.Helper()
	kube, md := healthyClients()
	r := runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = f.get }, append([]string{"check", "--no-linked", "-o", "json"}, args...)...)
	var rep checkReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v\n%s\n%s", err, r.stdout, r.stderr)
	}
	return r, rep
}

func TestCheckPasses(t *testing.T) {
	f := &fakeNodes{}
	r, rep := checkRun(t, f)
	// eu-1, eu-2, us-1, us-2 are members (us-3 has no key): 12 pairs.
	if r.code != 0 || rep.Passed != 12 || rep.Failed != 0 || len(rep.Pairs) != 12 || len(f.pinged) != 12 {
		t.Fatalf("exit %d, %d passed, %d failed, %d pings\n%s", r.code, rep.Passed, rep.Failed, len(f.pinged), r.stdout)
	}
	if len(rep.Skipped) != 1 || !strings.HasPrefix(rep.Skipped[0], "node us-3: not a mesh member") {
		t.Errorf("skipped %q", rep.Skipped)
	}
	for _, p := range rep.Pairs {
		if p.From == "eu-2" && p.To == "us-1" {
			if p.Path != "eu-2 -> eu-1 => us-1" || p.Kind != "locations" || p.Address != "10.4.139.156" {
				t.Errorf("eu-2 -> us-1: %+v", p)
			}
			var names []string
			for _, h := range p.Hops {
				names = append(names, h.Name)
			}
			if got := strings.Join(names, ","); got != "meshd eu-2,route eu-2,pod routes eu-2,underlay eu-2 -> eu-1,underlay eu-1 -> us-1,wireguard eu-1 => us-1,route back us-1,echo" {
				t.Errorf("hops %s", got)
			}
		}
		if p.From == "us-2" && p.To == "us-1" && (p.Kind != "location" || p.Path != "us-2 -> us-1" || p.Hops[1].Name != "lease us-2" || p.Hops[1].OK) {
			t.Errorf("us-2 (stale Lease) -> us-1: %+v", p)
		}
	}
}

func TestCheckNamesBrokenTunnel(t *testing.T) {
	f := &fakeNodes{broken: true, tx: 1000, rx: 1000}
	r, rep := checkRun(t, f, "--from", "eu-2", "--to", "us-1,eu-1")
	if r.code != 1 || rep.Passed != 1 || rep.Failed != 1 || !strings.Contains(r.stderr, "check: 1 of 2 pairs failed") {
		t.Fatalf("exit %d, %d passed, %d failed: %s\n%s", r.code, rep.Passed, rep.Failed, r.stderr, r.stdout)
	}
	var bad checkPair
	for _, p := range rep.Pairs {
		if !p.OK {
			bad = p
		}
	}
	if bad.To != "us-1" || bad.FailedHop != "wireguard eu-1 => us-1" || bad.Received != 0 {
		t.Fatalf("failed pair %+v", bad)
	}
	kube, md := healthyClients()
	r = runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = f.get }, "check", "--no-linked", "--from", "eu-2", "--to", "us-1")
	for _, want := range []string{
		"1 pairs, 0 passed, 1 failed",
		"eu-2  us-1  eu-2 -> eu-1 => us-1  10.4.139.156  FAIL    -    wireguard eu-1 => us-1",
		"FAIL wireguard eu-1 => us-1: packets sent into the tunnel, nothing came back: endpoint 198.51.100.1:51820, latest handshake 30s ago, during the check 148 B sent, 0 B received",
		"ok   underlay eu-1 -> us-1: probes up",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestCheckRouteHop(t *testing.T) {
	s := &nodestate.State{Kernel: nodestate.Kernel{Routes: []string{"unreachable 10.4.0.0/16 table 51820 proto 109 metric 1", "10.4.1.0/24 table 51820 via 198.51.100.2 proto 109 metric 0"}}}
	if ok, _ := routeCovers(s, netip.MustParseAddr("10.4.1.7")); !ok {
		t.Error("10.4.1.7 has a route")
	}
	if ok, d := routeCovers(s, netip.MustParseAddr("10.4.2.7")); ok || !strings.Contains(d, "fail-closed") {
		t.Errorf("10.4.2.7: %v %s", ok, d)
	}
	if ok, d := routeCovers(s, netip.MustParseAddr("10.9.0.1")); ok || !strings.Contains(d, "no route") {
		t.Errorf("10.9.0.1: %v %s", ok, d)
	}
}

func TestCheckBadFlags(t *testing.T) {
	kube, md := healthyClients()
	f := &fakeNodes{}
	for _, args := range [][]string{{"check", "--count", "0"}, {"check", "-o", "dot"}} {
		if r := runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = f.get }, args...); r.code != 2 {
			t.Errorf("%v: exit %d: %s", args, r.code, r.stderr)
		}
	}
	// An unknown node is a failure like everywhere else (docs/meshctl.md:
	// exit 1), not a bad invocation.
	for _, args := range [][]string{{"check", "--from", "nope"}, {"check", "--to", "eu-1,nope"}} {
		r := runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = f.get }, args...)
		if want := `node "nope" not found; known nodes: eu-1, eu-2, us-1, us-2, us-3`; r.code != 1 || !strings.Contains(r.stderr, want) || r.stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and %q", args, r.code, r.stdout, r.stderr, want)
		}
	}
}

func TestDiagnoseReport(t *testing.T) {
	kube, md := healthyClients()
	if _, err := kube.CoreV1().Events("default").Create(context.Background(), &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "e1", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "eu-1"}, Type: "Warning", Reason: "PlanWarning", Message: "overlap",
		LastTimestamp: metav1.NewTime(now.Add(-time.Minute)),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := &fakeNodes{metrics: "# HELP meshd_up x\nmeshd_up 1\ngo_goroutines 9\nmeshd_wireguard_peers{kind=\"location\"} 1\n"}
	r := runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = f.get }, "diagnose", "eu-1")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"Node eu-1: location eu, leader eu-1, live", "Lease renewed 5s ago; probe report: up -, down -",
		"WIREGUARD (wg show meshd0, userspace)", "peer " + pub(3).String() + " (x): endpoint 198.51.100.1:51820, latest handshake 30s ago",
		"ROUTES (meshd's, in the kernel)\n  10.4.0.0/16 table 51820", "RULES (meshd's, in the kernel)\n  ipv4 rule pref 51820",
		"IPTABLES (meshd's chains and jumps, in the kernel)\n  *nat\n  :MESHD-POSTROUTING", "PROBES (UDP port 51821, underlay)\n  us-1 up",
		"EVENTS\n  1m0s ago  Warning PlanWarning: overlap", "METRICS (meshd_*)\n  meshd_up 1\n  meshd_wireguard_peers{kind=\"location\"} 1\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("diagnose lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "go_goroutines") {
		t.Error("diagnose shows metrics other than meshd's")
	}
	r = runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = f.get }, "diagnose", "eu-1", "-o", "json")
	var d diagnoseReport
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || d.State == nil || d.Leader != "eu-1" || len(d.Events) != 1 || len(d.Metrics) != 2 {
		t.Errorf("-o json: %v %+v", err, d)
	}
	if r := runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = f.get }, "diagnose", "nope"); r.code != 1 || !strings.Contains(r.stderr, `node "nope" not found`) {
		t.Errorf("unknown node: %d %s", r.code, r.stderr)
	}
	// meshd unreachable: the cluster's part is still reported, exit 1.
	down := func(context.Context, *connect.Clients, string, int, string, url.Values) ([]byte, error) {
		return nil, fmt.Errorf("dial tcp: connection refused")
	}
	r = runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = down }, "diagnose", "eu-2")
	if r.code != 1 || !strings.Contains(r.stdout, "MESHD\n  not reachable: dial tcp: connection refused") || !strings.Contains(r.stdout, "Node eu-2: location eu, leader eu-1") {
		t.Errorf("unreachable meshd: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestCheckLinkedClusters: every leader is checked against a linked
// cluster's leader at its mesh address.
func TestCheckLinkedClusters(t *testing.T) {
	nodes, leases, peers := fixture()
	kube := kubefake.NewClientset(append(append(nodes, leases...), linkSecret("c2"))...)
	md := meshdfake.NewSimpleClientset(peers...)
	c2 := kubefake.NewClientset(node(nodeSpec{name: "c2-a", region: "x", internal: "192.168.9.1", external: "198.51.100.9", pod: "10.9.0.0/24", key: 20,
		ann: map[string]string{convert.AnnotationWireGuardIP: "10.8.0.5"}}))
	f := &fakeNodes{}
	r := runMeshctlWith(t, kube, md, func(e *env) {
		e.nodeGet = f.get
		e.remoteClients = func([]byte) (*connect.Clients, error) {
			return &connect.Clients{Kube: c2, Config: &rest.Config{Host: "https://c2.example:6443"}}, nil
		}
	}, "check", "-o", "json", "--to", "eu-2")
	var rep checkReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v\n%s\n%s", err, r.stdout, r.stderr)
	}
	var got []string
	for _, p := range rep.Pairs {
		if p.Kind == "cluster" {
			got = append(got, p.From+" "+p.To+" "+p.Path+" "+p.Address)
			if last := p.Hops[len(p.Hops)-2]; !strings.HasPrefix(last.Name, "wireguard "+p.From+" => cluster c2: ") || last.OK {
				t.Errorf("%s: wireguard hop %+v (the fake leader has no such peer)", p.From, last)
			}
		}
	}
	want := "eu-1 cluster c2: cluster-c2-c2-a eu-1 => cluster-c2-c2-a 10.8.0.5\nus-1 cluster c2: cluster-c2-c2-a us-1 => cluster-c2-c2-a 10.8.0.5"
	if strings.Join(got, "\n") != want {
		t.Errorf("cluster pairs:\n%s\nwant\n%s", strings.Join(got, "\n"), want)
	}
	if !slices.Contains(f.pinged, "eu-1>10.8.0.5") {
		t.Errorf("pings %q", f.pinged)
	}
}

// TestCheckUnderlayFromLease: when meshd on the source's leader cannot be
// read, the underlay hop is judged from the probe report on its Lease.
func TestCheckUnderlayFromLease(t *testing.T) {
	kube, md := healthyClients()
	l, err := kube.CoordinationV1().Leases(liveness.DefaultNamespace).Get(context.Background(), liveness.LeaseName("eu-1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Annotations = map[string]string{liveness.AnnotationProbeDown: "us-1"}
	if _, err := kube.CoordinationV1().Leases(liveness.DefaultNamespace).Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := &fakeNodes{broken: true}
	get := func(ctx context.Context, c *connect.Clients, node string, port int, path string, q url.Values) ([]byte, error) {
		if node == "eu-1" && path == nodestate.PathState {
			return nil, fmt.Errorf("dial tcp: i/o timeout")
		}
		return f.get(ctx, c, node, port, path, q)
	}
	r := runMeshctlWith(t, kube, md, func(e *env) { e.nodeGet = get }, "check", "--no-linked", "--from", "eu-2", "--to", "us-1", "-o", "json")
	var rep checkReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v: %s %s", err, r.stdout, r.stderr)
	}
	// eu-1's vote also makes us-1 count as dead: that is the first hop.
	if len(rep.Pairs) != 1 || rep.Pairs[0].FailedHop != "lease us-1" || rep.Pairs[0].OK {
		t.Fatalf("pairs %+v", rep.Pairs)
	}
	found := false
	for _, h := range rep.Pairs[0].Hops {
		if h.Name == "underlay eu-1 -> us-1" {
			found = true
			if h.OK || !strings.Contains(h.Detail, "eu-1's Lease reports its probes to us-1 unanswered") {
				t.Errorf("hop %+v", h)
			}
		}
	}
	if !found {
		t.Errorf("no underlay hop eu-1 -> us-1: %+v", rep.Pairs[0].Hops)
	}
}

// TestCheckPodRoutes: a node that answers but does not route the other
// location's pods fails its pairs there, naming the pod routes.
func TestCheckPodRoutes(t *testing.T) {
	r, rep := checkRun(t, &fakeNodes{noPods: "eu-2"}, "--from", "eu-2")
	if r.code != 1 || rep.Failed != 2 || rep.Passed != 1 {
		t.Fatalf("exit %d, %d passed, %d failed\n%s", r.code, rep.Passed, rep.Failed, r.stdout)
	}
	for _, p := range rep.Pairs {
		want := ""
		if p.Kind == "locations" {
			want = "pod routes eu-2"
			if p.To == "us-2" {
				want = "lease us-2" // its stale Lease is the first hop that fails
			}
		}
		if p.FailedHop != want || p.Received != 3 {
			t.Errorf("%s -> %s: failed hop %q, want %q (echo answered %d)", p.From, p.To, p.FailedHop, want, p.Received)
		}
	}
}
