package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/mirror"
)

// linkConfig are the settings of `meshd link`.
type linkConfig struct {
	Kubeconfig    string
	Namespace     string
	LeaseDuration time.Duration
	TakeoverDelay time.Duration
	ResyncPeriod  time.Duration
	Listen        string
	LogLevel      string
	LogFormat     string
	LeaderElect   bool
	LeaseName     string
}

const linkUsage = `Usage: meshd link [flags]

The link controller: the one component of a cluster that holds the
credentials of the clusters linked with ` + "`meshctl link`" + ` (Secrets labelled
meshd.io/cluster-link=true in --namespace). It watches each linked cluster's
Nodes and heartbeat Leases once, for the whole cluster, and writes what the
meshd nodes need into one ClusterLink (meshd.io/v1alpha1) per linked
cluster: the ranges agreed at link time, and the linked cluster's location
leaders, keys, endpoints and liveness. Nodes read the ClusterLinks and hold
no link credentials. One replica is active at a time (a Lease in
--namespace). See docs/multi-cluster.md.

`

func newLinkFlagSet(c *linkConfig) *pflag.FlagSet {
	fs := pflag.NewFlagSet("meshd link", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig of the local cluster (where ClusterLinks are written); empty uses the in-cluster config, then $KUBECONFIG")
	fs.StringVar(&c.Namespace, "namespace", "meshd-system", "namespace of the link Secrets and the leader Lease here, and of the heartbeat Leases in the linked clusters")
	fs.DurationVar(&c.LeaseDuration, "lease-duration", 40*time.Second, "the linked clusters' meshd --lease-duration: a linked node whose Lease is not seen to change for this long is not live (its location's leader fails over)")
	fs.DurationVar(&c.TakeoverDelay, "takeover-delay", 30*time.Second, "the linked clusters' meshd --takeover-delay")
	fs.DurationVar(&c.ResyncPeriod, "resync-period", 5*time.Minute, "informer resync period (a resync writes nothing unless something changed)")
	fs.StringVar(&c.Listen, "listen", ":9479", "address for /metrics and /healthz")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text (logfmt) or json; client-go's klog lines are written the same way")
	fs.BoolVar(&c.LeaderElect, "leader-elect", true, "run only while holding the leader Lease in --namespace, so replicas never fight")
	fs.StringVar(&c.LeaseName, "lease-name", "meshd-link", "name of the leader Lease")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), linkUsage)
		fs.PrintDefaults()
	}
	return fs
}

func (c *linkConfig) validate() error {
	var errs []error
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkLogFormat(c.LogFormat))
	if c.Namespace == "" {
		errs = append(errs, errors.New("--namespace is empty"))
	}
	if c.LeaseName == "" {
		errs = append(errs, errors.New("--lease-name is empty"))
	}
	if c.LeaseDuration < minLeaseDuration || c.LeaseDuration > maxLeaseDuration {
		// The linked clusters' meshd --lease-duration, which meshd accepts
		// only in this range.
		errs = append(errs, fmt.Errorf("--lease-duration %s: want %s to %s, the linked clusters' meshd --lease-duration", c.LeaseDuration, minLeaseDuration, maxLeaseDuration))
	}
	if c.TakeoverDelay < 0 {
		errs = append(errs, fmt.Errorf("--takeover-delay %s: must not be negative", c.TakeoverDelay))
	}
	if c.ResyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--resync-period %s: want a positive duration", c.ResyncPeriod))
	}
	return errors.Join(errs...)
}

// linkCommand is `meshd link`, the link controller.
func linkCommand() subcommand {
	var lc linkConfig
	return subcommand{
		name: "meshd link", flags: newLinkFlagSet(&lc), logLevel: &lc.LogLevel, logFormat: &lc.LogFormat, failed: "link controller stopped",
		validate: lc.validate,
		run: func(ctx context.Context, log *slog.Logger) error {
			log = log.With("component", "link")
			if err := serveLinks(ctx, &lc, log); err != nil {
				return err
			}
			log.Info("link controller stopped")
			return nil
		},
	}
}

var linkWrites = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "meshd_link_clusterlink_writes_total",
	Help: "ClusterLink writes (create, update, status update, delete) by the link controller; zero at idle.",
})

func serveLinks(ctx context.Context, lc *linkConfig, log *slog.Logger) error {
	local, err := connect.NewClients(lc.Kubeconfig)
	if err != nil {
		return fmt.Errorf("building the local cluster's clients: %w", err)
	}
	reg, _ := controllerRegistry(linkWrites)
	once := func(ctx context.Context) error {
		log.Info("keeping ClusterLinks from the link Secrets", "namespace", lc.Namespace)
		return clusterlink.NewController(local.Kube, local.Meshd, clusterlink.ControllerOptions{
			Namespace: lc.Namespace, LeaseDuration: lc.LeaseDuration, TakeoverDelay: lc.TakeoverDelay,
			Resync: lc.ResyncPeriod, Logger: log,
		}, linkWrites.Inc).Run(ctx)
	}
	c := controllerRun{log: log, listen: lc.Listen, reg: reg, kube: local.Kube, once: once}
	if lc.LeaderElect {
		c.election = &mirror.LeaderElection{Namespace: lc.Namespace, Name: lc.LeaseName, Identity: leaderIdentity()}
	}
	return c.run(ctx)
}
