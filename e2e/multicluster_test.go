//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/mesh"
)

// The second cluster. Nothing overlaps the main cluster (pods 10.42.0.0/16,
// services 10.96.0.0/12, mesh 10.4.0.0/16). Note that 10.97.0.0/16 would
// overlap 10.96.0.0/12: TestMultiClusterLink uses it on purpose.
const (
	c2ServiceCIDR = "10.112.0.0/12"
	c2MeshCIDR    = "10.5.0.0/16"
	c2PodOctet    = 52 // pods 10.52.N.0/24
)

// mcBed is two clusters on the same underlay, each with one location of two
// nodes (one pod each) running meshd.
type mcBed struct {
	c2       *testbed.Cluster
	one, two []*testbed.Node // nodes of cluster 1 (the main one) and cluster 2
	admin    *testbed.External
	// linkCtl are the link controllers (`meshd link`) of cluster 1 and 2,
	// on the admin host (linkctl_test.go).
	linkCtl [2]*testbed.Proc
}

// twoClusters starts cluster 2, the locations, the nodes (kube-proxy on
// each when kubeProxy), meshd everywhere, and checks each cluster inside.
func (s *scenario) twoClusters(kubeProxy bool) *mcBed {
	s.t.Helper()
	t, ctx := s.t, s.ctx
	if kubeProxy {
		// Its own context: a cold build may take a few minutes.
		bctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := tb.EnsureKubeProxy(bctx); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	c2, err := tb.AddCluster(ctx, testbed.ClusterOptions{
		Name: "c2", Addr: netip.MustParseAddr("203.0.113.3"),
		ServiceCIDR: c2ServiceCIDR, MeshCIDR: c2MeshCIDR, PodOctet: c2PodOctet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster c2 up in %s (kubectl: %s/kubectl)", time.Since(start).Round(time.Millisecond), c2.Dir)
	b := &mcBed{c2: c2}
	s.location("c1", false)
	s.location("c2", false)
	b.one = []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "c1n1", Location: "c1"}),
		s.node(testbed.NodeOptions{Name: "c1n2", Location: "c1"}),
	}
	b.two = []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "c2n1", Location: "c2", Cluster: c2}),
		s.node(testbed.NodeOptions{Name: "c2n2", Location: "c2", Cluster: c2}),
	}
	// On failure: kube-proxy logs and the KUBE-* rule counts (meshd's own
	// diagnostics are printed by newScenario's cleanup, which runs after
	// this one).
	t.Cleanup(func() {
		if !t.Failed() && os.Getenv("E2E_DIAG") == "" {
			return
		}
		for _, n := range b.all() {
			if kubeProxy {
				t.Logf("----- kube-proxy log on %s (last 15 lines)\n%s", n.Name, testbed.Tail(filepath.Join(n.Dir, "kube-proxy.log"), 15))
			}
			out, _ := n.Exec(context.Background(), "sh", "-c", "iptables-save | grep -c '^-A KUBE-' ; iptables-save -t nat | grep -E '^-A (PREROUTING|POSTROUTING|OUTPUT)'")
			t.Logf("----- %s: KUBE-* rule count, nat hooks\n%s", n.Name, out)
		}
	})
	if kubeProxy {
		for _, n := range b.all() {
			if _, err := n.StartKubeProxy(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.startMeshd(b.all(), "--mesh-granularity", "location")
	for _, c := range [][]*testbed.Node{b.one, b.two} {
		pairs(c, func(x, y *testbed.Node) { s.pingEventually(pod(x), pod(y).IP, 30*time.Second) })
	}
	for _, n := range b.all() {
		s.mcAnnotation(n, testbed.AnnotationPublicKey)
	}
	return b
}

// mcAnnotation waits for meshd to publish the annotation on n's Node object
// in n's own cluster.
func (s *scenario) mcAnnotation(n *testbed.Node, key string) string {
	s.t.Helper()
	var v string
	s.eventually(30*time.Second, 250*time.Millisecond, fmt.Sprintf("node %s has annotation %s", n.Name, key), func() error {
		obj, err := n.Object(s.ctx)
		if err != nil {
			return err
		}
		if v = obj.Annotations[key]; v == "" {
			return fmt.Errorf("annotations: %v", obj.Annotations)
		}
		return nil
	})
	return v
}

func (b *mcBed) all() []*testbed.Node { return append(append([]*testbed.Node{}, b.one...), b.two...) }

// crossPing waits until every pod of each cluster pings every pod of the
// other one.
func (s *scenario) crossPing(b *mcBed, timeout time.Duration) {
	s.t.Helper()
	for _, x := range b.one {
		for _, y := range b.two {
			s.pingEventually(pod(x), pod(y).IP, timeout)
			s.pingEventually(pod(y), pod(x).IP, timeout)
		}
	}
}

// crossTCP transfers 1 MiB over TCP between every pod pair across the two
// clusters, both ways.
func (s *scenario) crossTCP(b *mcBed) {
	s.t.Helper()
	for _, x := range b.one {
		for _, y := range b.two {
			if err := pod(x).Transfer(s.ctx, pod(y), pod(y).IP, 1<<20); err != nil {
				s.t.Errorf("TCP %s -> %s: %v", x.Name, y.Name, err)
			}
			if err := pod(y).Transfer(s.ctx, pod(x), pod(x).IP, 1<<20); err != nil {
				s.t.Errorf("TCP %s -> %s: %v", y.Name, x.Name, err)
			}
		}
	}
}

// leaderOf returns the node of a location with WireGuard peers (the
// location leader, once peered with the other cluster).
func (s *scenario) leaderOf(nodes []*testbed.Node) *testbed.Node {
	s.t.Helper()
	var l *testbed.Node
	s.eventually(30*time.Second, 500*time.Millisecond, "one node with WireGuard peers among "+nodes[0].Name+"...", func() error {
		l = nil
		for _, n := range nodes {
			if s.wgPeerCount(n) > 0 {
				if l != nil {
					return fmt.Errorf("%s and %s both have WireGuard peers", l.Name, n.Name)
				}
				l = n
			}
		}
		if l == nil {
			return fmt.Errorf("no node has WireGuard peers")
		}
		return nil
	})
	return l
}

var (
	meshctlOnce sync.Once
	meshctlPath string
	meshctlErr  error
)

// meshctl builds ./cmd/meshctl once into the testbed's bin directory.
func meshctl(t *testing.T) string {
	t.Helper()
	meshctlOnce.Do(func() {
		meshctlPath = filepath.Join(tb.Dir, "bin", "meshctl")
		args := append(append([]string{"build"}, testbed.BuildFlags()...), "-o", meshctlPath, "./cmd/meshctl")
		cmd := osexec.Command("go", args...)
		cmd.Dir = tb.RepoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			meshctlErr = fmt.Errorf("go build ./cmd/meshctl: %w\n%s", err, out)
		}
	})
	if meshctlErr != nil {
		t.Fatal(meshctlErr)
	}
	return meshctlPath
}

// adminHost is an outside host on the WAN (an operator's workstation) with
// the real kubectl and meshctl on its PATH and both kubeconfigs in its
// environment.
func (s *scenario) adminHost(b *mcBed) []string {
	s.t.Helper()
	if b.admin == nil {
		a, err := tb.AddExternal(s.ctx, "admin")
		if err != nil {
			s.t.Fatal(err)
		}
		b.admin = a
	}
	m := meshctl(s.t)
	return []string{
		"PATH=" + filepath.Dir(m) + ":" + tb.KubeDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"KUBECONFIG1=" + tb.Kubeconfig, "SERVICECIDR1=" + testbed.ServiceCIDR,
		"KUBECONFIG2=" + b.c2.Kubeconfig, "SERVICECIDR2=" + c2ServiceCIDR, "MESHCIDR2=" + c2MeshCIDR,
		// What each cluster may claim besides its mesh and service CIDRs.
		"PODCIDR1=" + testbed.PodCIDRPrefix, "PODCIDR2=" + b.c2.PodCIDR(), "NODENETWORK=198.51.100.0/24",
	}
}

// The manual flow of docs/multi-cluster.md (Kilo's multi-cluster guide with
// meshctl for kgctl), verbatim. kubectl apply fails on the empty input of a
// non-leader ("error: no objects passed to apply"); the loops tolerate it
// as documented, and the result is checked instead of the exit status.
//
// Cluster 2's meshd runs with --mesh-cidr 10.5.0.0/16, and meshctl's global
// flags must match the cluster's DaemonSet (docs/multi-cluster.md,
// Requirements), so the second loop passes --mesh-cidr $MESHCIDR2; without
// it meshctl would put mesh IPs from its default 10.4.0.0/16 into the Peer.
const (
	manualLoop1to2 = `for n in $(kubectl --kubeconfig $KUBECONFIG1 get no -o name | cut -d'/' -f2); do
  meshctl --kubeconfig $KUBECONFIG1 showconf node $n --as-peer -o yaml --allowed-ips $SERVICECIDR1 | kubectl --kubeconfig $KUBECONFIG2 apply -f -
done`
	manualLoop2to1 = `for n in $(kubectl --kubeconfig $KUBECONFIG2 get no -o name | cut -d'/' -f2); do
  meshctl --kubeconfig $KUBECONFIG2 --mesh-cidr $MESHCIDR2 showconf node $n --as-peer -o yaml --allowed-ips $SERVICECIDR2 | kubectl --kubeconfig $KUBECONFIG1 apply -f -
done`
)

// manualPeering runs both loops on the admin host until each cluster holds
// one Peer (one location on the other side) named after the other side's
// location leader.
func (s *scenario) manualPeering(b *mcBed) {
	s.t.Helper()
	env := s.adminHost(b)
	s.eventually(60*time.Second, 2*time.Second, "manual flow creates one Peer in each cluster", func() error {
		for _, loop := range []string{manualLoop1to2, manualLoop2to1} {
			out, err := b.admin.Exec(s.ctx, append(append([]string{"env"}, env...), "bash", "-c", loop)...)
			status := "exit status 0"
			if err != nil {
				status = "exit status non-zero (expected when the last node is not a leader)"
			}
			s.t.Logf("$ %s\n%s(%s)", loop, out, status)
		}
		for _, c := range []struct {
			name string
			dyn  interface {
				List(context.Context, metav1.ListOptions) (*unstructured.UnstructuredList, error)
			}
		}{{"cluster 1", tb.Dynamic.Resource(testbed.PeerGVR)}, {"cluster 2", b.c2.Dynamic.Resource(testbed.PeerGVR)}} {
			l, err := c.dyn.List(s.ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if len(l.Items) != 1 {
				return fmt.Errorf("%s has %d Peers, want 1", c.name, len(l.Items))
			}
		}
		return nil
	})
}

// peerAllowedIPs returns a Peer's spec.allowedIPs.
func peerAllowedIPs(ctx context.Context, c interface {
	Get(context.Context, string, metav1.GetOptions, ...string) (*unstructured.Unstructured, error)
}, name string) ([]string, error) {
	p, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	ips, _, err := unstructured.NestedStringSlice(p.Object, "spec", "allowedIPs")
	return ips, err
}

// Multi-cluster scenario 1 and 2: two clusters joined by the manual flow
// (real kubectl, real meshctl, verbatim loops), with a real kube-proxy
// (iptables mode) on every node. Pods reach the other cluster's pods (ping
// and TCP, both ways), and a Service cluster IP of each cluster answers HTTP
// to the other cluster's pods: its service CIDR is routed through the mesh
// by `--allowed-ips $SERVICECIDR`, kube-proxy's KUBE-* chains DNAT it on the
// receiving leader, next to meshd's MESHD-* chains.
func TestMultiClusterManual(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	b := s.twoClusters(true)
	start := time.Now()
	s.manualPeering(b)
	t.Logf("manual flow done in %s", time.Since(start).Round(time.Millisecond))

	// The Peers are the leaders, with the right mesh IPs and the service CIDRs.
	l1, l2 := s.leaderOf(b.one), s.leaderOf(b.two)
	for _, c := range []struct {
		dyn interface {
			Get(context.Context, string, metav1.GetOptions, ...string) (*unstructured.Unstructured, error)
		}
		leader     *testbed.Node
		meshIP     string
		serviceCID string
	}{
		{b.c2.Dynamic.Resource(testbed.PeerGVR), l1, s.mcAnnotation(l1, testbed.AnnotationWGIP), testbed.ServiceCIDR},
		{tb.Dynamic.Resource(testbed.PeerGVR), l2, s.mcAnnotation(l2, testbed.AnnotationWGIP), c2ServiceCIDR},
	} {
		ips, err := peerAllowedIPs(ctx, c.dyn, c.leader.Name)
		if err != nil {
			t.Fatalf("Peer %s: %v", c.leader.Name, err)
		}
		for _, want := range []string{c.serviceCID, c.meshIP + "/32", c.leader.PodCIDR.String()} {
			if !contains(ips, want) {
				t.Errorf("Peer %s: allowedIPs %v lack %s", c.leader.Name, ips, want)
			}
		}
	}

	start = time.Now()
	s.crossPing(b, 60*time.Second)
	t.Logf("all cross-cluster pod pairs ping %s after the manual flow", time.Since(start).Round(time.Millisecond))
	s.crossTCP(b)

	// Services: a selector-less Service plus an EndpointSlice for the pod
	// of each cluster's second node; the other cluster's pods fetch it by
	// cluster IP.
	svc1 := s.httpService(tb.Kube, pod(b.one[1]), pod(b.one[0]), "hello from cluster 1")
	svc2 := s.httpService(b.c2.Kube, pod(b.two[1]), pod(b.two[0]), "hello from cluster 2")
	for _, c := range []struct {
		from []*testbed.Node
		ip   string
		want string
	}{{b.two, svc1, "hello from cluster 1"}, {b.one, svc2, "hello from cluster 2"}} {
		for _, n := range c.from {
			s.httpEventually(pod(n), "http://"+c.ip+":80/", c.want, 60*time.Second)
		}
	}

	// kube-proxy's chains and meshd's coexist on every node.
	for _, n := range b.all() {
		out, err := n.Exec(ctx, "iptables-save")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"-A KUBE-SERVICES", "-A POSTROUTING -j MESHD-", "-A FORWARD -j MESHD-"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: iptables-save lacks %q", n.Name, want)
			}
		}
	}
}

// httpService starts `e2etool http` on port 8080 of p and creates in its
// cluster a selector-less Service "web" (port 80 -> 8080) with an
// EndpointSlice pointing at p; it checks that local (a pod of the same
// cluster on another node) gets the answer and returns the cluster IP.
func (s *scenario) httpService(kube kubernetes.Interface, p, local *testbed.Pod, text string) string {
	s.t.Helper()
	ctx := s.ctx
	if _, err := p.Start("http", tb.ToolBinary, "http", "0.0.0.0:8080", text); err != nil {
		s.t.Fatal(err)
	}
	svc, err := kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP,
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	ready := true
	port, name, proto := int32(8080), "http", corev1.ProtocolTCP
	_, err = kube.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{p.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName: &p.Node.Name,
		}},
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	// Sanity: it answers inside its own cluster first.
	s.httpEventually(local, "http://"+svc.Spec.ClusterIP+":80/", text, 30*time.Second)
	s.t.Logf("Service web = %s:80 -> %s:8080 (pod %s)", svc.Spec.ClusterIP, p.IP, p.NS)
	return svc.Spec.ClusterIP
}

// httpEventually waits until curl from p to url answers want.
func (s *scenario) httpEventually(p *testbed.Pod, url, want string, timeout time.Duration) {
	s.t.Helper()
	s.eventually(timeout, time.Second, fmt.Sprintf("curl %s from %s", url, p.NS), func() error {
		out, err := p.Exec(s.ctx, "curl", "-sS", "-m", "3", url)
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != want {
			return fmt.Errorf("answer %q, want %q", out, want)
		}
		return nil
	})
}

// Multi-cluster scenario 3: automatic peering with cluster links. Link the
// clusters with `meshctl link` (real binary, on an admin host), then:
// a node added to cluster 1 (in a new location, so a new leader) is reached
// from cluster 2's pods with no further command; deleting it removes its
// WireGuard peer from cluster 2; unlinking removes the remote peers and
// invalidates the link's token. Finally, a link whose remote service range
// overlaps the local one is reported (Event on the link Secret, log line
// naming both ranges) and the range is not routed.
func TestMultiClusterLink(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	b := s.twoClusters(false)

	start := time.Now()
	s.link(b)
	s.crossPing(b, 60*time.Second)
	t.Logf("linked: all cross-cluster pod pairs ping %s after linking", time.Since(start).Round(time.Millisecond))
	s.crossTCP(b)
	l2 := s.leaderOf(b.two)

	// meshctl status on cluster 2 reads the link the way meshd does: cluster
	// 1, reachable, with its leader as a peer of cluster 2's leader.
	l1 := s.leaderOf(b.one)
	st := s.admin(b, `meshctl --kubeconfig $KUBECONFIG2 --mesh-cidr $MESHCIDR2 status || [ $? -eq 1 ]` /* exit 1: problems listed; the output is checked */)
	for _, want := range []string{"LINKED CLUSTERS", "meshd-link-cluster1", "cluster-cluster1-" + l1.Name,
		l2.Name + "  cluster cluster1: cluster-cluster1-" + l1.Name} {
		if !strings.Contains(st, want) {
			t.Errorf("meshctl status on cluster 2 lacks %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^cluster1\s+meshd-link-cluster1\s+\S+\s+\S+\s+\S+\s+\S+ \(in \d+d\)\s+ok$`).MatchString(st) {
		t.Errorf("meshctl status on cluster 2: cluster1 not listed as ok")
	}

	// A new node (its own location: a new leader) in cluster 1.
	s.location("c1b", false)
	n3 := s.node(testbed.NodeOptions{Name: "c1n3", Location: "c1b"})
	start = time.Now()
	s.startMeshd([]*testbed.Node{n3}, "--mesh-granularity", "location")
	key3 := s.mcAnnotation(n3, testbed.AnnotationPublicKey)
	for _, y := range b.two {
		s.pingEventually(pod(y), pod(n3).IP, 60*time.Second)
		s.pingEventually(pod(n3), pod(y).IP, 30*time.Second)
	}
	t.Logf("new node c1n3 reached from cluster 2 %s after its meshd started, with no command", time.Since(start).Round(time.Millisecond))
	if err := pod(b.two[0]).Transfer(ctx, pod(n3), pod(n3).IP, 1<<20); err != nil {
		t.Errorf("TCP c2 -> c1n3: %v", err)
	}

	// Delete it: its peer disappears from cluster 2's leader.
	start = time.Now()
	if err := n3.StopMeshd(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Logf("stopping meshd on c1n3: %v", err)
	}
	t.Logf("meshd on c1n3 stopped in %s", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if err := n3.DeleteObject(ctx); err != nil {
		t.Fatal(err)
	}
	s.eventually(60*time.Second, time.Second, "c1n3's peer gone from "+l2.Name, func() error {
		d, err := l2.WG(ctx, "meshd0")
		if err != nil {
			return err
		}
		if d.Peer(key3) != nil {
			return fmt.Errorf("peer %s still configured", key3)
		}
		if len(d.Peers) != 1 {
			return fmt.Errorf("%d peers, want 1 (cluster 1's remaining leader)", len(d.Peers))
		}
		return nil
	})
	t.Logf("c1n3's peer removed from cluster 2 %s after its Node was deleted", time.Since(start).Round(time.Millisecond))

	// Unlink: the remote peers go, the token stops working.
	kc, err := b.c2.Kube.CoreV1().Secrets(testbed.LeaseNamespace).Get(ctx, clusterlink.LinkSecretPrefix+"cluster1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	s.unlink(b)
	for _, n := range b.all() {
		s.eventually(60*time.Second, time.Second, "no WireGuard peers on "+n.Name+" after unlinking", func() error {
			if c := s.wgPeerCount(n); c > 0 {
				return fmt.Errorf("%d peers", c)
			}
			return nil
		})
	}
	t.Logf("unlinked: remote peers gone %s after unlinking", time.Since(start).Round(time.Millisecond))
	if err := pod(b.two[0]).Ping(ctx, pod(b.one[0]).IP, 1); err == nil {
		t.Errorf("cluster 2 still reaches cluster 1's pods after unlinking")
	}
	s.eventually(30*time.Second, time.Second, "the revoked link token is rejected by cluster 1", func() error {
		return s.linkTokenRejected(kc.Data[clusterlink.LinkKubeconfigKey])
	})
	t.Logf("the revoked link token is rejected %s after unlinking", time.Since(start).Round(time.Millisecond))

	// Overlap: a link (made with the library behind meshctl link) claims
	// 10.97.0.0/16 as the remote service range, inside cluster 1's
	// 10.96.0.0/12.
	const overlapping = "10.97.0.0/16"
	bad := linkSettings("overlap", overlapping, c2MeshCIDR)
	if err := clusterlink.GrantLink(ctx, s.clients(b.c2.RESTConfig), bad, "", s.clients(tb.RESTConfig), "cluster1", testbed.LeaseNamespace); err != nil {
		t.Fatal(err)
	}
	s.eventually(60*time.Second, time.Second, "an Event on ClusterLink overlap naming both ranges", func() error {
		evs, err := linkEvents(ctx, tb.Kube, "overlap")
		if err != nil {
			return err
		}
		for _, e := range evs {
			if strings.Contains(e.Message, overlapping) && strings.Contains(e.Message, testbed.ServiceCIDR) {
				t.Logf("Event %s/%s: %s", e.Type, e.Reason, e.Message)
				return nil
			}
		}
		return fmt.Errorf("%d Events, none naming %s and %s", len(evs), overlapping, testbed.ServiceCIDR)
	})
	s.eventually(30*time.Second, time.Second, "a meshd log line naming both ranges", func() error {
		for _, n := range b.one {
			for _, l := range strings.Split(testbed.Tail(n.MeshdLog(), 400), "\n") {
				if strings.Contains(l, overlapping) && strings.Contains(l, testbed.ServiceCIDR) {
					t.Logf("%s: %s", n.Name, l)
					return nil
				}
			}
		}
		return fmt.Errorf("no line in cluster 1's meshd logs")
	})
	l1 = s.leaderOf(b.one)
	d, err := l1.WG(ctx, "meshd0")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Peers {
		if contains(p.AllowedIPs, overlapping) {
			t.Errorf("%s routes the overlapping %s to peer %s", l1.Name, overlapping, p.PublicKey)
		}
	}
}

// clients builds meshd's API clients for a cluster from the test process
// (its rest.Config dials inside the control-plane namespace).
func (s *scenario) clients(cfg *rest.Config) *connect.Clients {
	s.t.Helper()
	c, err := connect.NewClientsForConfig(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// linkSettings describe each cluster as the other needs to know it (what
// `meshctl link` derives from its flags).
func linkSettings(name, serviceCIDR, meshCIDR string) clusterlink.LinkSettings {
	return clusterlink.LinkSettings{Name: name, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix(serviceCIDR)},
		Granularity: mesh.GranularityLocation, MeshCIDRs: []netip.Prefix{netip.MustParsePrefix(meshCIDR)},
		TopologyLabel: testbed.LabelRegion, Port: mesh.DefaultPort}
}

// Both ways at once, names and ranges as the clusters' meshd use them.
const (
	linkCmd = `meshctl link --from-kubeconfig $KUBECONFIG1 --from-name cluster1 --from-service-cidr $SERVICECIDR1 \
  --from-allowed-cidr $PODCIDR1,$NODENETWORK \
  --to-kubeconfig $KUBECONFIG2 --to-name cluster2 --to-service-cidr $SERVICECIDR2 --to-mesh-cidr $MESHCIDR2 \
  --to-allowed-cidr $PODCIDR2,$NODENETWORK`
	unlinkCmd = `meshctl unlink --from-kubeconfig $KUBECONFIG1 --from-name cluster1 --to-kubeconfig $KUBECONFIG2 --to-name cluster2`
)

// admin runs a shell command on the admin host and fails the test if it
// fails.
func (s *scenario) admin(b *mcBed, script string) string {
	s.t.Helper()
	env := s.adminHost(b)
	out, err := b.admin.Exec(s.ctx, append(append([]string{"env"}, env...), "bash", "-c", script)...)
	s.t.Logf("$ %s\n%s", script, out)
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

// link links the two clusters both ways with `meshctl link` on the admin
// host, and checks what the credentials it stored can do.
func (s *scenario) link(b *mcBed) {
	s.t.Helper()
	s.admin(b, linkCmd)
	s.startLinkControllers(b)
	// The credentials in cluster 2's link Secret read cluster 1's Nodes, not
	// its Secrets.
	sec, err := b.c2.Kube.CoreV1().Secrets(testbed.LeaseNamespace).Get(s.ctx, clusterlink.LinkSecretPrefix+"cluster1", metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	kube := s.linkClient(sec.Data[clusterlink.LinkKubeconfigKey])
	if _, err := kube.CoreV1().Nodes().List(s.ctx, metav1.ListOptions{}); err != nil {
		s.t.Errorf("link credentials cannot list cluster 1's Nodes: %v", err)
	}
	if _, err := kube.CoreV1().Secrets(testbed.LeaseNamespace).List(s.ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		s.t.Errorf("link credentials listing Secrets of cluster 1: %v, want Forbidden", err)
	}
	// The kube-system namespace, for its UID (the cluster's ID when it has
	// no ClusterProperty, docs/mcs.md), and no other Namespace.
	if ns, err := kube.CoreV1().Namespaces().Get(s.ctx, "kube-system", metav1.GetOptions{}); err != nil || ns.UID == "" {
		s.t.Errorf("link credentials reading cluster 1's kube-system namespace: %v", err)
	}
	if _, err := kube.CoreV1().Namespaces().Get(s.ctx, testbed.LeaseNamespace, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		s.t.Errorf("link credentials reading cluster 1's %s namespace: %v, want Forbidden", testbed.LeaseNamespace, err)
	}
}

// unlink removes both links with `meshctl unlink`.
func (s *scenario) unlink(b *mcBed) {
	s.t.Helper()
	s.admin(b, unlinkCmd)
}

// linkClient is a client from a link Secret's kubeconfig for cluster 1,
// dialing from the main control-plane namespace.
func (s *scenario) linkClient(kubeconfig []byte) kubernetes.Interface {
	s.t.Helper()
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg.Dial = testbed.NetnsDialer("/run/netns/" + tb.CPNS)
	cfg.Timeout = 5 * time.Second
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return kube
}

// linkTokenRejected returns nil when cluster 1 rejects the credentials of
// a link kubeconfig as unauthenticated.
func (s *scenario) linkTokenRejected(kubeconfig []byte) error {
	_, err := s.linkClient(kubeconfig).CoreV1().Nodes().List(s.ctx, metav1.ListOptions{})
	if apierrors.IsUnauthorized(err) {
		return nil
	}
	return fmt.Errorf("listing Nodes: %v, want Unauthorized", err)
}
