package main

import (
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/wg"
)

// metrics are the daemon's Prometheus metrics (docs/metrics.md lists them).
type metrics struct {
	reconciles *prometheus.CounterVec
	errors     *prometheus.CounterVec
	repairs    *prometheus.CounterVec
	duration   prometheus.Histogram
	nodes      prometheus.Gauge
	peers      prometheus.Gauge
	wgPeers    *prometheus.GaugeVec
	leader     *prometheus.GaugeVec
	buildInfo  *prometheus.GaugeVec
	panics     prometheus.Counter
	staleLinks prometheus.Gauge
	// filtered counts Node updates dropped before the queue (nothing the
	// planner reads changed).
	filtered    prometheus.Counter
	refused     *prometheus.GaugeVec
	tokenExpiry *prometheus.GaugeVec
	// keyRotations counts completed rotations of this node's key (rotate.go).
	keyRotations prometheus.Counter

	mu    sync.Mutex
	names map[wgtypes.Key]string // WireGuard peer key → node, location or Peer name
	kinds map[wgtypes.Key]string // WireGuard peer key → kind (wireGuardPeerKinds)
	// peerSeries bounds the per-peer series (peermetrics.go).
	peerSeries peerSeriesLimit
}

func newMetrics(reg prometheus.Registerer, dev statsReader) *metrics {
	m := &metrics{
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshd_reconciles_total", Help: "Reconciles by result (success, error).",
		}, []string{"result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshd_reconcile_errors_total", Help: "Reconcile errors by phase (snapshot, plan, wireguard, routes, iptables, publish).",
		}, []string{"phase"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshd_repairs_total", Help: "Outside changes to meshd's kernel state that triggered a repair, by executor.",
		}, []string{"executor"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "meshd_reconcile_duration_seconds", Help: "Duration of one reconcile (snapshot, plan, apply, publish).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshd_nodes", Help: "Nodes known to the mesh."}),
		peers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshd_peer_objects", Help: "Peer objects in the mesh (usable ones; linked clusters' leaders are not Peer objects)."}),
		wgPeers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_wireguard_peers", Help: "WireGuard peers of this node in the applied plan, by kind (node: a node of the mesh; location: another location's leader; peer: a Peer object; cluster: a linked cluster's leader).",
		}, []string{"kind"}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshd_leader", Help: "1 if this node leads its location (carries WireGuard traffic), else 0; location is the node's location."}, []string{"location"}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_build_info", Help: "Always 1; the labels tell meshd's version and the Go version it was built with.",
		}, []string{"version", "goversion"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshd_reconcile_panics_total", Help: "Reconciles that panicked (recovered; the node keeps its last applied state).",
		}),
		staleLinks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshd_linked_clusters_stale", Help: "Linked clusters whose peers come from their last known state (their Nodes not listed since meshd started or the link changed, or the link Secret unusable).",
		}),
		names: map[wgtypes.Key]string{},
		filtered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshd_node_updates_filtered_total", Help: "Node updates that changed nothing the planner reads, dropped before the reconcile queue.",
		}),
		refused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_cluster_link_refused_ranges",
			Help: "Ranges of a linked cluster that are refused, not routed, by reason (overlap: overlaps a local range; protected: covers a node's underlay address, a WireGuard endpoint or the API server; not-agreed: outside the ranges agreed at link time).",
		}, []string{"cluster", "reason"}),
		tokenExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_cluster_link_token_expiry_timestamp_seconds",
			Help: "Unix time at which the token of a linked cluster's link Secret expires (renew with meshctl link --refresh).",
		}, []string{"cluster"}),
	}
	for _, ph := range []string{"snapshot", "plan", "wireguard", "routes", "iptables", "publish"} {
		m.errors.WithLabelValues(ph)
	}
	for _, k := range wireGuardPeerKinds {
		m.wgPeers.WithLabelValues(k)
	}
	m.buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(m.reconciles, m.errors, m.repairs, m.duration, m.nodes, m.peers, m.wgPeers, m.leader, m.buildInfo, m.panics, m.staleLinks, m.filtered, m.refused, m.tokenExpiry,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.keyRotations = newKeyRotationsCounter(reg)
	if dev != nil {
		reg.MustRegister(&peerCollector{dev: dev, m: m})
	}
	return m
}

// registerClientMetrics makes client-go report this process's API requests
// (meshd_api_requests_total), their latencies and its work queues on reg
// (clientmetrics.go). client-go accepts one registration per process (the
// first wins): the daemon and each controller subcommand call it once, at
// start.
func registerClientMetrics(reg prometheus.Registerer) *clientGoMetrics {
	c := newClientGoMetrics(reg)
	c.register()
	return c
}

// controllerRegistry is the /metrics registry of a controller subcommand
// (mirror, link, dns): the Go and process collectors, client-go's request
// and work queue metrics (registered for the process) and cs.
func controllerRegistry(cs ...prometheus.Collector) (*prometheus.Registry, *clientGoMetrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(append([]prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}, cs...)...)
	return reg, registerClientMetrics(reg)
}

// executorWrites exposes the executors' own write counters as
// meshd_executor_writes_total{executor}: wireguard (ConfigureDevice and
// link writes), routes (netlink route and rule writes) and iptables
// (iptables-restore transactions, both families). Zero writes at idle is the
// sign of a settled node.
type executorWrites map[string]func() uint64

var descExecutorWrites = prometheus.NewDesc("meshd_executor_writes_total",
	"Writes to the kernel by executor (wireguard: device and link writes; routes: route and rule writes; iptables: restore transactions).",
	[]string{"executor"}, nil)

func (e executorWrites) Describe(ch chan<- *prometheus.Desc) { ch <- descExecutorWrites }

func (e executorWrites) Collect(ch chan<- prometheus.Metric) {
	for name, f := range e {
		ch <- prometheus.MustNewConstMetric(descExecutorWrites, prometheus.CounterValue, float64(f()), name)
	}
}

// lazyPeerMetrics exposes the lazy-peer layer of an in-process device
// (--wireguard-lazy-peers): nothing when the device has none.
type lazyPeerMetrics func() (wg.LazyStats, bool)

var (
	descLazyIdle = prometheus.NewDesc("meshd_wireguard_idle_peers",
		"Configured WireGuard peers kept out of the device until traffic (--wireguard-lazy-peers).", nil, nil)
	descLazyActivations = prometheus.NewDesc("meshd_wireguard_peer_activations_total",
		"Idle WireGuard peers put into the device by a packet to them or their handshake initiation (--wireguard-lazy-peers).", nil, nil)
	descLazyTrims = prometheus.NewDesc("meshd_wireguard_peer_trims_total",
		"WireGuard peers taken out of the device after 5 minutes without traffic (--wireguard-lazy-peers).", nil, nil)
	descLazyReplays = prometheus.NewDesc("meshd_wireguard_initiation_replays_total",
		"Handshake initiations refused as no later than their sender's last (replayed or duplicated; --wireguard-lazy-peers).", nil, nil)
)

func (l lazyPeerMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLazyIdle
	ch <- descLazyActivations
	ch <- descLazyTrims
	ch <- descLazyReplays
}

func (l lazyPeerMetrics) Collect(ch chan<- prometheus.Metric) {
	st, ok := l()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(descLazyIdle, prometheus.GaugeValue, float64(st.Idle))
	ch <- prometheus.MustNewConstMetric(descLazyActivations, prometheus.CounterValue, float64(st.Activations))
	ch <- prometheus.MustNewConstMetric(descLazyTrims, prometheus.CounterValue, float64(st.Trims))
	ch <- prometheus.MustNewConstMetric(descLazyReplays, prometheus.CounterValue, float64(st.Replays))
}

func (m *metrics) fail(phase string) { m.errors.WithLabelValues(phase).Inc() }

// linkState is what the metrics show of one linked cluster.
type linkState struct {
	expires time.Time // zero: unknown
	refused []error
}

// setLinks sets meshd_cluster_link_refused_ranges and
// meshd_cluster_link_token_expiry_timestamp_seconds for every linked cluster
// (by name); clusters gone are dropped.
func (m *metrics) setLinks(links map[string]linkState) {
	if m == nil {
		return
	}
	m.refused.Reset()
	m.tokenExpiry.Reset()
	for cluster, l := range links {
		counts := clusterlink.CountRefusals(l.refused)
		for _, reason := range mesh.RefusalReasons {
			m.refused.WithLabelValues(cluster, string(reason)).Set(float64(counts[reason]))
		}
		if !l.expires.IsZero() {
			m.tokenExpiry.WithLabelValues(cluster).Set(float64(l.expires.Unix()))
		}
	}
}

func (m *metrics) observe(d time.Duration, err error) {
	m.duration.Observe(d.Seconds())
	if err != nil {
		m.reconciles.WithLabelValues("error").Inc()
	} else {
		m.reconciles.WithLabelValues("success").Inc()
	}
}

// wireGuardPeerKinds are the values of meshd_wireguard_peers' kind label.
var wireGuardPeerKinds = []string{"node", "location", "peer", "cluster"}

// setPlan sets the gauges from the applied plan: nodes is the number of
// nodes, objects the Peers from Peer objects and remote the linked
// clusters' leaders the plan was built from.
func (m *metrics) setPlan(p *mesh.Plan, g mesh.Granularity, nodes int, objects, remote []mesh.Peer) {
	m.nodes.Set(float64(nodes))
	m.peers.Set(float64(len(objects)))
	leader := 0.0
	if p.Leader {
		leader = 1
	}
	m.leader.Reset()
	m.leader.WithLabelValues(p.Location).Set(leader)
	counts := wireGuardPeerCounts(p, g, objects, remote)
	for _, k := range wireGuardPeerKinds {
		m.wgPeers.WithLabelValues(k).Set(float64(counts[k]))
	}
	names := make(map[wgtypes.Key]string, len(p.WireGuard.Peers))
	for _, pp := range p.WireGuard.Peers {
		names[pp.PublicKey] = pp.Name
	}
	kinds := wireGuardPeerKindsOf(p, g, objects, remote)
	m.mu.Lock()
	m.names = names
	m.kinds = kinds
	m.mu.Unlock()
}

// wireGuardPeerCounts counts the plan's WireGuard peers by kind: a linked
// cluster's leader (a key of remote), a Peer object (a key of objects), or a
// node: with granularity full every node is its own location, so a node;
// else another location's leader (location), or a standby node of this
// location (named LOCATION/standby, a node).
func wireGuardPeerCounts(p *mesh.Plan, g mesh.Granularity, objects, remote []mesh.Peer) map[string]int {
	counts := map[string]int{}
	for _, k := range wireGuardPeerKindsOf(p, g, objects, remote) {
		counts[k]++
	}
	return counts
}

// wireGuardPeerKindsOf maps every WireGuard peer of the plan to its kind
// (see wireGuardPeerCounts).
func wireGuardPeerKindsOf(p *mesh.Plan, g mesh.Granularity, objects, remote []mesh.Peer) map[wgtypes.Key]string {
	kind := make(map[wgtypes.Key]string, len(objects)+len(remote))
	for _, o := range objects {
		kind[o.PublicKey] = "peer"
	}
	for _, r := range remote {
		kind[r.PublicKey] = "cluster"
	}
	out := make(map[wgtypes.Key]string, len(p.WireGuard.Peers))
	for _, wp := range p.WireGuard.Peers {
		k, ok := kind[wp.PublicKey]
		switch {
		case ok:
		case g == mesh.GranularityFull, strings.HasSuffix(wp.Name, "/standby"):
			k = "node"
		default:
			k = "location"
		}
		out[wp.PublicKey] = k
	}
	return out
}

type statsReader interface {
	Stats() ([]wg.PeerStats, error)
}

// peerCollector reads WireGuard peer statistics at scrape time.
type peerCollector struct {
	dev statsReader
	m   *metrics
}

var (
	descHandshake = prometheus.NewDesc("meshd_wireguard_peer_last_handshake_timestamp_seconds",
		"Unix time of the latest handshake with the peer (0 = never).", []string{"peer", "public_key"}, nil)
	descRx = prometheus.NewDesc("meshd_wireguard_peer_receive_bytes_total",
		"Bytes received from the peer.", []string{"peer", "public_key"}, nil)
	descTx = prometheus.NewDesc("meshd_wireguard_peer_transmit_bytes_total",
		"Bytes sent to the peer.", []string{"peer", "public_key"}, nil)
)

func (c *peerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descHandshake
	ch <- descRx
	ch <- descTx
	ch <- descRecent
	ch <- descOmitted
}

func (c *peerCollector) Collect(ch chan<- prometheus.Metric) {
	stats, err := c.dev.Stats()
	if err != nil {
		return
	}
	c.m.collectPeers(ch, stats, time.Now())
}

func promhandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
