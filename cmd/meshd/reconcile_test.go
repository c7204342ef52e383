package main

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"testing"

	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"meshd.io/meshd/pkg/iptables"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/route"
	"meshd.io/meshd/pkg/wg"
)

// sliceLister serves a fixed list, like an informer's store.
type sliceLister []any

func (s sliceLister) List() []any { return s }

type fakes struct {
	wgc    *wg.FakeClient
	dev    *wg.Device
	kern   *route.FakeKernel
	routes *route.Manager
	ipt    *iptables.FakeRunner
	ipt4   *iptables.Controller
	kube   *fake.Clientset
	rec    *reconciler
}

func newKey(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func testNode(name, region, ip, pod string, key wgtypes.Key) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"topology.kubernetes.io/region": region}, Annotations: map[string]string{}},
		Spec:       corev1.NodeSpec{PodCIDR: pod, PodCIDRs: []string{pod}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}},
	}
	if key != (wgtypes.Key{}) {
		n.Annotations[convert.AnnotationPublicKey] = key.PublicKey().String()
	}
	return n
}

func newFakes(t *testing.T, self string, nodes ...*corev1.Node) *fakes {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &fakes{wgc: wg.NewFakeClient(), kern: route.NewFakeKernel(), ipt: iptables.NewFakeRunner(iptables.IPv4)}
	f.wgc.AddDevice("meshd0")
	links := wg.NewFakeLinks()
	links.AddLink("meshd0", 7, 1420)
	f.dev = wg.NewWithClient("meshd0", f.wgc, links, 1420, log)
	f.kern.AddLink("meshd0")
	f.kern.AddLink("eth0", netip.MustParsePrefix("198.51.100.0/24"))
	f.routes = route.NewWithKernel(route.Options{Logger: log}, f.kern)
	f.ipt4 = iptables.NewWithRunner(iptables.Options{Family: iptables.IPv4, Logger: log}, f.ipt)
	objs := make([]any, len(nodes))
	kobjs := make([]runtimeObject, len(nodes))
	for i, n := range nodes {
		objs[i], kobjs[i] = n, n
	}
	f.kube = fake.NewClientset(kobjs...)
	opts := mesh.Options{
		Granularity: mesh.GranularityLocation, MeshCIDRs: []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")},
		Port: 51820, Interface: "meshd0", LocalRoutes: true, RouteTable: mesh.DefaultRouteTable, RulePriority: mesh.DefaultRulePriority,
	}
	f.rec = newReconciler(reconcilerParts{
		log: log, opts: opts, node: self, port: 51820, topology: "topology.kubernetes.io/region",
		sources: sources{
			nodeLister: sliceLister(objs), peerLister: sliceLister(nil),
			liveness: liveness.NewLiveness(time.Minute, time.Now),
		},
		executors: executors{device: f.dev, routes: f.routes, ipt4: f.ipt4, key: newKey(t), mtu: 1420},
		kube:      f.kube, events: record.NewFakeRecorder(100),
		metrics: newMetrics(prometheus.NewRegistry(), nil),
	})
	return f
}

// refresh re-reads the Nodes from the fake API, as the informer would after
// meshd published its annotations.
func (f *fakes) refresh(t *testing.T) {
	t.Helper()
	list, err := f.kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	objs := make([]any, len(list.Items))
	for i := range list.Items {
		objs[i] = &list.Items[i]
	}
	f.rec.nodeLister = sliceLister(objs)
}

// peer is the WireGuard peer with key's public key on the fake device
// (nil: none).
func (f *fakes) peer(t *testing.T, key wgtypes.Key) *wgtypes.Peer {
	t.Helper()
	dev, err := f.wgc.Device("meshd0")
	if err != nil {
		t.Fatal(err)
	}
	for i := range dev.Peers {
		if dev.Peers[i].PublicKey == key.PublicKey() {
			return &dev.Peers[i]
		}
	}
	return nil
}

type counters struct {
	wg, routes uint64
	ipt        int
	patches    int
}

func (f *fakes) counters() counters {
	patches := 0
	for _, a := range f.kube.Actions() {
		if a.GetVerb() == "patch" || a.GetVerb() == "update" {
			patches++
		}
	}
	return counters{wg: f.dev.Writes(), routes: f.routes.Writes(), ipt: f.ipt.Restores(), patches: patches}
}

// TestUnchangedInputNoWrites proves that a reconcile of unchanged input
// makes no WireGuard call, no netlink write, no iptables restore and no API
// write (kilo#34, #82).
func TestUnchangedInputNoWrites(t *testing.T) {
	ctx := context.Background()
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("a2", "a", "198.51.100.12", "10.42.2.0/24", newKey(t)),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	)
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatalf("first reconcile: %v", err)
	}
	first := f.counters()
	if first.wg == 0 || first.routes == 0 || first.ipt == 0 || first.patches == 0 {
		t.Fatalf("first reconcile wrote nothing somewhere: %+v", first)
	}
	dev, err := f.wgc.Device("meshd0")
	if err != nil {
		t.Fatal(err)
	}
	if len(dev.Peers) != 1 {
		t.Fatalf("leader of a should have 1 peer (location b), has %d", len(dev.Peers))
	}
	// The published annotations come back through the informer.
	f.refresh(t)
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatalf("second reconcile: %v", err)
	}
	settled := f.counters()
	for i := 0; i < 5; i++ {
		f.refresh(t)
		if err := f.rec.reconcile(ctx); err != nil {
			t.Fatalf("reconcile %d: %v", i, err)
		}
	}
	if got := f.counters(); got != settled {
		t.Fatalf("unchanged input caused writes: after settling %+v, after 5 more reconciles %+v", settled, got)
	}
	me, err := f.kube.CoreV1().Nodes().Get(ctx, "a1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if me.Annotations[convert.AnnotationPublicKey] != f.rec.key.PublicKey().String() {
		t.Fatalf("public key not published: %v", me.Annotations)
	}
	if me.Annotations[convert.AnnotationWireGuardIP] == "" {
		t.Fatalf("mesh address not published: %v", me.Annotations)
	}
	for k, v := range me.Annotations {
		if v == f.rec.key.String() {
			t.Fatalf("private key published in %s", k)
		}
	}

	// One changed remote node: only that peer is written.
	f.refresh(t)
	objs := f.rec.nodeLister.(sliceLister)
	for _, o := range objs {
		if n := o.(*corev1.Node); n.Name == "b1" {
			n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, "10.43.3.0/24")
		}
	}
	before := f.counters()
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatalf("reconcile after change: %v", err)
	}
	after := f.counters()
	if after.wg != before.wg+1 {
		t.Errorf("one changed peer: WireGuard writes went %d → %d, want exactly one more", before.wg, after.wg)
	}
	if after.routes == before.routes {
		t.Errorf("new pod CIDR: no route written")
	}
}

// TestMalformedAnnotationReportedOnce checks a bad annotation yields one
// Event and the rest of the mesh is still planned.
func TestMalformedAnnotationReportedOnce(t *testing.T) {
	bad := testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t))
	bad.Annotations[convert.AnnotationPersistentKeepalive] = "abc"
	f := newFakes(t, "a1", testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}), bad)
	for i := 0; i < 3; i++ {
		if err := f.rec.reconcile(context.Background()); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
	}
	events := f.rec.events.(*record.FakeRecorder).Events
	if n := len(events); n != 1 {
		t.Fatalf("want exactly one Event for the malformed annotation, got %d", n)
	}
	if e := <-events; !contains(e, "persistent-keepalive") {
		t.Fatalf("event does not name the annotation: %q", e)
	}
	dev, _ := f.wgc.Device("meshd0")
	if len(dev.Peers) != 1 {
		t.Fatalf("the node with the bad annotation must still be a peer, peers=%d", len(dev.Peers))
	}
}

func TestMissingSelfIsAnError(t *testing.T) {
	f := newFakes(t, "nope", testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", newKey(t)))
	err := f.rec.reconcile(context.Background())
	if err == nil || !contains(err.Error(), `"nope" not found`) {
		t.Fatalf("want a clear not-found error, got %v", err)
	}
}

func contains(s, sub string) bool { return len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0) }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestNodeFilter: kubelet status heartbeats, other components' annotations,
// resyncs and a node's own published annotations must not trigger
// reconciles; anything the plan reads must.
func TestNodeFilter(t *testing.T) {
	f := nodeFilter{self: "self", parse: convert.ParseOptions{TopologyLabel: "topology.kubernetes.io/region", Port: 51820}}
	base := testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", newKey(t))
	base.Annotations[convert.AnnotationHandshakes] = `{}`
	same := base.DeepCopy()
	same.ResourceVersion = "42"
	same.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	same.Annotations[convert.AnnotationHandshakes] = `{"x":1}`
	same.Annotations["node.alpha.kubernetes.io/ttl"] = "0"
	same.Labels["kubernetes.io/os"] = "linux"
	if f.changed(base, same) {
		t.Error("a status heartbeat, a handshake time or an unrelated annotation or label counted as a change")
	}
	k2 := newKey(t).PublicKey()
	for name, mutate := range map[string]func(n *corev1.Node){
		"location label": func(n *corev1.Node) { n.Labels["topology.kubernetes.io/region"] = "b" },
		"leader":         func(n *corev1.Node) { n.Annotations[convert.AnnotationLeader] = "true" },
		"key":            func(n *corev1.Node) { n.Annotations[convert.AnnotationPublicKey] = newKey(t).PublicKey().String() },
		"malformed key":  func(n *corev1.Node) { n.Annotations[convert.AnnotationPublicKey] = "x" },
		"podCIDRs":       func(n *corev1.Node) { n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, "fd42::/64") },
		"address":        func(n *corev1.Node) { n.Status.Addresses[0].Address = "198.51.100.99" },
		"discovered": func(n *corev1.Node) {
			n.Annotations[convert.AnnotationDiscoveredEndpoints] = `{"` + k2.String() + `":"203.0.113.9:4000"}`
		},
	} {
		n := base.DeepCopy()
		mutate(n)
		if !f.changed(base, n) {
			t.Errorf("%s change not seen", name)
		}
	}
	// A bad value replaced by another bad value: the plan is the same but
	// the problem to report differs.
	bad1, bad2 := base.DeepCopy(), base.DeepCopy()
	bad1.Annotations[convert.AnnotationPersistentKeepalive] = "abc"
	bad2.Annotations[convert.AnnotationPersistentKeepalive] = "abd"
	if !f.changed(bad1, bad2) {
		t.Error("a changed malformed annotation not seen")
	}
}

// TestOwnWritesDoNotTrigger: what meshd publishes on its own Node is not a
// change for that node's filter (but is for everyone else's), and a
// handshake alone makes no API write.
func TestOwnWritesDoNotTrigger(t *testing.T) {
	ctx := context.Background()
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	)
	before, err := f.kube.CoreV1().Nodes().Get(ctx, "a1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := f.kube.CoreV1().Nodes().Get(ctx, "a1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Annotations[convert.AnnotationPublicKey] == "" {
		t.Fatal("nothing published")
	}
	parse := convert.ParseOptions{TopologyLabel: "topology.kubernetes.io/region", Port: 51820}
	if (nodeFilter{self: "a1", parse: parse}).changed(before, after) {
		t.Error("a1's own publish triggers a1's reconcile")
	}
	if !(nodeFilter{self: "b1", parse: parse}).changed(before, after) {
		t.Error("a1's publish is not seen by b1")
	}
	// Handshakes come and go: no API write, and no handshakes annotation.
	// (The first handshake publishes b1's endpoint as discovered, once.)
	dev, _ := f.wgc.Device("meshd0")
	for _, p := range dev.Peers {
		f.wgc.SetHandshake("meshd0", p.PublicKey, time.Now())
	}
	f.refresh(t)
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	f.refresh(t)
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	settled := f.counters()
	for i := 1; i < 4; i++ {
		for _, p := range dev.Peers {
			f.wgc.SetHandshake("meshd0", p.PublicKey, time.Now().Add(time.Duration(i)*time.Minute))
		}
		f.refresh(t)
		if err := f.rec.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.counters(); got.patches != settled.patches {
		t.Errorf("handshakes caused %d API writes", got.patches-settled.patches)
	}
	me, _ := f.kube.CoreV1().Nodes().Get(ctx, "a1", metav1.GetOptions{})
	if v, ok := me.Annotations[convert.AnnotationHandshakes]; ok {
		t.Errorf("handshakes published: %s", v)
	}
}

// TestLeanNodeKeepsMeshInput: the informer transform drops what meshd never
// reads and keeps everything the planner does.
func TestLeanNodeKeepsMeshInput(t *testing.T) {
	n := testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", newKey(t))
	n.Annotations[convert.AnnotationLeader] = "true"
	n.Annotations["node.alpha.kubernetes.io/ttl"] = "0"
	n.UID, n.ResourceVersion = "uid-1", "7"
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	n.Status.NodeInfo.KubeletVersion = "v1.36.3"
	n.Spec.Taints = []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectNoSchedule}}
	o, err := convert.LeanNode(n)
	if err != nil {
		t.Fatal(err)
	}
	lean := o.(*corev1.Node)
	if lean.ManagedFields != nil || lean.Status.Images != nil || lean.Status.Conditions != nil || lean.Status.NodeInfo.KubeletVersion != "" || lean.Spec.Taints != nil {
		t.Errorf("lean Node keeps what meshd never reads: %+v", lean)
	}
	if _, ok := lean.Annotations["node.alpha.kubernetes.io/ttl"]; ok {
		t.Error("lean Node keeps another component's annotation")
	}
	if lean.Name != n.Name || lean.UID != n.UID || lean.ResourceVersion != n.ResourceVersion {
		t.Errorf("lean Node lost its identity: %+v", lean.ObjectMeta)
	}
	parse := convert.ParseOptions{TopologyLabel: "topology.kubernetes.io/region", Port: 51820}
	want, _ := convert.NodeFromObject(n, parse)
	got, _ := convert.NodeFromObject(lean, parse)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mesh input changed by the transform:\n got %+v\nwant %+v", got, want)
	}
	if (nodeFilter{self: "other", parse: parse}).changed(n, lean) {
		t.Error("the filter sees a difference between a Node and its lean copy")
	}
}
