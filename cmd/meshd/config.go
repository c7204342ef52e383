package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/wg"
)

// config is every setting of the node daemon, filled from flags.
type config struct {
	Kubeconfig    string
	Hostname      string
	Interface     string
	Port          int
	Granularity   string
	MeshCIDRs     []string
	ServiceCIDRs  []string
	TopologyLabel string
	StateDir      string
	WireGuard     string
	// LazyPeers keeps idle peers out of an in-process device (wg.Options):
	// auto (with more than lazyPeersAutoAbove peers), true or false.
	LazyPeers      lazyPeersMode
	MTU            string
	ResyncPeriod   time.Duration
	Listen         string
	LogLevel       string
	LogFormat      string
	LocalRoutes    bool
	LeaseNamespace string
	// PeerSecretNamespace is the one namespace meshd reads Peer preshared-key
	// Secrets from (a Secret informer: nodes may list and watch it).
	PeerSecretNamespace string
	LeaseDuration       time.Duration
	CleanupOnExit       bool
	IPTablesMode        string
	ClusterLinks        bool
	// Leader failover (see failover.go).
	ProbePort     int
	TakeoverDelay time.Duration
	// LeaderCandidates is how many live leader candidates a location keeps
	// (mesh.Candidates).
	LeaderCandidates int
	// PeerMetricsLimit caps the per-peer metric series (peermetrics.go).
	PeerMetricsLimit int
	// DebugPprof is the address of the opt-in net/http/pprof listener;
	// empty (the default) serves none.
	DebugPprof string
}

// lazyPeersMode is --wireguard-lazy-peers: auto, true or false.
type lazyPeersMode string

const (
	lazyPeersAuto lazyPeersMode = "auto"
	lazyPeersOn   lazyPeersMode = "true"
	lazyPeersOff  lazyPeersMode = "false"
	// lazyPeersAutoAbove is how many peers an in-process device holds
	// before auto makes it lazy: about 12 MB of wireguard-go's per-peer
	// state, and more peers than a location mesh or a small full mesh has.
	lazyPeersAutoAbove = 256
)

func (m *lazyPeersMode) String() string { return string(*m) }

func (m *lazyPeersMode) Type() string { return "mode" }

func (m *lazyPeersMode) Set(s string) error {
	if strings.EqualFold(s, string(lazyPeersAuto)) {
		*m = lazyPeersAuto
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is none of auto, true and false", s)
	}
	*m = lazyPeersMode(strconv.FormatBool(b))
	return nil
}

// options is the mode as wg.Options' LazyPeers and LazyPeersAbove.
func (m lazyPeersMode) options() (lazy bool, above int) {
	switch m {
	case lazyPeersOff:
		return false, 0
	case lazyPeersAuto:
		return true, lazyPeersAutoAbove
	}
	return true, 0
}

// defaultHostname is $NODE_NAME, then the host name.
func defaultHostname() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

// newFlagSet returns the daemon's flag set bound to c. It is the one place
// flags are defined: docs and manifest tests parse with it too.
func newFlagSet(c *config) *pflag.FlagSet {
	fs := pflag.NewFlagSet("meshd", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty uses the in-cluster config, then $KUBECONFIG")
	fs.StringVar(&c.Hostname, "hostname", "", "name of this node's Node object (empty: $NODE_NAME, then the host name)")
	fs.StringVar(&c.Interface, "interface", mesh.DefaultInterface, "name of the WireGuard interface")
	fs.IntVar(&c.Port, "port", mesh.DefaultPort, "WireGuard UDP listen port")
	fs.StringVar(&c.Granularity, "mesh-granularity", string(mesh.GranularityLocation), "mesh granularity: location (one WireGuard leader per location) or full (every node peers with every other)")
	fs.StringSliceVar(&c.MeshCIDRs, "mesh-cidr", []string{"10.4.0.0/16"}, "CIDR mesh addresses are allocated from; repeat to add an IPv6 one")
	fs.StringSliceVar(&c.ServiceCIDRs, "service-cidr", nil, "the cluster's service CIDR(s), never masqueraded; repeatable")
	fs.StringVar(&c.TopologyLabel, "topology-label", "topology.kubernetes.io/region", "Node label that gives a node's location (the meshd.io/location annotation wins)")
	fs.StringVar(&c.StateDir, "state-dir", "/var/lib/meshd", "directory for the WireGuard private key and state (mode 0700)")
	fs.StringVar(&c.WireGuard, "wireguard", string(wg.ModeAuto), "WireGuard implementation: auto (adopt an existing interface, else kernel, else built-in userspace), kernel or userspace")
	c.LazyPeers = lazyPeersAuto
	fs.Var(&c.LazyPeers, "wireguard-lazy-peers", fmt.Sprintf("built-in userspace WireGuard only: auto, true or false. Lazy, the device holds a peer only once a packet for it or its handshake arrives, and drops it after 5 minutes without traffic: about 45 KB less per idle peer (a large full mesh, docs/scale.md), but wg show lists only the active peers and the first packet to an idle peer waits for a handshake. auto is lazy while more than %d peers are configured; true always; false never", lazyPeersAutoAbove))
	fs.Lookup("wireguard-lazy-peers").NoOptDefVal = "true"
	fs.StringVar(&c.MTU, "mtu", "auto", "MTU of the WireGuard interface; auto = underlay MTU minus the WireGuard overhead (80)")
	fs.DurationVar(&c.ResyncPeriod, "resync-period", 30*time.Second, "how often the full state is reconciled even without changes (repairs drift)")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:9477", "address for /metrics, /healthz, /readyz and the debug state /debug/meshd read by meshctl diagnose and check (the manifests use the node's own address, status.hostIP; never every address of a host with a public one)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text (logfmt) or json; client-go's klog lines are written the same way")
	fs.BoolVar(&c.LocalRoutes, "local-routes", true, "route pod CIDRs of nodes in the same location via their internal IPs (no other CNI routes needed)")
	fs.StringVar(&c.LeaseNamespace, "lease-namespace", "meshd-system", "namespace of the per-node liveness Leases")
	fs.StringVar(&c.PeerSecretNamespace, "peer-secret-namespace", "meshd-peers", "the only namespace Peer preshared-key Secrets are read from (spec.presharedKeySecretRef elsewhere is reported, not used)")
	fs.DurationVar(&c.LeaseDuration, "lease-duration", 40*time.Second, "a node whose Lease this node has not seen change for this long is not live (leader failover)")
	fs.BoolVar(&c.CleanupOnExit, "cleanup-on-exit", false, "remove the interface, routes, rules and iptables chains on exit (default: leave them so traffic keeps flowing across restarts)")
	fs.StringVar(&c.IPTablesMode, "iptables-backend", "", "iptables binaries to use: empty (the system default), nft or legacy")
	fs.BoolVar(&c.ClusterLinks, "cluster-links", true, "peer with the clusters linked by `meshctl link`, as the link controller (`meshd link`) describes them in ClusterLink objects; nodes read no link Secret")
	fs.IntVar(&c.ProbePort, "probe-port", 51821, "UDP port of the data-plane probes between nodes (leader failover within seconds: a leader that stops answering its location or the other locations is replaced); the same on every node; 0 turns probing off (failover by --lease-duration only)")
	fs.DurationVar(&c.TakeoverDelay, "takeover-delay", 30*time.Second, "how long a node that came back (Lease renewed, probes answered) must stay healthy before it takes its location's leadership back")
	fs.IntVar(&c.LeaderCandidates, "leader-candidates", mesh.DefaultLeaderCandidates, "how many live leader candidates each location keeps (the first in leader order: meshd.io/leader, a public endpoint, the name); only they may lead, probe each other and are watched by every node; the same on every node")
	fs.IntVar(&c.PeerMetricsLimit, "peer-metrics-limit", defaultPeerMetricsLimit, "at most this many WireGuard peers get per-peer series (meshd_wireguard_peer_*): Peer objects and linked clusters first, then locations, then nodes; 0 turns per-peer series off (meshd_wireguard_peers_handshake_recent counts them all; see docs/metrics.md)")
	fs.StringVar(&c.DebugPprof, "debug-pprof", "", "address of a separate listener for Go profiles (/debug/pprof/, e.g. 127.0.0.1:6060) for debugging CPU and memory; empty (the default) serves none. Never expose it beyond the node")
	return fs
}

// scalarErrors checks the flags that are single values: ports, names,
// modes and durations.
func (c *config) scalarErrors() []error {
	var errs []error
	if c.Port < 1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("--port %d: want 1-65535", c.Port))
	}
	if c.Interface == "" || len(c.Interface) > 15 {
		errs = append(errs, fmt.Errorf("--interface %q: want 1-15 characters", c.Interface))
	}
	switch wg.Mode(c.WireGuard) {
	case wg.ModeAuto, wg.ModeKernel, wg.ModeUserspace:
	default:
		errs = append(errs, fmt.Errorf("--wireguard %q: want auto, kernel or userspace", c.WireGuard))
	}
	if _, err := c.mtu(); err != nil {
		errs = append(errs, err)
	}
	if c.ProbePort < 0 || c.ProbePort > 65535 || (c.ProbePort != 0 && c.ProbePort == c.Port) {
		errs = append(errs, fmt.Errorf("--probe-port %d: want 0 (off) or 1-65535, not the WireGuard --port", c.ProbePort))
	}
	if c.PeerMetricsLimit < 0 {
		errs = append(errs, fmt.Errorf("--peer-metrics-limit %d: want 0 (off) or more", c.PeerMetricsLimit))
	}
	if c.LeaderCandidates < 2 || c.LeaderCandidates > maxLeaderCandidates {
		errs = append(errs, fmt.Errorf("--leader-candidates %d: want 2 to %d (one is no failover; every node watches the Leases of this many nodes per location)", c.LeaderCandidates, maxLeaderCandidates))
	}
	if c.TakeoverDelay < 0 {
		errs = append(errs, fmt.Errorf("--takeover-delay %s: must not be negative", c.TakeoverDelay))
	}
	if c.ResyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--resync-period %s: must be positive", c.ResyncPeriod))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if err := checkLogFormat(c.LogFormat); err != nil {
		errs = append(errs, err)
	}
	switch c.IPTablesMode {
	case "", "nft", "legacy":
	default:
		errs = append(errs, fmt.Errorf("--iptables-backend %q: want empty, nft or legacy", c.IPTablesMode))
	}
	return errs
}

// options turns the validated flags into planner options.
func (c *config) options() (mesh.Options, error) {
	var errs []error
	o := mesh.Options{
		Port:         c.Port,
		Interface:    c.Interface,
		LocalRoutes:  c.LocalRoutes,
		RouteTable:   mesh.DefaultRouteTable,
		RulePriority: mesh.DefaultRulePriority,
		FailClosed:   true, // traffic for the mesh is dropped, never sent in clear, when its route is missing
	}
	g, err := mesh.ParseGranularity(c.Granularity)
	if err != nil {
		errs = append(errs, fmt.Errorf("--mesh-granularity %w", err))
	}
	o.Granularity = g
	o.MeshCIDRs, err = mesh.ParseMeshCIDRs(c.MeshCIDRs)
	if err != nil {
		errs = append(errs, fmt.Errorf("--mesh-cidr: %w", err))
	}
	for _, s := range c.ServiceCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			errs = append(errs, fmt.Errorf("--service-cidr %q: %w", s, err))
			continue
		}
		o.ServiceCIDRs = append(o.ServiceCIDRs, p.Masked())
	}
	if c.Hostname == "" {
		c.Hostname = defaultHostname()
	}
	if c.Hostname == "" {
		errs = append(errs, errors.New("--hostname: empty and neither $NODE_NAME nor the host name is set"))
	}
	errs = append(errs, c.scalarErrors()...)
	errs = append(errs, c.validate(o)...)
	return o, errors.Join(errs...)
}

// Bounds of the duration flags.
const (
	minLeaseDuration = 2 * time.Second // the liveness expiry is checked every second
	// maxLeaderCandidates bounds --leader-candidates: every node watches
	// the Leases of this many nodes per location.
	maxLeaderCandidates = 64
	maxLeaseDuration    = time.Hour
	minResyncPeriod     = time.Second
	maxResyncPeriod     = 24 * time.Hour
)

// validate checks the flags options() does not: each problem is one error
// naming the flag, the value and what is wanted.
func (c *config) validate(o mesh.Options) []error {
	var errs []error
	switch {
	case c.LeaseDuration < minLeaseDuration || c.LeaseDuration > maxLeaseDuration:
		errs = append(errs, fmt.Errorf("--lease-duration %s: want %s to %s (a node whose Lease has not changed for this long is not live; its heartbeat renews every quarter of it)", c.LeaseDuration, minLeaseDuration, maxLeaseDuration))
	}
	if c.ResyncPeriod > 0 && (c.ResyncPeriod < minResyncPeriod || c.ResyncPeriod > maxResyncPeriod) {
		errs = append(errs, fmt.Errorf("--resync-period %s: want %s to %s", c.ResyncPeriod, minResyncPeriod, maxResyncPeriod))
	}
	if e := validation.IsDNS1123Label(c.PeerSecretNamespace); len(e) > 0 {
		errs = append(errs, fmt.Errorf("--peer-secret-namespace %q: not a namespace name: %s", c.PeerSecretNamespace, strings.Join(e, "; ")))
	}
	if e := validation.IsDNS1123Label(c.LeaseNamespace); len(e) > 0 {
		errs = append(errs, fmt.Errorf("--lease-namespace %q: not a namespace name: %s", c.LeaseNamespace, strings.Join(e, "; ")))
	}
	if c.Interface != "" && (strings.ContainsAny(c.Interface, "/: \t\n") || c.Interface == "." || c.Interface == "..") {
		errs = append(errs, fmt.Errorf("--interface %q: an interface name has no '/', ':' or white space and is neither '.' nor '..'", c.Interface))
	}
	if e := validation.IsQualifiedName(c.TopologyLabel); len(e) > 0 {
		errs = append(errs, fmt.Errorf("--topology-label %q: not a label key: %s", c.TopologyLabel, strings.Join(e, "; ")))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("--state-dir is empty: the private key and the last applied state live there"))
	}
	if c.DebugPprof != "" {
		if _, _, err := net.SplitHostPort(c.DebugPprof); err != nil {
			errs = append(errs, fmt.Errorf("--debug-pprof %q: want [host]:port: %w", c.DebugPprof, err))
		}
	}
	if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: want [host]:port: %w", c.Listen, err))
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		errs = append(errs, fmt.Errorf("--listen %q: bad port %q", c.Listen, port))
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			errs = append(errs, fmt.Errorf("--kubeconfig: %w", err))
		}
	}
	for _, s := range o.ServiceCIDRs {
		for _, m := range o.MeshCIDRs {
			if s.Overlaps(m) {
				errs = append(errs, fmt.Errorf("--service-cidr %s overlaps --mesh-cidr %s", s, m))
			}
		}
	}
	return errs
}

// mtu returns the configured MTU, 0 meaning auto.
func (c *config) mtu() (int, error) {
	if c.MTU == "" || c.MTU == "auto" {
		return 0, nil
	}
	n, err := strconv.Atoi(c.MTU)
	if err != nil || n < 1280 || n > 65535 {
		return 0, fmt.Errorf("--mtu %q: want auto or a number from 1280 to 65535", c.MTU)
	}
	return n, nil
}

// checkLogFormat checks --log-format.
func checkLogFormat(s string) error {
	if s != "text" && s != "json" {
		return fmt.Errorf("--log-format %q: want text or json", s)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}
