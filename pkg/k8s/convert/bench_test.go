package convert

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// benchNodes are n Nodes as a full mesh's nodes publish them: key,
// endpoint, internal and mesh IP, and the discovered endpoints of
// DiscoveredLimit peers.
func benchNodes(b testing.TB, n int) []*corev1.Node {
	b.Helper()
	keys := make([]wgtypes.Key, n)
	for i := range keys {
		keys[i] = wgtypes.Key{0: byte(i >> 8), 1: byte(i), 31: 1}
	}
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)}) }
	out := make([]*corev1.Node, n)
	for i := range out {
		eps := map[string]string{}
		for j := 1; j <= min(DiscoveredLimit, n-1); j++ {
			k := (i + j) % n
			eps[keys[k].String()] = netip.AddrPortFrom(addr(k), 51820).String()
		}
		d, err := json.Marshal(eps)
		if err != nil {
			b.Fatal(err)
		}
		pod := fmt.Sprintf("10.%d.%d.0/24", 200+i/256, i%256)
		out[i] = &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("node-%d", i), UID: "uid", ResourceVersion: fmt.Sprint(i + 1),
				Labels: map[string]string{DefaultTopologyLabel: fmt.Sprintf("zone-%d", i%10)},
				Annotations: map[string]string{
					AnnotationPublicKey:           keys[i].String(),
					AnnotationEndpoint:            netip.AddrPortFrom(addr(i), 51820).String(),
					AnnotationInternalIP:          addr(i).String(),
					AnnotationWireGuardIP:         netip.AddrFrom4([4]byte{10, 4, byte(i >> 8), byte(i)}).String(),
					AnnotationDiscoveredEndpoints: string(d),
				},
			},
			Spec:   corev1.NodeSpec{PodCIDR: pod, PodCIDRs: []string{pod}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr(i).String()}}},
		}
	}
	return out
}

// BenchmarkNewMeshInput1000 converts 1,000 unchanged Nodes, as every
// reconcile does: parsed each time, and through a NodeCache.
func BenchmarkNewMeshInput1000(b *testing.B) {
	nodes := benchNodes(b, 1000)
	ctx := context.Background()
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			NewMeshInput(ctx, nodes, nil, MeshInputOptions{})
		}
	})
	b.Run("cached", func(b *testing.B) {
		var c NodeCache
		NewMeshInput(ctx, nodes, nil, MeshInputOptions{Nodes: &c})
		b.ReportAllocs()
		for b.Loop() {
			NewMeshInput(ctx, nodes, nil, MeshInputOptions{Nodes: &c})
		}
		if c.Parsed != 0 {
			b.Fatalf("%d unchanged Nodes parsed again", c.Parsed)
		}
	})
}
