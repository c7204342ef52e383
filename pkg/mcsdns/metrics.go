package mcsdns

import (
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the server's Prometheus metrics.
type Metrics struct {
	requests *prometheus.CounterVec
	duration prometheus.Histogram
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshd_dns_requests_total",
			Help: "DNS requests answered by meshd dns, by response code (NOERROR, NXDOMAIN, SERVFAIL, REFUSED, ...).",
		}, []string{"rcode"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meshd_dns_request_duration_seconds",
			Help:    "Time from reading a DNS request to writing its answer.",
			Buckets: []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05},
		}),
	}
	// Every rcode the plugin gives appears at 0 from the start.
	for _, rc := range []int{dns.RcodeSuccess, dns.RcodeNameError, dns.RcodeServerFailure, dns.RcodeRefused} {
		m.requests.WithLabelValues(dns.RcodeToString[rc])
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

func (m *Metrics) observe(rcode int, seconds float64) {
	if m == nil {
		return
	}
	name, ok := dns.RcodeToString[rcode]
	if !ok {
		name = "OTHER"
	}
	m.requests.WithLabelValues(name).Inc()
	m.duration.Observe(seconds)
}
