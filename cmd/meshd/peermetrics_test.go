package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/mesh"
)

// TestPeerMetricsLimit: in a full mesh of 6 nodes plus a Peer, a limit of 2
// keeps the per-peer series of the Peer and one node (Peers rank first),
// reports the 4 others as omitted, and still counts every peer by kind.
func TestPeerMetricsLimit(t *testing.T) {
	var nodes []*corev1.Node
	for i := 1; i <= 6; i++ {
		name := fmt.Sprintf("n%d", i)
		nodes = append(nodes, testNode(name, name, fmt.Sprintf("198.51.100.%d", 10+i), fmt.Sprintf("10.42.%d.0/24", i), newKey(t)))
	}
	f := newFakes(t, "n1", nodes...)
	f.rec.opts.Granularity = mesh.GranularityFull
	f.rec.peerLister = sliceLister{&v1alpha1.Peer{
		ObjectMeta: metav1.ObjectMeta{Name: "zz-laptop"},
		Spec:       v1alpha1.PeerSpec{PublicKey: newKey(t).PublicKey().String(), AllowedIPs: []string{"10.5.0.1/32"}},
	}}
	reg := prometheus.NewRegistry()
	f.rec.metrics = newMetrics(reg, f.dev)
	f.rec.metrics.setPeerSeriesLimit(2)
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	const handshake = "meshd_wireguard_peer_last_handshake_timestamp_seconds"
	if n, err := testutil.GatherAndCount(reg, handshake); err != nil || n != 2 {
		t.Fatalf("%s: %d series (%v), want the limit 2", handshake, n, err)
	}
	mfs, _ := reg.Gather()
	var peersWithSeries []string
	for _, mf := range mfs {
		if mf.GetName() == handshake {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "peer" {
						peersWithSeries = append(peersWithSeries, l.GetValue())
					}
				}
			}
		}
	}
	if got := strings.Join(peersWithSeries, ","); !strings.Contains(got, "zz-laptop") || !strings.Contains(got, "n2") {
		t.Errorf("per-peer series for %s, want the Peer zz-laptop and node n2", got)
	}
	want := `
# HELP meshd_wireguard_peer_series_omitted WireGuard peers of this node without meshd_wireguard_peer_* series because of --peer-metrics-limit.
# TYPE meshd_wireguard_peer_series_omitted gauge
meshd_wireguard_peer_series_omitted 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshd_wireguard_peer_series_omitted"); err != nil {
		t.Error(err)
	}
	// No handshakes in the fake: none recent, all kinds present.
	if n, err := testutil.GatherAndCount(reg, "meshd_wireguard_peers_handshake_recent"); err != nil || n != len(wireGuardPeerKinds) {
		t.Errorf("meshd_wireguard_peers_handshake_recent: %d series (%v)", n, err)
	}

	f.rec.metrics.setPeerSeriesLimit(0)
	if n, err := testutil.GatherAndCount(reg, handshake); err != nil || n != 0 {
		t.Errorf("limit 0: %d per-peer series (%v), want none", n, err)
	}
}

// clientGoOnce holds the one client-go registration of this test process
// (client-go accepts one per process; -count=N runs the test N times).
var clientGoOnce struct {
	sync.Once
	reg *prometheus.Registry
	c   *clientGoMetrics
}

// clientGoRegistered makes the test process's one client-go registration
// (every test that may register calls it first, whatever their order).
func clientGoRegistered() (*prometheus.Registry, *clientGoMetrics) {
	clientGoOnce.Do(func() {
		clientGoOnce.reg = prometheus.NewRegistry()
		clientGoOnce.c = newClientGoMetrics(clientGoOnce.reg)
		clientGoOnce.c.register()
	})
	return clientGoOnce.reg, clientGoOnce.c
}

// TestClientGoMetrics: a work queue and a REST client report to the
// registry under client-go's usual names.
func TestClientGoMetrics(t *testing.T) {
	reg, c := clientGoRegistered()
	adds0 := testutil.ToFloat64(c.addsTotal.WithLabelValues("test"))
	retries0 := testutil.ToFloat64(c.retriesTotal.WithLabelValues("test"))
	gets0 := testutil.ToFloat64(c.results.WithLabelValues("GET", "200"))
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "test", MetricsProvider: c})
	q.Add("a")
	q.AddRateLimited("b")
	item, _ := q.Get()
	time.Sleep(time.Millisecond)
	q.Done(item)
	q.ShutDown()
	if got := testutil.ToFloat64(c.addsTotal.WithLabelValues("test")) - adds0; got < 1 {
		t.Errorf("workqueue_adds_total{name=test} grew by %v", got)
	}
	if got := testutil.ToFloat64(c.retriesTotal.WithLabelValues("test")) - retries0; got != 1 {
		t.Errorf("workqueue_retries_total{name=test} grew by %v, want 1", got)
	}
	if n := testutil.CollectAndCount(c.workDuration); n != 1 {
		t.Errorf("workqueue_work_duration_seconds: %d series", n)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"}}`)
	}))
	defer srv.Close()
	kc, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(c.results.WithLabelValues("GET", "200")) - gets0; got != 1 {
		t.Errorf("meshd_api_requests_total{method=GET,code=200} grew by %v, want 1", got)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "rest_client_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "host" && l.GetValue() == host && m.GetHistogram().GetSampleCount() == 1 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("rest_client_request_duration_seconds has no sample for host %s", host)
	}
}

// TestControllerRegistry: the /metrics of `meshd mirror`, `meshd link` and
// `meshd dns` carry client-go's request and work queue metrics (their
// queues are "mirror" and "mcs"), the Go and process metrics and the
// subcommand's own collectors.
func TestControllerRegistry(t *testing.T) {
	clientGoRegistered() // controllerRegistry's own registration is then a no-op
	own := prometheus.NewCounter(prometheus.CounterOpts{Name: "meshd_test_own_total", Help: "A subcommand's own metric."})
	reg, c := controllerRegistry(own)
	own.Inc()
	c.Increment(context.Background(), "200", "GET", "")
	c.NewDepthMetric("mirror").Inc()
	c.NewAddsMetric("mcs").Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, want := range []string{"meshd_test_own_total", "meshd_api_requests_total", "workqueue_depth", "workqueue_adds_total", "go_goroutines", "process_resident_memory_bytes"} {
		if !got[want] {
			t.Errorf("the controllers' registry has no %s", want)
		}
	}
}
