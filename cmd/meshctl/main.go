// Command meshctl is meshd's user CLI. It reads a cluster's Nodes, Peers and
// heartbeat Leases through a kubeconfig and computes, with the same planner
// the meshd daemons run (pkg/mesh), the mesh the nodes build: WireGuard
// configurations of nodes and outside peers, the topology graph and a
// status overview. Only `meshctl link` and `meshctl unlink` change clusters:
// they write or remove the cluster-link Secrets and their reader credentials;
// and `meshctl rotate-key` sets one annotation on one Node.
//
// Out of scope: planning of its own (it runs pkg/mesh, so it shows what the
// daemons do) and any kernel access or node configuration.
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
)

// version is set by the linker.
var version = "dev"

func main() {
	e := &env{stdout: os.Stdout, stderr: os.Stderr, newClients: newClients, now: time.Now, nodeGet: nodeProxyGet}
	os.Exit(e.execute(os.Args[1:]))
}

// execute runs meshctl with args and returns the exit code: 0, 1 on
// failure, 2 on a bad invocation.
func (e *env) execute(args []string) int {
	root := newRootCommand(e)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		fmt.Fprintf(e.stderr, "meshctl: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

// usageError marks a bad invocation (exit code 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// env is what every command shares: the global flags and the outputs.
type env struct {
	stdout, stderr io.Writer
	// newClients builds clients for a kubeconfig and a context in it
	// ("": the current one).
	newClients func(kubeconfig, kubecontext string) (*connect.Clients, error)
	now        func() time.Time
	// resolve resolves Peer endpoint names (nil: the system resolver).
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// remoteClients builds clients from a link Secret's kubeconfig (nil:
	// remoteClientsFromKubeconfig).
	remoteClients func(kubeconfig []byte) (*connect.Clients, error)
	// pollInterval is how often status --wait reads again (0: 2s).
	pollInterval time.Duration
	s            settings
	// changed reports whether a global flag was given (set before a
	// command runs; nil: none was).
	changed func(name string) bool
	// nodeGet reaches a node's meshd (nil: through the API server's node
	// proxy, nodeproxy.go).
	nodeGet nodeGetter
}

func newRootCommand(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "meshctl",
		Short: "Inspect a meshd WireGuard mesh and generate configurations",
		Long: `meshctl reads a cluster's Nodes, Peers and meshd heartbeat Leases and computes,
with the same planner the meshd DaemonSet runs, what the nodes configure:
WireGuard configurations of nodes and outside peers, the topology, a status
overview. It only reads the cluster, except link, unlink and rotate-key.

Two clusters are joined in one of two ways (docs/multi-cluster.md):
  manual     for each node of cluster 1, "meshctl showconf node NODE
             --as-peer -o yaml" piped into "kubectl apply" on cluster 2 (a
             non-leader prints nothing), and the other way round; re-run the
             loop when nodes or leaders change.
  automatic  "meshctl link --from-kubeconfig K1 --to-kubeconfig K2" once: the
             link controller (meshd link) of each cluster keeps the other's
             leaders as peers by itself; "meshctl unlink" undoes it.

The global --mesh-granularity, --mesh-cidr, --port, --topology-label,
--lease-namespace and --lease-duration flags describe the cluster's meshd.
Each node's meshd publishes its settings (annotation meshd.io/settings), and
meshctl takes them from there; a flag given on the command line wins (a
what-if: meshctl then computes a different mesh than the nodes do, and says
so on stderr).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) {
		e.changed = cmd.Flags().Changed
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w (see %s --help)", err, c.CommandPath())}
	})
	f := root.PersistentFlags()
	f.StringVar(&e.s.kubeconfig, "kubeconfig", "", "path to the kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&e.s.context, "context", "", "the kubeconfig context to use (default: its current context)")
	f.StringVar(&e.s.granularity, "mesh-granularity", string(mesh.GranularityLocation), "the cluster's meshd --mesh-granularity: location or full (default: what the nodes publish, else location)")
	f.StringSliceVar(&e.s.meshCIDRs, "mesh-cidr", []string{"10.4.0.0/16"}, "the cluster's meshd --mesh-cidr (repeatable: one IPv4 and one IPv6; default: what the nodes publish, else 10.4.0.0/16)")
	f.IntVar(&e.s.port, "port", mesh.DefaultPort, "the cluster's meshd --port (WireGuard UDP port; default: what the nodes publish, else 51820)")
	f.StringVar(&e.s.topologyLabel, "topology-label", convert.DefaultTopologyLabel, "the cluster's meshd --topology-label (Node label giving the location; default: what the nodes publish)")
	f.StringVar(&e.s.leaseNamespace, "lease-namespace", liveness.DefaultNamespace, "the cluster's meshd --lease-namespace (heartbeat Leases, used to tell live nodes for leader election; default: what the nodes publish)")
	f.DurationVar(&e.s.leaseDuration, "lease-duration", 40*time.Second, "the cluster's meshd --lease-duration: a node whose Lease was renewed longer ago counts as dead (default: what the nodes publish)")
	f.IntVar(&e.s.leaderCandidates, "leader-candidates", mesh.DefaultLeaderCandidates, "the cluster's meshd --leader-candidates: how many live leader candidates each location keeps (default: what the nodes publish)")
	f.DurationVar(&e.s.timeout, "request-timeout", 30*time.Second, "time limit for reading the cluster")
	_ = root.RegisterFlagCompletionFunc("mesh-granularity", cobra.FixedCompletions([]string{"location", "full"}, cobra.ShellCompDirectiveNoFileComp))

	root.AddCommand(newShowconfCommand(e), newGraphCommand(e), newStatusCommand(e), newCheckCommand(e), newDiagnoseCommand(e), newLinkCommand(e), newUnlinkCommand(e), newVersionCommand(e))
	root.AddCommand(newRotateKeyCommand(e))
	// Before strictArgs, which adds the completion commands: they keep the
	// output they see then.
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	strictArgs(root)
	return root
}

// strictArgs makes every unexpected argument a bad invocation: exit 2, a
// usage message on stderr and nothing on stdout. Cobra alone exits 1 for an
// unknown command or an extra argument, and prints the help on stdout with
// exit 0 for a command that only groups others (showconf, completion) given
// an argument, so `meshctl showconf nodes x > wg.conf` succeeded with help
// text in wg.conf. strictArgs makes those parents runnable (without
// arguments they still print their help), turns every argument check into
// a usageError, and has help reject an unknown topic.
func strictArgs(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		switch {
		case c.HasParent() && c.Name() == "help" && c.Run != nil:
			run := c.Run
			c.Run = nil
			c.RunE = func(cmd *cobra.Command, args []string) error {
				if found, rest, err := root.Find(args); err != nil || len(rest) > 0 || found == nil {
					return usageError{fmt.Errorf("unknown help topic %q (see %s --help)", strings.Join(args, " "), root.CommandPath())}
				}
				run(cmd, args)
				return nil
			}
		case c.HasSubCommands() && !c.Runnable():
			c.Args = subcommandArgs
			c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		case c.Args != nil:
			check := c.Args
			c.Args = func(cmd *cobra.Command, args []string) error {
				err := check(cmd, args)
				var ue usageError
				if err != nil && !errors.As(err, &ue) {
					err = usageError{fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())}
				}
				return err
			}
		}
	}
	walk(root)
	// The help of a parent shows its subcommands' usage, as before it was
	// runnable (no "meshctl showconf [flags]" line). A usage function, not
	// a usage template: a template makes cobra run text/template, whose
	// reflection keeps every method of the binary alive (meshctl 29 MB ->
	// 48 MB, past the image's size budget).
	usage := root.UsageFunc()
	root.SetUsageFunc(func(c *cobra.Command) error {
		if !c.Runnable() || !c.HasAvailableSubCommands() {
			return usage(c)
		}
		w := c.OutOrStderr()
		var buf bytes.Buffer
		c.SetOut(&buf)
		err := usage(c)
		c.SetOut(w)
		_, werr := io.WriteString(w, strings.Replace(buf.String(), "Usage:\n  "+c.UseLine(), "Usage:", 1))
		return cmp.Or(err, werr)
	})
}

// subcommandArgs is the argument check of a command that only groups
// others: any argument left is an unknown command.
func subcommandArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	hint := ""
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, set only where cobra suggests itself
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		hint = "did you mean " + strings.Join(s, " or ") + "? "
	}
	return usageError{fmt.Errorf("unknown command %q for %q (%ssee %s --help)", args[0], cmd.CommandPath(), hint, cmd.CommandPath())}
}

// noArgs is the argument check of a command that takes none.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q (see %s --help)", cmd.CommandPath(), strings.Join(args, " "), cmd.CommandPath())}
	}
	return nil
}

func newVersionCommand(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print meshctl's version",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(e.stdout, version)
			return nil
		},
	}
}

func newShowconfCommand(e *env) *cobra.Command {
	c := &cobra.Command{
		Use:   "showconf",
		Short: "Print the WireGuard configuration of a node or of an outside peer",
		Long: `showconf prints WireGuard configurations computed from the cluster.

  meshctl showconf node NAME            the node's own WireGuard configuration
  meshctl showconf node NAME --as-peer  the node as a Peer of another cluster
  meshctl showconf peer NAME            what outside Peer NAME applies to join

Private keys never leave the nodes (or the peer's machine): they are never
printed.`,
	}
	c.AddCommand(newShowconfNodeCommand(e), newShowconfPeerCommand(e))
	return c
}

func newShowconfNodeCommand(e *env) *cobra.Command {
	var (
		asPeer     bool
		output     string
		allowedIPs []string
		prefix     string
		labels     []string
	)
	c := &cobra.Command{
		Use:   "node NAME",
		Short: "Print a node's WireGuard configuration, or the node as a Peer of another cluster",
		Long: `Without --as-peer: the WireGuard configuration node NAME runs (as wg showconf
would print it on the node, without the private key).

With --as-peer: a Peer manifest (meshd.io/v1alpha1) that makes node NAME a peer
of another meshd cluster: its public key, its endpoint, its keepalive and,
as allowed IPs, everything routed through it (its location's pod CIDRs,
internal IPs, mesh IPs and allowed-location-ips) plus --allowed-ips. Only a
location leader carries WireGuard traffic: for any other node nothing is
printed on stdout (the reason goes to stderr) and the exit code is 0, so a
loop over all nodes stays correct as leaders change.

Output formats (-o): wireguard, yaml, json. Default: wireguard, or yaml with
--as-peer.`,
		Example: `  meshctl showconf node node-1
  meshctl --kubeconfig k1 showconf node node-1 --as-peer --allowed-ips 10.96.0.0/12 | kubectl --kubeconfig k2 apply -f -`,
		Args:              exactArgs("NAME"),
		ValidArgsFunction: e.completeNodes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output == "" {
				output = "wireguard"
				if asPeer {
					output = "yaml"
				}
			}
			if err := checkOutput(output, "wireguard", "yaml", "json"); err != nil {
				return err
			}
			if !asPeer && (len(allowedIPs) > 0 || prefix != "" || len(labels) > 0) {
				return usageError{errors.New("--allowed-ips, --peer-name-prefix and --label need --as-peer")}
			}
			lbls, err := parseLabels(labels)
			if err != nil {
				return usageError{fmt.Errorf("--label: %w", err)}
			}
			extra, err := parseCIDRs(allowedIPs)
			if err != nil {
				return usageError{fmt.Errorf("--allowed-ips: %w", err)}
			}
			m, err := e.load(cmd.Context())
			if err != nil {
				return err
			}
			if asPeer {
				return showAsPeer(e.stdout, e.stderr, m, args[0], asPeerOptions{Format: output, ExtraAllowedIPs: extra, NamePrefix: prefix, Labels: lbls})
			}
			return showNode(e.stdout, e.stderr, m, args[0], output)
		},
	}
	f := c.Flags()
	f.BoolVar(&asPeer, "as-peer", false, "print the node as a Peer of another cluster instead of its own configuration")
	f.StringVarP(&output, "output", "o", "", "output format: wireguard, yaml or json (default wireguard; yaml with --as-peer)")
	f.StringSliceVar(&allowedIPs, "allowed-ips", nil, "with --as-peer: extra CIDRs routed through the node, e.g. the service CIDR (comma separated, repeatable)")
	f.StringVar(&prefix, "peer-name-prefix", "", "with --as-peer: prefix of the Peer's name, e.g. cluster1- (default: the node name alone)")
	f.StringArrayVar(&labels, "label", nil, "with --as-peer: KEY=VALUE label of the Peer, e.g. meshd.io/from=cluster1 (repeatable; app.kubernetes.io/managed-by=meshctl is always set)")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"wireguard", "yaml", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func newShowconfPeerCommand(e *env) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "peer NAME",
		Short: "Print the WireGuard configuration outside Peer NAME applies to join the mesh",
		Long: `Prints what the machine behind Peer NAME (a laptop, a VPN server) configures:
one [Peer] per location leader (public key, endpoint, allowed IPs, keepalive
in seconds). The output is accepted by wg setconf. It holds no private key:
add yours with "wg set IFACE private-key FILE"; the Address lines are
comments because wg setconf rejects them (add the addresses with ip address
add, or uncomment them for wg-quick).

Output formats (-o): wireguard (default), yaml, json.`,
		Example: `  meshctl showconf peer laptop > wg0.conf
  wg setconf wg0 wg0.conf && wg set wg0 private-key ./laptop.key`,
		Args:              exactArgs("NAME"),
		ValidArgsFunction: e.completePeers,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "wireguard", "yaml", "json"); err != nil {
				return err
			}
			m, err := e.load(cmd.Context())
			if err != nil {
				return err
			}
			return showPeer(e.stdout, e.stderr, m, args[0], output)
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "wireguard", "output format: wireguard, yaml or json")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"wireguard", "yaml", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func newGraphCommand(e *env) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "graph",
		Short: "Print the mesh topology as a Graphviz graph",
		Long: `Prints the topology in Graphviz dot: every location is a cluster box, its
leader drawn bold, outside Peers as ellipses. A solid edge is a WireGuard link,
labelled with the allowed IPs the tail routes to the head; a dashed edge joins
a non-leader to its leader (underlay, no WireGuard).

-o svg runs Graphviz's dot, which must be in PATH.`,
		Example: `  meshctl graph | dot -Tpng > mesh.png
  meshctl graph -o svg > mesh.svg`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "dot", "svg"); err != nil {
				return err
			}
			if output == "svg" {
				if _, err := lookPath("dot"); err != nil {
					return errors.New("-o svg needs Graphviz's dot in PATH and it was not found; install graphviz, or use -o dot and render elsewhere")
				}
			}
			m, err := e.load(cmd.Context())
			if err != nil {
				return err
			}
			g := renderGraph(m)
			if output == "svg" {
				return runDot(cmd.Context(), g, e.stdout)
			}
			_, err = io.WriteString(e.stdout, g)
			return err
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "dot", "output format: dot or svg")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"dot", "svg"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

// load reads the cluster and computes the model. Global flags not given
// take the settings the cluster's meshd publishes (settings.go).
func (e *env) load(ctx context.Context) (*model, error) {
	if _, err := e.s.options(); err != nil {
		return nil, usageError{err}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, e.s.timeout)
	defer cancel()
	c, err := e.newClients(e.s.kubeconfig, e.s.context)
	if err != nil {
		return nil, err
	}
	set, cs := e.s, clusterSettings{}
	var notes []string
	snap, err := fetch(ctx, c, func(nodes []*corev1.Node) string {
		cs = readClusterSettings(nodes)
		set, notes = e.s.withPublished(cs.Settings, e.changed)
		return set.leaseNamespace
	})
	if err != nil {
		return nil, err
	}
	opts, err := set.options()
	if err != nil {
		return nil, fmt.Errorf("the settings the cluster's meshd publishes (meshd.io/settings) are not usable; pass the flags: %w", err)
	}
	notes = append(notes, snap.Notes...)
	notes = append(notes, e.s.overridden(cs.Settings, e.changed)...)
	for _, n := range notes {
		fmt.Fprintf(e.stderr, "meshctl: %s\n", n)
	}
	m, err := newModel(ctx, snap, opts, set, e.now(), e.resolve)
	if err != nil {
		return nil, err
	}
	m.Published = cs
	for _, n := range m.Notes {
		fmt.Fprintf(e.stderr, "meshctl: warning: %s\n", n)
	}
	return m, nil
}

func exactArgs(name string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usageError{fmt.Errorf("%s wants exactly one argument, %s (see %s --help)", cmd.CommandPath(), name, cmd.CommandPath())}
		}
		return nil
	}
}

func checkOutput(got string, valid ...string) error {
	for _, v := range valid {
		if got == v {
			return nil
		}
	}
	return usageError{fmt.Errorf("-o %q: want one of %v", got, valid)}
}

// completeNodes completes node names from the cluster (best effort).
func (e *env) completeNodes(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	names, _ := e.names(cmd.Context(), false)
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completePeers completes Peer names from the cluster (best effort).
func (e *env) completePeers(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	names, _ := e.names(cmd.Context(), true)
	return names, cobra.ShellCompDirectiveNoFileComp
}

func (e *env) names(ctx context.Context, peers bool) ([]string, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := e.newClients(e.s.kubeconfig, e.s.context)
	if err != nil {
		return nil, err
	}
	snap, err := fetch(ctx, c, func([]*corev1.Node) string { return e.s.leaseNamespace })
	if err != nil {
		return nil, err
	}
	var out []string
	if peers {
		for _, p := range snap.Peers {
			out = append(out, p.Name)
		}
	} else {
		for _, n := range snap.Nodes {
			out = append(out, n.Name)
		}
	}
	return out, nil
}
