package main

import (
	"context"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"
)

// clientGoMetrics are client-go's own metrics, registered on meshd's
// registry under the names Kubernetes components use (so existing
// dashboards and alerts for controllers apply): the work queues
// (workqueue_*{name}) and the REST client (rest_client_*), plus the
// request results as meshd_api_requests_total.
type clientGoMetrics struct {
	results                      *prometheus.CounterVec
	depth                        *prometheus.GaugeVec
	addsTotal, retriesTotal      *prometheus.CounterVec
	latency, workDuration        *prometheus.HistogramVec
	unfinished, longestRunning   *prometheus.GaugeVec
	requestLatency, rateLimiting *prometheus.HistogramVec
	requestRetries               *prometheus.CounterVec
}

func newClientGoMetrics(reg prometheus.Registerer) *clientGoMetrics {
	q := []string{"name"}
	c := &clientGoMetrics{
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshd_api_requests_total", Help: "Requests to the API server by HTTP method and status code (a watch counts once, when opened).",
		}, []string{"method", "code"}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "workqueue_depth", Help: "Current depth of the work queue."}, q),
		addsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workqueue_adds_total", Help: "Adds handled by the work queue."}, q),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "workqueue_queue_duration_seconds", Help: "How long an item stays in the work queue before being requested.",
			Buckets: prometheus.ExponentialBuckets(10e-9, 10, 10)}, q),
		workDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "workqueue_work_duration_seconds", Help: "How long processing an item from the work queue takes.",
			Buckets: prometheus.ExponentialBuckets(10e-9, 10, 10)}, q),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_unfinished_work_seconds", Help: "Seconds of work in progress not yet observed by work_duration (large values: stuck workers)."}, q),
		longestRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_longest_running_processor_seconds", Help: "Seconds the longest running worker of the queue has been running."}, q),
		retriesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workqueue_retries_total", Help: "Retries (rate-limited re-adds) handled by the work queue."}, q),
		requestLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rest_client_request_duration_seconds", Help: "API request latency by verb and host (a watch: until its response headers).",
			Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}}, []string{"verb", "host"}),
		rateLimiting: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rest_client_rate_limiter_duration_seconds", Help: "Time API requests waited in the client-side rate limiter, by verb and host.",
			Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}}, []string{"verb", "host"}),
		requestRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_request_retries_total", Help: "API requests retried by client-go, by status code, method and host."}, []string{"code", "method", "host"}),
	}
	reg.MustRegister(c.results, c.depth, c.addsTotal, c.latency, c.workDuration, c.unfinished, c.longestRunning, c.retriesTotal,
		c.requestLatency, c.rateLimiting, c.requestRetries)
	return c
}

// The workqueue.MetricsProvider: one series per queue name.

func (c *clientGoMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return c.depth.WithLabelValues(name)
}
func (c *clientGoMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return c.addsTotal.WithLabelValues(name)
}
func (c *clientGoMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return c.latency.WithLabelValues(name)
}
func (c *clientGoMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return c.workDuration.WithLabelValues(name)
}
func (c *clientGoMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return c.unfinished.WithLabelValues(name)
}
func (c *clientGoMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return c.longestRunning.WithLabelValues(name)
}
func (c *clientGoMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return c.retriesTotal.WithLabelValues(name)
}

// restLatency adapts a histogram to client-go's LatencyMetric.
type restLatency struct{ h *prometheus.HistogramVec }

func (l restLatency) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	l.h.WithLabelValues(verb, u.Host).Observe(d.Seconds())
}

// Increment implements client-go's ResultMetric: meshd_api_requests_total.
func (c *clientGoMetrics) Increment(_ context.Context, code, method, _ string) {
	c.results.WithLabelValues(method, code).Inc()
}

// IncrementRetry implements client-go's RetryMetric.
func (c *clientGoMetrics) IncrementRetry(_ context.Context, code, method, host string) {
	c.requestRetries.WithLabelValues(code, method, host).Inc()
}

// register makes client-go report to these metrics. client-go takes one
// registration per process (the first wins): call it once, before the
// first request and queue.
func (c *clientGoMetrics) register() {
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestLatency:     restLatency{c.requestLatency},
		RateLimiterLatency: restLatency{c.rateLimiting},
		RequestResult:      c,
		RequestRetry:       c,
	})
	workqueue.SetProvider(c)
}
