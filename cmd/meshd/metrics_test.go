package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/wg"
)

// TestMetricsFromPlan: after a reconcile the gauges tell the applied plan:
// WireGuard peers by kind (matching the device), Peer objects, the leader
// with its location, and the build.
func TestMetricsFromPlan(t *testing.T) {
	peerKey := newKey(t)
	// b1 is alone in location b: it leads it and peers with location a's
	// leader and with the Peer.
	f := newFakes(t, "b1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", newKey(t)),
		testNode("a2", "a", "198.51.100.12", "10.42.2.0/24", newKey(t)),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	)
	f.rec.peerLister = sliceLister{&v1alpha1.Peer{
		ObjectMeta: metav1.ObjectMeta{Name: "laptop"},
		Spec:       v1alpha1.PeerSpec{PublicKey: peerKey.PublicKey().String(), AllowedIPs: []string{"10.5.0.1/32"}},
	}}
	reg := prometheus.NewRegistry()
	f.rec.metrics = newMetrics(reg, f.dev)
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := f.rec.metrics
	want := map[string]float64{"node": 0, "location": 1, "peer": 1, "cluster": 0}
	sum := 0.0
	for kind, n := range want {
		got := testutil.ToFloat64(m.wgPeers.WithLabelValues(kind))
		if got != n {
			t.Errorf("meshd_wireguard_peers{kind=%q} = %v, want %v", kind, got, n)
		}
		sum += got
	}
	dev, err := f.wgc.Device("meshd0")
	if err != nil {
		t.Fatal(err)
	}
	if int(sum) != len(dev.Peers) {
		t.Errorf("meshd_wireguard_peers sums to %v, the device has %d peers", sum, len(dev.Peers))
	}
	if got := testutil.ToFloat64(m.peers); got != 1 {
		t.Errorf("meshd_peer_objects = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.leader.WithLabelValues("b")); got != 1 {
		t.Errorf(`meshd_leader{location="b"} = %v, want 1`, got)
	}
	if n := testutil.CollectAndCount(m.leader); n != 1 {
		t.Errorf("meshd_leader has %d series, want 1", n)
	}
	if got := testutil.ToFloat64(m.buildInfo.WithLabelValues(version, runtime.Version())); got != 1 {
		t.Errorf("meshd_build_info = %v, want 1", got)
	}
	// The handshake metric is a timestamp, named so; one series per peer.
	if n, err := testutil.GatherAndCount(reg, "meshd_wireguard_peer_last_handshake_timestamp_seconds"); err != nil || n != len(dev.Peers) {
		t.Errorf("handshake series %d (%v), want %d", n, err, len(dev.Peers))
	}
}

// TestMetricsDocumented: every meshd_* metric meshd exports is in
// docs/metrics.md, and the renamed ones are not there under their old names
// except as such.
func TestMetricsDocumented(t *testing.T) {
	f := newFakes(t, "b1", testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)))
	reg := prometheus.NewRegistry()
	f.rec.metrics = newMetrics(reg, f.dev)
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The request counter lives with client-go's metrics (one series is
	// enough for it to be gathered).
	newClientGoMetrics(reg).Increment(context.Background(), "200", "GET", "")
	// The lazy-peer series exist with --wireguard-lazy-peers only.
	reg.MustRegister(lazyPeerMetrics(func() (wg.LazyStats, bool) { return wg.LazyStats{Idle: 1, Activations: 2, Trims: 3}, true }))
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "meshd_") {
			continue
		}
		seen++
		if !strings.Contains(string(doc), "| `"+name+"` |") {
			t.Errorf("metric %s is not documented in docs/metrics.md", name)
		}
	}
	if seen < 10 {
		t.Fatalf("only %d meshd_ metrics gathered", seen)
	}
	for _, old := range []string{"`meshd_peers`", "`meshd_wireguard_peer_last_handshake_seconds`"} {
		for _, l := range strings.Split(string(doc), "\n") {
			if strings.Contains(l, old) && !strings.Contains(l, "0.1.0 called it "+old) {
				t.Errorf("docs/metrics.md uses the old name %s: %s", old, l)
			}
		}
	}
}
