package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// side is one cluster of a link, as given by --from-*/--to-* flags.
type side struct {
	kubeconfig   string
	context      string
	name         string
	server       string
	serviceCIDRs []string
	meshCIDRs    []string
	granularity  string
	topology     string
	port         int
	allowed      []string
}

func (s *side) flags(c *cobra.Command, prefix, which string) {
	f := c.Flags()
	f.StringVar(&s.kubeconfig, prefix+"kubeconfig", "", "kubeconfig of the "+which+" cluster (this or --"+prefix+"context is required; with --"+prefix+"context only: the global --kubeconfig)")
	f.StringVar(&s.context, prefix+"context", "", "kubeconfig context of the "+which+" cluster (default: the kubeconfig's current context)")
	f.StringVar(&s.name, prefix+"name", "", "name of the "+which+" cluster (DNS label; default: its kubeconfig context)")
	f.StringVar(&s.server, prefix+"server", "", "API server URL of the "+which+" cluster as the other cluster's nodes reach it (default: the kubeconfig's)")
	f.StringSliceVar(&s.serviceCIDRs, prefix+"service-cidr", nil, "service CIDR(s) of the "+which+" cluster, routed to the other cluster (default: its meshd's published --service-cidr)")
	f.StringSliceVar(&s.meshCIDRs, prefix+"mesh-cidr", []string{"10.4.0.0/16"}, "meshd --mesh-cidr of the "+which+" cluster (default: what its nodes publish, else 10.4.0.0/16)")
	f.StringVar(&s.granularity, prefix+"mesh-granularity", string(mesh.GranularityLocation), "meshd --mesh-granularity of the "+which+" cluster (default: what its nodes publish, else location)")
	f.StringVar(&s.topology, prefix+"topology-label", convert.DefaultTopologyLabel, "meshd --topology-label of the "+which+" cluster (default: what its nodes publish)")
	f.IntVar(&s.port, prefix+"port", mesh.DefaultPort, "meshd --port of the "+which+" cluster (default: what its nodes publish, else 51820)")
	f.StringSliceVar(&s.allowed, prefix+"allowed-cidr", nil, "ranges the "+which+" cluster may claim besides its mesh and service CIDRs (e.g. its whole pod CIDR and node network; default: its nodes' pod CIDRs, addresses and allowed-location-ips as seen now)")
}

// identityOnly drops what link alone uses (ranges and mesh settings), so
// that unlink accepts those flags without reading them.
func (s *side) identityOnly() {
	*s = side{kubeconfig: s.kubeconfig, context: s.context, name: s.name,
		granularity: string(mesh.GranularityLocation), topology: convert.DefaultTopologyLabel, port: mesh.DefaultPort}
}

// settings validates the side's flags. A side given by its context alone
// uses the global --kubeconfig (kubeconfig; empty: $KUBECONFIG, then
// ~/.kube/config).
func (s *side) settings(flag, kubeconfig string) (clusterlink.LinkSettings, error) {
	var errs []error
	if s.kubeconfig == "" && s.context != "" {
		s.kubeconfig = kubeconfig
	}
	if s.kubeconfig == "" && s.context == "" {
		errs = append(errs, fmt.Errorf("--%skubeconfig or --%scontext is required", flag, flag))
	}
	if s.name == "" && (s.kubeconfig != "" || s.context != "") {
		s.name = dnsLabel(contextName(s.kubeconfig, s.context))
	}
	ls := clusterlink.LinkSettings{Name: s.name, Granularity: mesh.Granularity(s.granularity), TopologyLabel: s.topology, Port: s.port}
	if ls.Name == "" {
		errs = append(errs, fmt.Errorf("--%sname is required (the kubeconfig has no usable current context)", flag))
	}
	if ls.Granularity != mesh.GranularityLocation && ls.Granularity != mesh.GranularityFull {
		errs = append(errs, fmt.Errorf("--%smesh-granularity %q: want location or full", flag, s.granularity))
	}
	parse := func(name string, ss []string) []netip.Prefix {
		var out []netip.Prefix
		for _, v := range ss {
			p, err := netip.ParsePrefix(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("--%s%s %q: %w", flag, name, v, err))
				continue
			}
			out = append(out, p.Masked())
		}
		return out
	}
	ls.ServiceCIDRs = parse("service-cidr", s.serviceCIDRs)
	ls.MeshCIDRs = parse("mesh-cidr", s.meshCIDRs)
	if s.allowed != nil {
		extra := parse("allowed-cidr", s.allowed)
		ls.Allowed = mesh.ClaimableRanges(ls.MeshCIDRs, slices.Concat(ls.ServiceCIDRs, extra), nil)
	}
	return ls, errors.Join(errs...)
}

// claimable fills in ls.Allowed, unless --*-allowed-cidr gave it, with the
// ranges the cluster claims now: its mesh and service CIDRs and its nodes'
// pod CIDRs, addresses and allowed-location-ips.
func claimable(ctx context.Context, c *connect.Clients, ls *clusterlink.LinkSettings) error {
	if ls.Allowed != nil {
		return nil
	}
	nl, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("cluster %s: listing its Nodes for the ranges it may claim: %w", ls.Name, err)
	}
	nodes := make([]mesh.Node, 0, len(nl.Items))
	for i := range nl.Items {
		n, _ := convert.NodeFromObject(&nl.Items[i], convert.ParseOptions{TopologyLabel: ls.TopologyLabel, Port: ls.Port})
		nodes = append(nodes, n)
	}
	ls.Allowed = mesh.ClaimableRanges(ls.MeshCIDRs, ls.ServiceCIDRs, nodes)
	return nil
}

// dnsLabel makes a context name usable as a cluster name.
func dnsLabel(s string) string {
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	out := strings.Trim(b.String(), "-")
	if len(out) > 40 {
		out = strings.Trim(out[:40], "-")
	}
	return out
}

// overlaps reports the ranges the two clusters share (they must not).
func overlaps(a, b clusterlink.LinkSettings) []string {
	var out []string
	for _, p := range append(a.MeshCIDRs, a.ServiceCIDRs...) {
		for _, q := range append(b.MeshCIDRs, b.ServiceCIDRs...) {
			if p.Overlaps(q) {
				out = append(out, fmt.Sprintf("%s of %s overlaps %s of %s", p, a.Name, q, b.Name))
			}
		}
	}
	return out
}

// settingsOf validates both sides' flags; they must name two clusters.
func (e *env) settingsOf(from, to *side) (fs, ts clusterlink.LinkSettings, err error) {
	fs, err1 := from.settings("from-", e.s.kubeconfig)
	ts, err2 := to.settings("to-", e.s.kubeconfig)
	if err := errors.Join(err1, err2); err != nil {
		return fs, ts, usageError{err}
	}
	if fs.Name == ts.Name {
		return fs, ts, usageError{fmt.Errorf("both clusters are named %q: set --from-name and --to-name", fs.Name)}
	}
	return fs, ts, nil
}

// clientsOf connects to both sides.
func (e *env) clientsOf(from, to *side) (fc, tc *connect.Clients, err error) {
	if fc, err = e.newClients(from.kubeconfig, from.context); err != nil {
		return nil, nil, err
	}
	if tc, err = e.newClients(to.kubeconfig, to.context); err != nil {
		return nil, nil, err
	}
	return fc, tc, nil
}

func newLinkCommand(e *env) *cobra.Command {
	var from, to side
	var oneWay, insecure, refresh bool
	c := &cobra.Command{
		Use:   "link --from-kubeconfig K1 --to-kubeconfig K2",
		Short: "Peer two clusters automatically: each cluster's meshd keeps the other's leaders as peers",
		Long: `link gives each cluster read-only credentials for the other: in each it creates
a ServiceAccount with a read-only ClusterRole (Nodes; Services, EndpointSlices
and ServiceExports for meshd mirror), and in the other a
Secret (meshd-link-<name>, labelled meshd.io/cluster-link=true, in
--lease-namespace) with a kubeconfig for it. The link controller (meshd link,
the Deployment meshd-link that manifests/ and the chart install) reads that
Secret and writes a ClusterLink named after the linked cluster; meshd on every
node (--cluster-links, on by default) then keeps the remote cluster's location
leaders as WireGuard peers by itself: nodes added, removed, re-keyed or a
leader change there reach this cluster within seconds, with no loop to re-run.
"kubectl get clusterlinks" and "meshctl status" show each link.

The clusters' pod, service and mesh CIDRs must not overlap; meshd drops and
reports (Event on the ClusterLink, log line) any remote range that overlaps a
local one.

Trust is explicit: the link Secret records the ranges the linked cluster may
claim (meshd.io/remote-allowed-cidrs): its mesh and service CIDRs plus, by
default, its nodes' pod CIDRs, addresses and allowed-location-ips as seen now,
or what --from-allowed-cidr/--to-allowed-cidr give (give whole pod and node
networks so that nodes added later are covered; else run link again). meshd
refuses any other remote range, and any remote range covering a node's
underlay address, a WireGuard endpoint or the API server, with an Event on the
ClusterLink and the metric meshd_cluster_link_refused_ranges.

A cluster whose kubeconfig has no CA data is refused unless
--insecure-skip-tls-verify is given.`,
		Example: `  meshctl link --from-kubeconfig k1.yaml --from-name east --from-service-cidr 10.96.0.0/12 --from-mesh-cidr 10.4.0.0/16 \
               --to-kubeconfig k2.yaml --to-name west --to-service-cidr 10.97.0.0/16 --to-mesh-cidr 10.5.0.0/16
  # two contexts of one kubeconfig (the cluster names default to the contexts)
  meshctl --kubeconfig all.yaml link --from-context east --from-mesh-cidr 10.4.0.0/16 --to-context west --to-mesh-cidr 10.5.0.0/16`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs, ts, err := e.settingsOf(&from, &to)
			if err != nil {
				return err
			}
			if refresh {
				return e.refreshLinks(cmd.Context(), &from, &to, fs.Name, ts.Name, oneWay, insecure)
			}
			if o := overlaps(givenOnly(fs, "from-", cmd), givenOnly(ts, "to-", cmd)); len(o) > 0 {
				return fmt.Errorf("the clusters' ranges overlap, refusing to link:\n  %s", strings.Join(o, "\n  "))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), e.s.timeout)
			defer cancel()
			fc, tc, err := e.clientsOf(&from, &to)
			if err != nil {
				return err
			}
			ns := e.s.leaseNamespace
			// Refuse before changing anything: a cluster whose kubeconfig has
			// no CA could not be verified by the link.
			for _, c := range []struct {
				name string
				cl   *connect.Clients
			}{{fs.Name, fc}, {ts.Name, tc}} {
				if !insecure && !hasCA(c.cl) && !(oneWay && c.name == ts.Name) {
					return fmt.Errorf("cluster %s: %w", c.name, clusterlink.ErrNoCA)
				}
			}
			// Mesh flags not given come from what each cluster's meshd
			// publishes (linkpublished.go); overlapping ranges are refused.
			if fs, ts, err = e.linkSettingsFromClusters(ctx, cmd, &from, &to, fc, tc); err != nil {
				return err
			}
			if err := claimable(ctx, fc, &fs); err != nil {
				return err
			}
			if err := claimable(ctx, tc, &ts); err != nil {
				return err
			}
			grant := func(c *connect.Clients, ls clusterlink.LinkSettings, server string, reader *connect.Clients, readerName string) error {
				return clusterlink.GrantLinkWithOptions(ctx, c, ls, reader, readerName, ns, clusterlink.GrantOptions{Server: server, InsecureSkipTLSVerify: insecure})
			}
			if err := grant(fc, fs, from.server, tc, ts.Name); err != nil {
				return fmt.Errorf("letting %s read %s: %w", ts.Name, fs.Name, err)
			}
			fmt.Fprintf(e.stdout, "cluster %s now peers with the leaders of cluster %s (Secret %s/%s%s in %s); %s may claim %s\n",
				ts.Name, fs.Name, ns, clusterlink.LinkSecretPrefix, fs.Name, ts.Name, fs.Name, prefixList(fs.Allowed))
			if oneWay {
				return nil
			}
			if err := grant(tc, ts, to.server, fc, fs.Name); err != nil {
				return fmt.Errorf("letting %s read %s: %w", fs.Name, ts.Name, err)
			}
			fmt.Fprintf(e.stdout, "cluster %s now peers with the leaders of cluster %s (Secret %s/%s%s in %s); %s may claim %s\n",
				fs.Name, ts.Name, ns, clusterlink.LinkSecretPrefix, ts.Name, fs.Name, ts.Name, prefixList(ts.Allowed))
			return nil
		},
	}
	from.flags(c, "from-", "first")
	to.flags(c, "to-", "second")
	c.Flags().BoolVar(&oneWay, "one-way", false, "only let the second cluster peer with the first (the other direction is linked separately)")
	c.Flags().BoolVar(&refresh, "refresh", false, "renew the tokens of existing links (a new token, the ranges and settings recorded in the link Secrets kept); the --from-/--to- range flags are ignored")
	c.Flags().BoolVar(&insecure, "insecure-skip-tls-verify", false, "link although a cluster's kubeconfig has no CA data: the link kubeconfig then does not verify that API server's certificate")
	return c
}

// refreshLinks renews the token of the link(s) between the two clusters:
// each existing link Secret is granted again with what it records (ranges,
// settings, server), so only the token (and its expiry) changes.
func (e *env) refreshLinks(ctx context.Context, from, to *side, fromName, toName string, oneWay, insecure bool) error {
	ctx, cancel := context.WithTimeout(ctx, e.s.timeout)
	defer cancel()
	fc, tc, err := e.clientsOf(from, to)
	if err != nil {
		return err
	}
	ns := e.s.leaseNamespace
	renew := func(c *connect.Clients, name string, reader *connect.Clients, readerName string) error {
		s, err := reader.Kube.CoreV1().Secrets(ns).Get(ctx, clusterlink.LinkSecretPrefix+name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("cluster %s: reading link Secret %s/%s%s (link the clusters first): %w", readerName, ns, clusterlink.LinkSecretPrefix, name, err)
		}
		ls, kc, err := clusterlink.LinkFromSecret(s)
		if err != nil {
			return err
		}
		o := clusterlink.GrantOptions{InsecureSkipTLSVerify: insecure}
		if cfg, err := clientcmd.Load(kc); err == nil {
			for _, cl := range cfg.Clusters {
				o.Server = cl.Server
				o.InsecureSkipTLSVerify = o.InsecureSkipTLSVerify || cl.InsecureSkipTLSVerify
			}
		}
		if !o.InsecureSkipTLSVerify && !hasCA(c) {
			return fmt.Errorf("cluster %s: %w", name, clusterlink.ErrNoCA)
		}
		if err := clusterlink.GrantLinkWithOptions(ctx, c, ls, reader, readerName, ns, o); err != nil {
			return fmt.Errorf("renewing %s's token for %s: %w", readerName, name, err)
		}
		s, err = reader.Kube.CoreV1().Secrets(ns).Get(ctx, clusterlink.LinkSecretPrefix+name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		exp, _ := clusterlink.LinkTokenExpiry(s)
		fmt.Fprintf(e.stdout, "renewed the token cluster %s uses to read cluster %s (expires %s)\n", readerName, name, tokenExpiry(exp, e.now()))
		return nil
	}
	if err := renew(fc, fromName, tc, toName); err != nil {
		return err
	}
	if oneWay {
		return nil
	}
	return renew(tc, toName, fc, fromName)
}

// hasCA reports whether the client configuration carries a CA to verify
// the API server with.
func hasCA(c *connect.Clients) bool {
	return c != nil && c.Config != nil && (len(c.Config.CAData) > 0 || c.Config.CAFile != "")
}

func prefixList(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "nothing"
	}
	ss := make([]string, len(ps))
	for i, p := range ps {
		ss[i] = p.String()
	}
	return strings.Join(ss, ",")
}

func newUnlinkCommand(e *env) *cobra.Command {
	var from, to side
	c := &cobra.Command{
		Use:   "unlink --from-kubeconfig K1 --to-kubeconfig K2",
		Short: "Undo link: remove the link Secrets and revoke the reader tokens in both clusters",
		Long: `unlink removes, in both clusters, the link Secret and the reader
ServiceAccount and token that link created for the other cluster. The link
controller then deletes the ClusterLink, and meshd on every node removes the
other cluster's peers and routes.

Only the clusters (--from-/--to-kubeconfig or -context) and their names
(--from-/--to-name, default: the contexts) matter here; link's range and
settings flags are accepted and ignored.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			from.identityOnly()
			to.identityOnly()
			fs, ts, err := e.settingsOf(&from, &to)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), e.s.timeout)
			defer cancel()
			fc, tc, err := e.clientsOf(&from, &to)
			if err != nil {
				return err
			}
			ns := e.s.leaseNamespace
			err = errors.Join(clusterlink.RevokeLink(ctx, fc, fs.Name, tc, ts.Name, ns), clusterlink.RevokeLink(ctx, tc, ts.Name, fc, fs.Name, ns))
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "clusters %s and %s unlinked\n", fs.Name, ts.Name)
			return nil
		},
	}
	from.flags(c, "from-", "first")
	to.flags(c, "to-", "second")
	// Accepted (scripts share link's flags) but not shown: unlink reads
	// only the clusters and their names.
	for _, p := range []string{"from-", "to-"} {
		for _, f := range []string{"allowed-cidr", "mesh-cidr", "mesh-granularity", "port", "server", "service-cidr", "topology-label"} {
			if fl := c.Flags().Lookup(p + f); fl != nil {
				fl.Hidden = true
			}
		}
	}
	return c
}
