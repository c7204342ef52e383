package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"

	"meshd.io/meshd/pkg/k8s/convert"
)

// TestPublishedDiscoveredEndpointsLimited: with handshakes to more peers
// than convert.DiscoveredLimit, a node publishes the discovered endpoints
// of every node behind NAT (a persistent keepalive) and DiscoveredLimit
// others, not one per peer; later handshakes change nothing published.
func TestPublishedDiscoveredEndpointsLimited(t *testing.T) {
	ctx := context.Background()
	nodes := []*corev1.Node{testNode("a1", "self", "172.16.0.1", "10.42.0.0/24", newKey(t))}
	natted := map[wgtypes.Key]bool{}
	for i := range convert.DiscoveredLimit + 20 {
		k := newKey(t)
		n := testNode(fmt.Sprintf("n%d", i), fmt.Sprintf("r%d", i), fmt.Sprintf("172.16.1.%d", i+1), fmt.Sprintf("10.43.%d.0/24", i), k)
		if i%10 == 0 {
			n.Annotations[convert.AnnotationPersistentKeepalive] = "25"
			natted[k.PublicKey()] = true
		}
		nodes = append(nodes, n)
	}
	f := newFakes(t, "a1", nodes...)
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	handshakes := func(at time.Time) {
		dev, err := f.wgc.Device("meshd0")
		if err != nil {
			t.Fatal(err)
		}
		if len(dev.Peers) != len(nodes)-1 {
			t.Fatalf("%d WireGuard peers, want %d", len(dev.Peers), len(nodes)-1)
		}
		for _, p := range dev.Peers {
			f.wgc.SetHandshake("meshd0", p.PublicKey, at)
		}
	}
	handshakes(time.Now())
	f.refresh(t)
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	published := func() map[wgtypes.Key]bool {
		n, _ := convert.NodeFromObject(f.node(t, "a1"), f.rec.parseOptions())
		out := map[wgtypes.Key]bool{}
		for k := range n.DiscoveredEndpoints {
			out[k] = true
		}
		return out
	}
	first := published()
	if want := convert.DiscoveredLimit + len(natted); len(first) != want {
		t.Errorf("%d discovered endpoints published, want %d (%d behind NAT + %d others)", len(first), want, len(natted), convert.DiscoveredLimit)
	}
	for k := range natted {
		if !first[k] {
			t.Errorf("the endpoint of %s, behind NAT, is not published", k)
		}
	}

	settled := f.counters()
	for i := 1; i <= 3; i++ {
		handshakes(time.Now().Add(time.Duration(i) * time.Minute))
		f.refresh(t)
		if err := f.rec.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.counters(); got.patches != settled.patches {
		t.Errorf("later handshakes caused %d Node writes", got.patches-settled.patches)
	}
	if again := published(); len(again) != len(first) {
		t.Errorf("published set changed: %d entries, then %d", len(first), len(again))
	}
}
