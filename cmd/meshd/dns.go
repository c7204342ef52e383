package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/mcsdns"
)

// dnsConfig are the settings of `meshd dns`.
type dnsConfig struct {
	Kubeconfig    string
	Listen        string
	MetricsListen string
	Zone          string
	TTL           time.Duration
	LogLevel      string
	LogFormat     string
}

const dnsUsage = `Usage: meshd dns [flags]

Answers DNS for the Multi-Cluster Services API under clusterset.local, from
the ServiceImports (multicluster.x-k8s.io/v1beta1) and the EndpointSlices
labelled multicluster.kubernetes.io/service-name of this cluster:
<svc>.<ns>.svc.clusterset.local (A/AAAA: the ClusterSetIP, or a headless
import's ready pod IPs), _<port>._<proto>.<svc>.<ns>.svc.clusterset.local
(SRV) and <hostname>.<cluster>.<svc>.<ns>.svc.clusterset.local. CoreDNS
embedded, with meshd's own plugin; the cluster's CoreDNS forwards the zone
here. See docs/mcs-dns.md.

`

func newDNSFlagSet(c *dnsConfig) *pflag.FlagSet {
	fs := pflag.NewFlagSet("meshd dns", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster whose ServiceImports are served; empty uses the in-cluster config, then $KUBECONFIG")
	fs.StringVar(&c.Listen, "listen", ":1053", "address (host:port) for DNS over UDP and TCP")
	fs.StringVar(&c.MetricsListen, "metrics-listen", ":9479", "address for /metrics, /healthz and /readyz (ready once the ServiceImport and EndpointSlice caches have synced)")
	fs.StringVar(&c.Zone, "zone", "clusterset.local", "zone served; names outside it are REFUSED")
	fs.DurationVar(&c.TTL, "ttl", mcsdns.DefaultTTL*time.Second, "TTL of answers and of negative answers (whole seconds, at most 1h)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text (logfmt) or json; client-go's klog lines are written the same way")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), dnsUsage)
		fs.PrintDefaults()
	}
	return fs
}

// validate checks the flags and normalizes the zone.
func (c *dnsConfig) validate() error {
	var errs []error
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if err := checkLogFormat(c.LogFormat); err != nil {
		errs = append(errs, err)
	}
	for _, a := range []struct{ flag, addr string }{{"--listen", c.Listen}, {"--metrics-listen", c.MetricsListen}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want host:port: %w", a.flag, a.addr, err))
		}
	}
	zone := dns.Fqdn(strings.ToLower(strings.TrimSpace(c.Zone)))
	if _, ok := dns.IsDomainName(zone); !ok || zone == "." {
		errs = append(errs, fmt.Errorf("--zone %q: not a domain name", c.Zone))
	}
	c.Zone = zone
	if c.TTL < 0 || c.TTL > time.Hour || c.TTL%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--ttl %s: want whole seconds from 0s to 1h", c.TTL))
	}
	return errors.Join(errs...)
}

// dnsCommand is `meshd dns`.
func dnsCommand() subcommand {
	var c dnsConfig
	return subcommand{
		name: "meshd dns", flags: newDNSFlagSet(&c), logLevel: &c.LogLevel, logFormat: &c.LogFormat, failed: "dns stopped",
		validate: c.validate,
		run: func(ctx context.Context, log *slog.Logger) error {
			log = log.With("component", "dns")
			if err := serveDNS(ctx, &c, log); err != nil {
				return err
			}
			log.Info("dns stopped")
			return nil
		},
	}
}

func serveDNS(ctx context.Context, c *dnsConfig, log *slog.Logger) error {
	clients, err := connect.NewClients(c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("building the cluster's clients: %w", err)
	}
	dyn, err := dynamic.NewForConfig(clients.Config)
	if err != nil {
		return fmt.Errorf("building the dynamic client: %w", err)
	}
	inf := mcsdns.NewInformers(dyn, clients.Kube)
	reg, _ := controllerRegistry()
	h := &mcsdns.Handler{Zone: c.Zone, TTL: uint32(c.TTL / time.Second), Lookup: inf.Store(), Ready: inf.HasSynced, Serial: inf.Serial}
	srv, err := mcsdns.Listen(c.Listen, h, mcsdns.NewMetrics(reg), log)
	if err != nil {
		return err
	}
	web := dnsHTTPServer(c.MetricsListen, reg, inf.HasSynced)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g run.Group
	g.Add(func() error { inf.Run(ctx); return ctx.Err() }, func(error) { cancel() })
	g.Add(func() error { return srv.Run(ctx) }, func(error) { cancel() })
	g.Add(func() error {
		log.Info("serving metrics", "listen", c.MetricsListen)
		if err := web.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving %s: %w", c.MetricsListen, err)
		}
		return nil
	}, func(error) {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = web.Shutdown(sctx)
	})
	g.Add(func() error { reportSync(ctx, log, inf.HasSynced, c.Zone); <-ctx.Done(); return ctx.Err() }, func(error) { cancel() })
	if err := g.Run(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// reportSync logs when the caches have synced, and every 30 s until then
// says why nothing is answered yet.
func reportSync(ctx context.Context, log *slog.Logger, synced func() bool, zone string) {
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	warned := start
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if synced() {
			log.Info("ServiceImport and EndpointSlice caches synced: answering", "zone", zone, "after", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(warned) >= 30*time.Second {
			warned = time.Now()
			log.Warn("caches not synced yet: every query is SERVFAIL; is the ServiceImport CRD (multicluster.x-k8s.io/v1beta1) installed, and may this account list and watch serviceimports and endpointslices?", "waiting", time.Since(start).Round(time.Second))
		}
	}
}

// dnsHTTPServer serves /metrics from reg, /healthz, and /readyz (200 once
// synced).
func dnsHTTPServer(listen string, reg *prometheus.Registry, synced func() bool) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !synced() {
			http.Error(w, "ServiceImport and EndpointSlice caches not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}
