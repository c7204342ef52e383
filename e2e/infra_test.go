//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/e2e/testbed"
)

// TestTestbed checks the testbed itself, without meshd: API server,
// namespace and CRDs, Node objects, underlay reachability between nodes
// (also through a NAT), node access to the API server, private
// /var/run/wireguard per node, pod-to-pod traffic on one node, and that
// pods on different nodes can NOT reach each other without meshd.
func TestTestbed(t *testing.T) {
	s := newScenario(t, false)
	ctx := s.ctx
	s.location("a", false)
	s.location("b", false)
	s.location("c", true)
	a1 := s.node(testbed.NodeOptions{Name: "a1", Location: "a", DualStack: true})
	a2 := s.node(testbed.NodeOptions{Name: "a2", Location: "a"})
	b1 := s.node(testbed.NodeOptions{Name: "b1", Location: "b"})
	c1 := s.node(testbed.NodeOptions{Name: "c1", Location: "c"})
	a1p1, err := a1.AddPod(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	laptop, err := tb.AddExternal(ctx, "laptop")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("control plane", func(t *testing.T) {
		if _, err := tb.Kube.CoreV1().Namespaces().Get(ctx, testbed.LeaseNamespace, metav1.GetOptions{}); err != nil {
			t.Error(err)
		}
		crds, _ := filepath.Glob(filepath.Join(tb.RepoRoot, "manifests", "crds", "*.yaml"))
		if len(crds) > 0 {
			if _, err := tb.Dynamic.Resource(testbed.PeerGVR).List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("listing peers: %v", err)
			}
		} else {
			t.Logf("no CRDs in manifests/crds yet")
		}
		out, err := tb.Kubectl(ctx, "get", "nodes", "-o", "wide")
		if err != nil {
			t.Error(err)
		}
		t.Logf("kubectl get nodes:\n%s", out)
	})

	t.Run("node objects", func(t *testing.T) {
		for _, n := range []*testbed.Node{a1, a2, b1, c1} {
			obj, err := tb.NodeObject(ctx, n.Name)
			if err != nil {
				t.Fatal(err)
			}
			if obj.Labels[testbed.LabelRegion] != n.Location.Name {
				t.Errorf("%s: region label %q", n.Name, obj.Labels[testbed.LabelRegion])
			}
			if obj.Spec.PodCIDRs[0] != n.PodCIDR.String() {
				t.Errorf("%s: podCIDRs %v", n.Name, obj.Spec.PodCIDRs)
			}
			if len(obj.Status.Addresses) == 0 || obj.Status.Addresses[0].Address != n.IP.String() {
				t.Errorf("%s: addresses %v", n.Name, obj.Status.Addresses)
			}
		}
		obj, _ := tb.NodeObject(ctx, a1.Name)
		if len(obj.Spec.PodCIDRs) != 2 || obj.Spec.PodCIDRs[1] != a1.PodCIDR6.String() {
			t.Errorf("a1 dual-stack podCIDRs %v", obj.Spec.PodCIDRs)
		}
	})

	t.Run("underlay", func(t *testing.T) {
		ping := func(from *testbed.Node, to string) {
			if out, err := from.Exec(ctx, "ping", "-n", "-q", "-c", "1", "-W", "2", to); err != nil {
				t.Errorf("%s -> %s: %v %s", from.Name, to, err, out)
			}
		}
		ping(a1, a2.IP.String())     // same location
		ping(a1, b1.IP.String())     // across the router
		ping(a1, b1.IP6.String())    // IPv6 across the router
		ping(c1, a1.IP.String())     // out of the NATed location
		ping(a1, laptop.IP.String()) // to the outside host
		ping(b1, testbed.APIServerAddr.String())
		// The NATed location is not reachable from outside.
		if _, err := a1.Exec(ctx, "ping", "-n", "-q", "-c", "1", "-W", "1", c1.IP.String()); err == nil {
			t.Errorf("a1 reached c1's private address through the NAT")
		}
		// The API server from a node (and through the NAT).
		for _, n := range []*testbed.Node{a1, c1} {
			out, err := n.Exec(ctx, "curl", "-sS", "--max-time", "5", "--cacert", filepath.Join(tb.Dir, "controlplane", "certs", "apiserver.crt"),
				"-H", "Authorization: Bearer "+tb.Token, fmt.Sprintf("https://%s:%d/readyz", testbed.APIServerAddr, testbed.APIServerPort))
			if err != nil || strings.TrimSpace(out) != "ok" {
				t.Errorf("%s: API server /readyz: %v %q", n.Name, err, out)
			}
		}
	})

	t.Run("private /var/run/wireguard", func(t *testing.T) {
		if _, err := a1.Exec(ctx, "touch", "/var/run/wireguard/probe"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(a1.Dir, "run", "wireguard", "probe")); err != nil {
			t.Errorf("a1's probe not in its directory: %v", err)
		}
		if out, err := a2.Exec(ctx, "ls", "-A", "/var/run/wireguard"); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("a2 sees %q (%v)", out, err)
		}
		if _, err := os.Stat("/run/wireguard/probe"); err == nil {
			t.Errorf("probe leaked to the host's /run/wireguard")
		}
		if out, err := a1.Exec(ctx, "wg", "show"); err != nil {
			t.Errorf("wg show in a node: %v %s", err, out)
		}
	})

	t.Run("pods", func(t *testing.T) {
		p0 := pod(a1)
		s.pingOK(p0, a1p1.IP, 2)
		s.pingOK(p0, a1p1.IP6, 2)
		if err := p0.Transfer(ctx, a1p1, a1p1.IP, 1<<20); err != nil {
			t.Error(err)
		}
		if err := p0.Transfer(ctx, a1p1, a1p1.IP6, 1<<20); err != nil {
			t.Error(err)
		}
		s.pingOK(p0, a1.IP, 1) // pod -> own node's underlay address
		// Without meshd pods on different nodes cannot reach each other.
		for _, n := range []*testbed.Node{a2, b1} {
			if err := p0.Ping(ctx, pod(n).IP, 1); err == nil {
				t.Errorf("pod on a1 reached pod on %s without meshd", n.Name)
			}
		}
	})

	t.Run("host untouched", func(t *testing.T) {
		b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		if strings.TrimSpace(string(b)) != "0" {
			t.Errorf("host ip_forward = %s", b)
		}
		out, _ := exec(ctx, "ip", "-br", "link")
		for _, l := range lines(out) {
			if strings.HasPrefix(l, "br-") || strings.HasPrefix(l, "v-") || strings.HasPrefix(l, "cni0") {
				t.Errorf("testbed interface in the host namespace: %s", l)
			}
		}
	})
}
