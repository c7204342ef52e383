package main

import (
	"context"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"meshd.io/meshd/pkg/k8s/convert"
)

// TestSettingsPublishedOnce: the effective settings are published on the
// node's own Node with its other annotations, and unchanged settings cost
// no further write.
func TestSettingsPublishedOnce(t *testing.T) {
	ctx := context.Background()
	var c config
	if err := newFlagSet(&c).Parse([]string{"--hostname", "a1", "--mesh-cidr", "10.4.0.0/16,fd4d::/64", "--port", "51999", "--listen", "198.51.100.11:9477"}); err != nil {
		t.Fatal(err)
	}
	opts, err := c.options()
	if err != nil {
		t.Fatal(err)
	}
	s := c.publishedSettings(opts.MeshCIDRs, opts.ServiceCIDRs)
	if s.Port != 51999 || len(s.MeshCIDRs) != 2 || s.LeaseDuration != "40s" || s.ListenPort != 9477 || s.ListenLoopback || s.ProbePort != 51821 {
		t.Fatalf("settings %+v", s)
	}
	c.Listen = "127.0.0.1:9477"
	if !c.publishedSettings(nil, nil).ListenLoopback {
		t.Error("127.0.0.1 not seen as loopback")
	}

	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	)
	f.rec.settings = s.Encode()
	for range 3 {
		if err := f.rec.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		f.refresh(t)
	}
	settled := f.counters()
	me, err := f.kube.CoreV1().Nodes().Get(ctx, "a1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := convert.ParseSettings(me.Annotations[convert.AnnotationSettings])
	if err != nil || got.Port != 51999 || got.Encode() != s.Encode() {
		t.Fatalf("published %q (%v)", me.Annotations[convert.AnnotationSettings], err)
	}
	for range 3 {
		if err := f.rec.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		f.refresh(t)
	}
	if now := f.counters(); now.patches != settled.patches {
		t.Errorf("unchanged settings written again: %d patches, then %d", settled.patches, now.patches)
	}
	// A restart with other flags publishes once more.
	s.Port = 51000
	f.rec.settings = s.Encode()
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if now := f.counters(); now.patches != settled.patches+1 {
		t.Errorf("changed settings: %d patches, want %d", now.patches, settled.patches+1)
	}
}
