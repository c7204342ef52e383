package mirror

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the mirror's Prometheus metrics (docs/service-mirroring.md
// lists them).
type Metrics struct {
	services    *prometheus.GaugeVec
	errors      *prometheus.CounterVec
	reachable   *prometheus.GaugeVec
	clashes     *prometheus.GaugeVec
	propagation prometheus.Histogram
	imports     prometheus.Gauge
	exports     *prometheus.GaugeVec
	endpoints   *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered, e.g. in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		services: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_mirror_services", Help: "Services mirrored from each remote cluster.",
		}, []string{"cluster"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshd_mirror_sync_errors_total", Help: "Failed syncs of a mirror (retried with backoff), by remote cluster.",
		}, []string{"cluster"}),
		reachable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_mirror_remote_cluster_reachable", Help: "1 if the remote cluster's API answered the last probe, else 0.",
		}, []string{"cluster"}),
		clashes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_mirror_clashes", Help: "Exported Services not mirrored because a local Service meshd does not own has the mirror's name, by remote cluster.",
		}, []string{"cluster"}),
		propagation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meshd_mirror_propagation_seconds",
			Help:    "Time from observing a remote change (informer event) to the completed local write of the mirror.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		imports: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshd_mcs_service_imports", Help: "ServiceImports meshd writes in this cluster.",
		}),
		exports: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_mcs_service_exports", Help: "This cluster's ServiceExports by condition (Valid, Ready, Conflict) and its status (True, False, Unknown).",
		}, []string{"condition", "status"}),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshd_mcs_endpoints", Help: "Endpoints in the imported EndpointSlices, by source cluster ID.",
		}, []string{"source_cluster"}),
	}
	if reg != nil {
		reg.MustRegister(m.services, m.errors, m.reachable, m.clashes, m.propagation, m.imports, m.exports, m.endpoints)
	}
	return m
}

func (m *Metrics) forget(cluster string) {
	m.services.DeleteLabelValues(cluster)
	m.errors.DeleteLabelValues(cluster)
	m.reachable.DeleteLabelValues(cluster)
	m.clashes.DeleteLabelValues(cluster)
}
