package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/mirror"
)

// mirrorConfig are the settings of `meshd mirror`.
type mirrorConfig struct {
	Kubeconfig       string
	RemoteKubeconfig string
	RemoteName       string
	Namespace        string
	NameSuffix       bool
	CreateNamespaces bool
	GracePeriod      time.Duration
	Listen           string
	LogLevel         string
	LogFormat        string
	LeaderElect      bool
	LeaseName        string
	Workers          int
	MCS              bool
	MirrorServices   bool
}

const mirrorUsage = `Usage: meshd mirror [flags]

Imports the Services that clusters export (a ServiceExport of the same name,
multicluster.x-k8s.io) into this cluster, the Multi-Cluster Services API way
(--mcs): a ServiceImport per exported Service, with a ClusterSetIP (a derived
Service kube-proxy programs) or headless, EndpointSlices per source cluster,
and the Valid/Ready/Conflict status of this cluster's ServiceExports; and
(--mirror-services) Linkerd-style mirrors: a selector-less Service with the
same ports and EndpointSlices pointing at the remote cluster IP (headless:
the remote pod IPs). Remote clusters are those linked with
` + "`meshctl link`" + ` (Secrets labelled meshd.io/cluster-link=true in --namespace),
or the one given by --remote-kubeconfig. One replica is active at a time
(a Lease in --namespace). See docs/mcs.md and docs/service-mirroring.md.

`

func newMirrorFlagSet(c *mirrorConfig) *pflag.FlagSet {
	fs := pflag.NewFlagSet("meshd mirror", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig of the local cluster (where mirrors are written); empty uses the in-cluster config, then $KUBECONFIG")
	fs.StringVar(&c.RemoteKubeconfig, "remote-kubeconfig", "", "kubeconfig of one remote cluster to mirror from, instead of the cluster-link Secrets")
	fs.StringVar(&c.RemoteName, "remote-name", "", "name of the --remote-kubeconfig cluster in mirror labels and names (default: the cluster of its current context)")
	fs.StringVar(&c.Namespace, "namespace", "meshd-system", "namespace of the cluster-link Secrets and of the leader Lease")
	fs.BoolVar(&c.NameSuffix, "name-suffix", false, "name mirrors <name>-<cluster> (default: the source's name; the namespace is always the source's)")
	fs.BoolVar(&c.CreateNamespaces, "create-namespaces", true, "create a source's namespace when it is missing locally; false skips those Services until it exists")
	fs.DurationVar(&c.GracePeriod, "grace-period", 60*time.Second, "how long a remote cluster may be unreachable before its mirrors' endpoints are marked not ready")
	fs.StringVar(&c.Listen, "listen", ":9478", "address for /metrics and /healthz")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text (logfmt) or json; client-go's klog lines are written the same way")
	fs.BoolVar(&c.LeaderElect, "leader-elect", true, "run only while holding the leader Lease in --namespace, so replicas never fight")
	fs.StringVar(&c.LeaseName, "lease-name", "", "name of the leader Lease (default meshd-mirror; with --remote-kubeconfig meshd-mirror-<remote name>)")
	fs.IntVar(&c.Workers, "workers", 2, "parallel reconciles")
	fs.BoolVar(&c.MCS, "mcs", true, "write the Multi-Cluster Services objects: ServiceImports, their derived Services and EndpointSlices, and this cluster's ServiceExport status (needs the MCS CRDs, see docs/mcs.md)")
	fs.BoolVar(&c.MirrorServices, "mirror-services", true, "also write Linkerd-style mirror Services (<name>, or <name>-<cluster> with --name-suffix); false deletes them")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), mirrorUsage)
		fs.PrintDefaults()
	}
	return fs
}

// validate checks the flags and fills in the defaults that depend on others.
func (c *mirrorConfig) validate() error {
	var errs []error
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if err := checkLogFormat(c.LogFormat); err != nil {
		errs = append(errs, err)
	}
	if c.RemoteName != "" && c.RemoteKubeconfig == "" {
		errs = append(errs, errors.New("--remote-name needs --remote-kubeconfig"))
	}
	if c.RemoteKubeconfig != "" && c.RemoteName == "" {
		name, err := kubeconfigClusterName(c.RemoteKubeconfig)
		if err != nil {
			errs = append(errs, fmt.Errorf("--remote-name is not given and %w", err))
		}
		c.RemoteName = name
	}
	if c.RemoteName != "" {
		if e := validation.IsDNS1123Label(c.RemoteName); len(e) > 0 {
			errs = append(errs, fmt.Errorf("--remote-name %q: %s", c.RemoteName, strings.Join(e, "; ")))
		}
	}
	if c.GracePeriod <= 0 {
		errs = append(errs, fmt.Errorf("--grace-period %s: want a positive duration", c.GracePeriod))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("--workers %d: want at least 1", c.Workers))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("--namespace is empty"))
	}
	if c.LeaseName == "" {
		c.LeaseName = "meshd-mirror"
		if c.RemoteName != "" {
			c.LeaseName += "-" + c.RemoteName
		}
	}
	return errors.Join(errs...)
}

// kubeconfigClusterName is the cluster name of a kubeconfig's current context.
func kubeconfigClusterName(path string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok || ctx.Cluster == "" {
		return "", fmt.Errorf("%s has no current context naming a cluster", path)
	}
	return ctx.Cluster, nil
}

// mirrorCommand is `meshd mirror`.
func mirrorCommand() subcommand {
	var mc mirrorConfig
	return subcommand{
		name: "meshd mirror", flags: newMirrorFlagSet(&mc), logLevel: &mc.LogLevel, logFormat: &mc.LogFormat, failed: "mirror stopped",
		validate: mc.validate,
		run: func(ctx context.Context, log *slog.Logger) error {
			log = log.With("component", "mirror")
			if err := serveMirror(ctx, &mc, log); err != nil {
				return err
			}
			log.Info("mirror stopped")
			return nil
		},
	}
}

func serveMirror(ctx context.Context, mc *mirrorConfig, log *slog.Logger) error {
	local, err := connect.NewClients(mc.Kubeconfig)
	if err != nil {
		return fmt.Errorf("building the local cluster's clients: %w", err)
	}
	var remote *mirror.Remote
	if mc.RemoteKubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", mc.RemoteKubeconfig)
		if err != nil {
			return fmt.Errorf("loading --remote-kubeconfig %s: %w", mc.RemoteKubeconfig, err)
		}
		r, err := mirror.NewRemote(mc.RemoteName, cfg)
		if err != nil {
			return err
		}
		remote = &r
	}
	reg, _ := controllerRegistry()
	metrics := mirror.NewMetrics(reg)
	recorder, stopEvents := connect.NewEventRecorder(local.Kube, "meshd-mirror")
	defer stopEvents()

	mirrorOnce := func(ctx context.Context) error {
		opts, err := mirrorOptions(ctx, log, mc, local, remote != nil)
		if err != nil {
			return err
		}
		return runMirrorController(ctx, log, mc, local.Kube, remote, mirror.New(log, local.Kube, recorder, metrics, opts))
	}
	c := controllerRun{log: log, listen: mc.Listen, reg: reg, kube: local.Kube, once: mirrorOnce}
	if mc.LeaderElect {
		c.election = &mirror.LeaderElection{Namespace: mc.Namespace, Name: mc.LeaseName, Identity: leaderIdentity()}
	}
	return c.run(ctx)
}

// mirrorOptions are the Controller's options; with --mcs it reads (or
// records) this cluster's ID.
func mirrorOptions(ctx context.Context, log *slog.Logger, mc *mirrorConfig, local *connect.Clients, static bool) (mirror.Options, error) {
	opts := mirror.Options{
		NameSuffix:            mc.NameSuffix,
		SkipMissingNamespaces: !mc.CreateNamespaces,
		GracePeriod:           mc.GracePeriod,
		Workers:               mc.Workers,
		NoMirrors:             !mc.MirrorServices,
		StaticRemotes:         static,
		EventNamespace:        mc.Namespace,
		LeaseNamespace:        mc.Namespace,
	}
	if !mc.MCS {
		return opts, nil
	}
	dyn, err := dynamic.NewForConfig(local.Config)
	if err != nil {
		return opts, fmt.Errorf("building the local cluster's dynamic client: %w", err)
	}
	id, err := mirror.EnsureClusterID(ctx, log, local.Kube, dyn)
	if err != nil {
		return opts, fmt.Errorf("this cluster's ID (ClusterProperty %s): %w", mirror.ClusterIDProperty, err)
	}
	log.Info("cluster ID", "clusterID", id)
	opts.ClusterID, opts.LocalDynamic = id, dyn
	return opts, nil
}

// runMirrorController runs c over the remote cluster, or over the linked
// clusters, until ctx ends.
func runMirrorController(ctx context.Context, log *slog.Logger, mc *mirrorConfig, local kubernetes.Interface, remote *mirror.Remote, c *mirror.Controller) error {
	if remote != nil {
		if err := c.AddRemote(*remote); err != nil {
			return err
		}
		log.Info("mirroring one remote cluster", "cluster", remote.Name, "kubeconfig", mc.RemoteKubeconfig)
		return c.Run(ctx)
	}
	log.Info("mirroring linked clusters", "namespace", mc.Namespace)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.WatchLinks(ctx, local, mc.Namespace) }()
	err := c.Run(ctx)
	cancel()
	return errors.Join(err, <-errc)
}
