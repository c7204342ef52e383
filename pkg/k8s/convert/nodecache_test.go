package convert

import (
	"context"
	"maps"
	"net/netip"
	"reflect"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
)

// TestNodeCache: a conversion through the cache equals one without it, but
// for the discovered endpoints of nodes that do not use them; an unchanged
// object (same pointer, same resourceVersion) is not parsed again, anything
// else is, and so is every Node when the nodes using discovered endpoints
// change; what is handed out can be modified without changing the next
// conversion.
func TestNodeCache(t *testing.T) {
	ctx := context.Background()
	nodes := benchNodes(t, 6)
	nodes[2].Annotations[AnnotationPersistentKeepalive] = "soon" // a problem
	nodes[3].Annotations[AnnotationPersistentKeepalive] = "25"   // behind NAT
	var c NodeCache
	convert := func(o ParseOptions, nodes []*corev1.Node) MeshInput {
		t.Helper()
		got := NewMeshInput(ctx, nodes, nil, MeshInputOptions{Parse: o, Nodes: &c})
		want := NewMeshInput(ctx, nodes, nil, MeshInputOptions{Parse: o})
		needed := map[wgtypes.Key]bool{}
		for i := range want.Nodes {
			if n := &want.Nodes[i]; n.PublicKey != (wgtypes.Key{}) && n.PersistentKeepalive > 0 {
				needed[n.PublicKey] = true
			}
		}
		for i := range want.Nodes {
			maps.DeleteFunc(want.Nodes[i].DiscoveredEndpoints, func(k wgtypes.Key, _ netip.AddrPort) bool { return !needed[k] })
			if len(want.Nodes[i].DiscoveredEndpoints) == 0 {
				want.Nodes[i].DiscoveredEndpoints = nil
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("through the cache:\n%+v\nwithout, cut to the nodes behind NAT:\n%+v", got, want)
		}
		return got
	}
	parsed := func(want int) {
		t.Helper()
		if c.Parsed != want {
			t.Errorf("%d Nodes parsed, want %d", c.Parsed, want)
		}
	}
	o := ParseOptions{Port: 51820}
	in := convert(o, nodes)
	parsed(6)
	kept := 0
	for _, n := range in.Nodes {
		kept += len(n.DiscoveredEndpoints)
	}
	if kept != 5 { // every other node lists node-3, which is behind NAT
		t.Errorf("%d discovered endpoints kept, want 5 (node-3's)", kept)
	}
	in = convert(o, nodes)
	parsed(0)
	if len(in.Problems["node/node-2"]) != 1 {
		t.Errorf("problems from the cache: %v", in.Problems)
	}

	// What was handed out is the caller's (DiscoveredEndpoints aside).
	in.Nodes[0].InternalIPs[0] = in.Nodes[0].InternalIPs[0].Next()
	in.Nodes[0].PodCIDRs = nil
	convert(o, nodes)
	parsed(0)

	// A new object, an object edited with a new resourceVersion, and one
	// without a resourceVersion are parsed; a removed one is forgotten.
	n1 := nodes[1].DeepCopy()
	n1.Annotations[AnnotationLocation] = "elsewhere"
	nodes[1] = n1
	nodes[4].ResourceVersion = "100"
	nodes[4].Labels[DefaultTopologyLabel] = "moved"
	nodes[5].ResourceVersion = ""
	convert(o, nodes)
	parsed(3)
	convert(o, nodes[:4])
	parsed(0)
	convert(o, nodes)
	parsed(2) // node-4 was forgotten, node-5 is never kept

	// Another node behind NAT: every Node is parsed again, to keep its
	// endpoint too.
	n0 := nodes[0].DeepCopy()
	n0.ResourceVersion = "200"
	n0.Annotations[AnnotationPersistentKeepalive] = "25"
	nodes[0] = n0
	convert(o, nodes)
	parsed(6)
	convert(o, nodes)
	parsed(1)

	// Other parse options: everything is parsed again.
	convert(ParseOptions{Port: 51821}, nodes)
	parsed(6)
}
