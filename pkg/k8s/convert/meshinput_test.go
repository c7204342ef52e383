package convert

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/secrets"
)

func TestNewMeshInput(t *testing.T) {
	k, _ := wgtypes.GeneratePrivateKey()
	pk := k.PublicKey().String()
	nodes := []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Annotations: map[string]string{AnnotationPersistentKeepalive: "x"}}},
		nil,
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}},
	}
	peer := func(name, key, host string) *v1alpha1.Peer {
		p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.PeerSpec{PublicKey: key, AllowedIPs: []string{"10.5.0.1/32"}}}
		if host != "" {
			p.Spec.Endpoint = &v1alpha1.PeerEndpoint{Host: host, Port: 51821}
		}
		return p
	}
	peers := []*v1alpha1.Peer{peer("dns", pk, "vpn.example"), peer("gone", pk, "gone.example"), peer("bad", "nope", "")}
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		if host == "vpn.example" {
			return []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("::ffff:192.0.2.1")}, nil
		}
		return nil, errors.New("no such host")
	}
	in := NewMeshInput(context.Background(), nodes, peers, MeshInputOptions{Resolve: resolve})
	if len(in.Nodes) != 2 || in.Nodes[0].Name != "a" || in.Nodes[1].Name != "b" {
		t.Fatalf("nodes %+v", in.Nodes)
	}
	if len(in.Peers) != 2 {
		t.Fatalf("peers %+v", in.Peers)
	}
	if got := in.Peers[0].Endpoint; got.Host != "vpn.example" || got.Addr != netip.MustParseAddrPort("192.0.2.1:51821") {
		t.Errorf("dns endpoint %+v, want vpn.example resolved to 192.0.2.1:51821 (IPv4 preferred)", got)
	}
	if got := in.Peers[1].Endpoint; got.Host != "gone.example" || got.Addr.IsValid() || got.Addr.Port() != 51821 {
		t.Errorf("unresolved endpoint %+v", got)
	}
	for id, want := range map[string]string{
		"node/a":    "meshd.io/persistent-keepalive",
		"peer/gone": `resolving endpoint host "gone.example"`,
		"peer/bad":  "spec.publicKey",
	} {
		if ps := in.Problems[id]; len(ps) != 1 || !strings.Contains(ps[0].Error(), want) {
			t.Errorf("problems of %s = %v, want one containing %q", id, ps, want)
		}
	}
	if len(in.Problems) != 3 {
		t.Errorf("problems %v", in.Problems)
	}
}

func TestNewMeshInputCachedAndStale(t *testing.T) {
	k, _ := wgtypes.GeneratePrivateKey()
	psk, _ := wgtypes.GenerateKey()
	p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "office"}, Spec: v1alpha1.PeerSpec{
		PublicKey: k.PublicKey().String(), AllowedIPs: []string{"10.5.0.1/32"},
		Endpoint:              &v1alpha1.PeerEndpoint{Host: "vpn.example", Port: 51821},
		PresharedKeySecretRef: &v1alpha1.SecretKeyRef{Namespace: "meshd-system", Name: "psk", Key: "psk"},
	}}
	in := NewMeshInput(context.Background(), nil, []*v1alpha1.Peer{p}, MeshInputOptions{
		Secret: func(ns, name, key string) ([]byte, error) {
			return []byte(psk.String()), &secrets.StaleError{Err: errors.New("Secret meshd-system/psk not found")}
		},
		Resolve: func(context.Context, string) ([]netip.Addr, error) {
			t.Error("live DNS lookup with a cache")
			return nil, nil
		},
		Cached: func(string) (netip.Addr, error) { return netip.MustParseAddr("203.0.113.9"), nil },
	})
	if len(in.Peers) != 1 || in.Peers[0].PresharedKey == nil || *in.Peers[0].PresharedKey != psk {
		t.Fatalf("peers %+v: want the peer kept with its last known preshared key", in.Peers)
	}
	if in.Peers[0].Endpoint.Addr != netip.MustParseAddrPort("203.0.113.9:51821") {
		t.Errorf("endpoint %v", in.Peers[0].Endpoint)
	}
	if ps := in.Problems["peer/office"]; len(ps) != 1 || !strings.Contains(ps[0].Error(), "keeping the last known preshared key") {
		t.Errorf("problems %v", ps)
	}
}

// A Peer allowed IP that covers a node's underlay address, a node's or
// another Peer's WireGuard endpoint or the API server is refused and
// reported on that Peer; its other allowed IPs stay.
func TestNewMeshInputGuardsPeers(t *testing.T) {
	k, _ := wgtypes.GeneratePrivateKey()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{AnnotationEndpoint: "203.0.113.50:51820"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.51.100.10"}}}}
	peer := func(name string, endpoint string, allowed ...string) *v1alpha1.Peer {
		p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.PeerSpec{PublicKey: k.PublicKey().String(), AllowedIPs: allowed}}
		if endpoint != "" {
			p.Spec.Endpoint = &v1alpha1.PeerEndpoint{Host: endpoint, Port: 51820}
		}
		return p
	}
	peers := []*v1alpha1.Peer{
		peer("laptop", "", "10.5.0.1/32"),
		peer("underlay", "", "10.5.0.2/32", "198.51.100.0/24"),
		peer("endpoint", "", "203.0.113.0/24"),
		peer("site", "192.168.1.1", "10.6.0.0/16", "192.168.0.0/16"),
		peer("api", "", "172.16.0.0/12"),
	}
	in := NewMeshInput(context.Background(), []*corev1.Node{node}, peers, MeshInputOptions{APIServers: []netip.Addr{netip.MustParseAddr("172.16.5.5")}})
	want := map[string]struct{ kept, problem string }{
		"laptop":   {"[10.5.0.1/32]", ""},
		"underlay": {"[10.5.0.2/32]", "198.51.100.0/24 covers the underlay address of node n1"},
		"endpoint": {"[]", "203.0.113.0/24 covers the WireGuard endpoint of node n1"},
		"site":     {"[10.6.0.0/16]", "192.168.0.0/16 covers the WireGuard endpoint of Peer site"},
		"api":      {"[]", "172.16.0.0/12 covers the API server"},
	}
	for _, p := range in.Peers {
		w := want[p.Name]
		if got := fmt.Sprint(p.AllowedIPs); got != w.kept {
			t.Errorf("%s routes %s, want %s", p.Name, got, w.kept)
		}
		ps := in.Problems["peer/"+p.Name]
		if w.problem == "" && len(ps) != 0 || w.problem != "" && (len(ps) != 1 || !strings.Contains(ps[0].Error(), w.problem)) {
			t.Errorf("%s: problems %v, want %q", p.Name, ps, w.problem)
		}
	}
	if len(in.Peers) != len(want) {
		t.Errorf("peers %v", in.Peers)
	}
}

// An allowed-location-ips range covering the API server would make every
// other location route the API server into the tunnel to that location
// (and lose it, with its mesh configuration, whenever the tunnel is down):
// it is refused and reported on the Node, the node's other ranges kept,
// as a Peer's allowed IP covering it is; through the NodeCache too, every
// reconcile.
func TestNewMeshInputGuardsAllowedLocationIPs(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "office-1", ResourceVersion: "7", Annotations: map[string]string{
		AnnotationLocation: "office", AnnotationAllowedLocationIPs: "172.16.0.0/12, 192.168.50.0/24", AnnotationLeader: "maybe"}}}
	api := []netip.Addr{netip.MustParseAddr("172.16.5.5")}
	cache := &NodeCache{}
	for _, o := range []MeshInputOptions{{APIServers: api}, {APIServers: api, Nodes: cache}, {APIServers: api, Nodes: cache}} {
		in := NewMeshInput(context.Background(), []*corev1.Node{node}, nil, o)
		if len(in.Nodes) != 1 || fmt.Sprint(in.Nodes[0].AllowedLocationIPs) != "[192.168.50.0/24]" {
			t.Fatalf("nodes %+v, want office-1 routing 192.168.50.0/24 only", in.Nodes)
		}
		ps := in.Problems["node/office-1"]
		if len(ps) != 2 || !strings.Contains(ps[1].Error(), AnnotationAllowedLocationIPs) || !strings.Contains(ps[1].Error(), "172.16.0.0/12 covers the API server (172.16.5.5)") {
			t.Errorf("problems %v, want the malformed leader annotation and the refused range", ps)
		}
	}
	// Without a known API server address nothing is refused.
	in := NewMeshInput(context.Background(), []*corev1.Node{node}, nil, MeshInputOptions{})
	if fmt.Sprint(in.Nodes[0].AllowedLocationIPs) != "[172.16.0.0/12 192.168.50.0/24]" {
		t.Errorf("without API server addresses: %v", in.Nodes[0].AllowedLocationIPs)
	}
}

// A node's meshd.io/force-endpoint naming a host is resolved like a Peer's
// endpoint (the cache when given); a failure is a problem of that Node,
// which keeps the host name, and the cached Node is not changed.
func TestNewMeshInputResolvesForcedEndpointHost(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", ResourceVersion: "3", Annotations: map[string]string{
		AnnotationForceEndpoint: "edge.example.com:51999"}}}
	cache := &NodeCache{}
	answers := map[string]netip.Addr{"edge.example.com": netip.MustParseAddr("203.0.113.7")}
	lookup := func(host string) (netip.Addr, error) {
		if a, ok := answers[host]; ok {
			return a, nil
		}
		return netip.Addr{}, fmt.Errorf("no such host")
	}
	in := NewMeshInput(context.Background(), []*corev1.Node{node}, nil, MeshInputOptions{Cached: lookup, Nodes: cache})
	if got := in.Nodes[0].Endpoint; got.Addr != netip.MustParseAddrPort("203.0.113.7:51999") || got.Host != "edge.example.com" || len(in.Problems["node/edge-1"]) != 0 {
		t.Errorf("endpoint %+v, problems %v", got, in.Problems["node/edge-1"])
	}
	delete(answers, "edge.example.com")
	in = NewMeshInput(context.Background(), []*corev1.Node{node}, nil, MeshInputOptions{Cached: lookup, Nodes: cache})
	ps := in.Problems["node/edge-1"]
	if got := in.Nodes[0].Endpoint; got.Addr.Addr().IsValid() || len(ps) != 1 || !strings.Contains(ps[0].Error(), AnnotationForceEndpoint) || !strings.Contains(ps[0].Error(), `resolving endpoint host "edge.example.com"`) {
		t.Errorf("unresolved: endpoint %+v (want none, from a cache the first lookup did not change), problems %v", got, ps)
	}
}
