//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/e2e/testbed"
)

// TestAPIServerBehindClusterIP: meshd in a Pod dials the kubernetes
// Service's ClusterIP (KUBERNETES_SERVICE_HOST), and kube-proxy sends the
// connection to the API server's own address, an endpoint of the
// EndpointSlice default/kubernetes. Here a node's meshd dials
// https://10.96.0.1:443 through the node's real kube-proxy, as in a Pod. A
// Peer whose allowed IPs cover the API server's own address (not the
// ClusterIP) would route that connection into the tunnel: meshd refuses
// that allowed IP (Warning Event on the Peer), keeps the Peer's others,
// and stays connected. Before meshd read the EndpointSlice, only the
// ClusterIP was protected, and the node cut itself off.
func TestAPIServerBehindClusterIP(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	if err := tb.EnsureKubeProxy(ctx); err != nil {
		t.Fatal(err)
	}
	s.location("a", false)
	n1 := s.node(testbed.NodeOptions{Name: "a1", Location: "a"})
	if _, err := n1.StartKubeProxy(ctx); err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile(tb.MeshdKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	direct := fmt.Sprintf("https://%s:%d", testbed.APIServerAddr, testbed.APIServerPort)
	const clusterIP = "10.96.0.1" // the first address of testbed.ServiceCIDR: the kubernetes Service
	if !strings.Contains(string(kc), direct) {
		t.Fatalf("%s does not name %s", tb.MeshdKubeconfig, direct)
	}
	viaService := filepath.Join(n1.Dir, "meshd-clusterip.kubeconfig")
	if err := os.WriteFile(viaService, []byte(strings.ReplaceAll(string(kc), direct, "https://"+clusterIP+":443")), 0o600); err != nil {
		t.Fatal(err)
	}
	s.startMeshd([]*testbed.Node{n1}, "--kubeconfig", viaService, "--mesh-granularity", "full")
	s.eventually(30*time.Second, 200*time.Millisecond, "meshd logs the API server's own address", func() error {
		b, err := os.ReadFile(n1.MeshdLog())
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "API server addresses") && strings.Contains(l, testbed.APIServerAddr.String()) && strings.Contains(l, clusterIP) {
				t.Logf("meshd on %s: %s", n1.Name, l)
				return nil
			}
		}
		return fmt.Errorf("no log line with the API server addresses %s and %s", clusterIP, testbed.APIServerAddr)
	})

	key := randomKey()
	api := testbed.APIServerAddr.String() + "/32"
	if _, err := tb.Dynamic.Resource(testbed.PeerGVR).Create(ctx, peerObject("covers-api", map[string]any{
		"publicKey":  key,
		"allowedIPs": []any{"10.5.0.9/32", api},
		"endpoint":   map[string]any{"host": "203.0.113.50", "port": int64(51820)},
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.eventually(30*time.Second, 200*time.Millisecond, "the Peer configured without the API server's address", func() error {
		d, err := n1.WG(ctx, "meshd0")
		if err != nil {
			return err
		}
		p := d.Peer(key)
		if p == nil {
			return fmt.Errorf("no WireGuard peer for the Peer")
		}
		if !slices.Equal(p.AllowedIPs, []string{"10.5.0.9/32"}) {
			return fmt.Errorf("allowed IPs %v, want only 10.5.0.9/32", p.AllowedIPs)
		}
		return nil
	})
	s.eventually(30*time.Second, 500*time.Millisecond, "a Warning Event refusing the API server's address", func() error {
		evs, err := tb.Kube.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Peer,involvedObject.name=covers-api"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type == "Warning" && e.Reason == "InvalidPeer" && strings.Contains(e.Message, "allowed IP "+api+" covers the API server") {
				t.Logf("Event %s/%s on Peer covers-api: %s", e.Type, e.Reason, e.Message)
				return nil
			}
		}
		return fmt.Errorf("%d Events on the Peer, none refusing %s", len(evs.Items), api)
	})
	// Still connected through the ClusterIP: the route to the API server is
	// not the tunnel, and meshd renews its Lease after the Peer was applied.
	applied := time.Now()
	out, err := n1.Exec(ctx, "ip", "route", "get", testbed.APIServerAddr.String())
	if err != nil || strings.Contains(out, "meshd0") {
		t.Fatalf("route to the API server: %v %s", err, out)
	}
	s.eventually(30*time.Second, time.Second, "meshd renews its Lease through the ClusterIP", func() error {
		l, err := tb.Kube.CoordinationV1().Leases(testbed.LeaseNamespace).Get(ctx, "meshd-"+n1.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(applied.Add(time.Second)) {
			return fmt.Errorf("last renewal %v, before the Peer was applied (%s)", l.Spec.RenewTime, applied.Format(time.RFC3339Nano))
		}
		return nil
	})
	if n1.Meshd().Exited() {
		t.Fatalf("meshd exited: %v", n1.Meshd().Err())
	}
}
