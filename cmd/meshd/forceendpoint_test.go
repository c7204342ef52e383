package main

import (
	"context"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestForceEndpointHostResolved: a node's meshd.io/force-endpoint may name
// a host (docs/annotations.md); it is resolved like a Peer's endpoint, so
// the other leaders configure the node's peer with its address, instead
// of with no endpoint and no word about it.
func TestForceEndpointHostResolved(t *testing.T) {
	kb := newKey(t)
	b1 := testNode("b1", "b", "198.51.100.21", "10.42.2.0/24", kb)
	b1.Annotations["meshd.io/force-endpoint"] = "localhost:51999"
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		b1,
	)
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := f.peer(t, kb)
	if p == nil {
		t.Fatal("no peer for b1")
	}
	if p.Endpoint == nil || p.Endpoint.Port != 51999 || !p.Endpoint.IP.IsLoopback() {
		t.Errorf("b1's force-endpoint localhost:51999: its peer on a1 has endpoint %v", p.Endpoint)
	}
}
