package k8s

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
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
			return []byte(psk.String()), &StaleError{Err: errors.New("Secret meshd-system/psk not found")}
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
