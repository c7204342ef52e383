package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
)

// settings are the global flags: the cluster's meshd settings.
type settings struct {
	kubeconfig     string
	context        string
	granularity    string
	meshCIDRs      []string
	port           int
	topologyLabel  string
	leaseNamespace string
	leaseDuration  time.Duration
	// leaderCandidates is the cluster's meshd --leader-candidates.
	leaderCandidates int
	timeout          time.Duration
}

// options turns the flags into planner options, validated like meshd's.
func (s settings) options() (mesh.Options, error) {
	var errs []error
	o := mesh.Options{Port: s.port}
	g, err := mesh.ParseGranularity(s.granularity)
	if err != nil {
		errs = append(errs, fmt.Errorf("--mesh-granularity %w", err))
	}
	o.Granularity = g
	o.MeshCIDRs, err = mesh.ParseMeshCIDRs(s.meshCIDRs)
	if err != nil {
		errs = append(errs, fmt.Errorf("--mesh-cidr: %w", err))
	}
	if s.port < 1 || s.port > 65535 {
		errs = append(errs, fmt.Errorf("--port %d: want 1-65535", s.port))
	}
	if s.leaseDuration <= 0 {
		errs = append(errs, fmt.Errorf("--lease-duration %s: must be positive", s.leaseDuration))
	}
	if s.leaderCandidates < 1 {
		errs = append(errs, fmt.Errorf("--leader-candidates %d: must be positive", s.leaderCandidates))
	}
	if s.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--request-timeout %s: must be positive", s.timeout))
	}
	return o, errors.Join(errs...)
}

// snapshot is what meshctl reads from the cluster.
type snapshot struct {
	Server string
	Nodes  []*corev1.Node
	Peers  []*v1alpha1.Peer
	// Leases are the heartbeat Leases; nil when they could not be read
	// (then every node counts as live).
	Leases []*coordinationv1.Lease
	// Notes are non-fatal problems for stderr.
	Notes []string
}

// fetch reads Nodes, Peers and heartbeat Leases; leaseNamespace gives the
// Leases' namespace from the Nodes (their published settings).
func fetch(ctx context.Context, c *connect.Clients, leaseNamespaceOf func([]*corev1.Node) string) (*snapshot, error) {
	s := &snapshot{Server: "the API server"}
	if c.Config != nil && c.Config.Host != "" {
		s.Server = c.Config.Host
	}
	nl, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiError(err, "listing Nodes", s.Server)
	}
	for i := range nl.Items {
		s.Nodes = append(s.Nodes, &nl.Items[i])
	}
	pl, err := c.Meshd.MeshdV1alpha1().Peers().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("Peer CRD not installed on %s: kubectl apply -f manifests/crds/", s.Server) //nolint:staticcheck // ST1005: Peer is the API kind.
	case err != nil:
		return nil, apiError(err, "listing Peers", s.Server)
	}
	for i := range pl.Items {
		s.Peers = append(s.Peers, &pl.Items[i])
	}
	leaseNamespace := leaseNamespaceOf(s.Nodes)
	ll, err := c.Kube.CoordinationV1().Leases(leaseNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		s.Notes = append(s.Notes, fmt.Sprintf("cannot read the heartbeat Leases in namespace %s (%v); assuming every node is live", leaseNamespace, shortError(err)))
	} else {
		s.Leases = []*coordinationv1.Lease{}
		for i := range ll.Items {
			s.Leases = append(s.Leases, &ll.Items[i])
		}
	}
	return s, nil
}

// apiError explains a failed API call, naming the server.
func apiError(err error, what, server string) error {
	switch {
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s on %s: not authorized (check the credentials of your kubeconfig): %w", what, server, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s on %s: forbidden (meshctl needs to list nodes, leases and peers.meshd.io): %w", what, server, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s on %s: no answer in time (is the API server reachable? see --kubeconfig, --request-timeout): %w", what, server, err)
	case apierrors.ReasonForError(err) == metav1.StatusReasonUnknown:
		return fmt.Errorf("%s: cannot reach the API server %s (check --kubeconfig and its current context): %w", what, server, err)
	}
	return fmt.Errorf("%s on %s: %w", what, server, err)
}

func shortError(err error) string {
	if s := apierrors.ReasonForError(err); s != metav1.StatusReasonUnknown {
		return strings.ToLower(string(s))
	}
	return err.Error()
}

// model is the cluster as the planner sees it.
type model struct {
	Server string
	Opts   mesh.Options
	Now    time.Time
	// Objs and PeerObjs are the objects by name.
	Objs     map[string]*corev1.Node
	PeerObjs map[string]*v1alpha1.Peer
	Input    convert.MeshInput
	// Live is what Local.Live gets (nil: every node live); Candidates what
	// Local.Candidates gets (the leader candidates: only they lead); Leases
	// tells whether a node has a heartbeat Lease at all.
	Live       map[string]bool
	Candidates map[string]bool
	Leases     map[string]bool
	// Reports are the probe reports the nodes publish on their Leases.
	Reports map[string]liveness.Report
	// Topo is the cluster-wide topology (no local node).
	Topo *mesh.Topology
	// Notes are problems worth a line on stderr.
	Notes []string
	// Linked are the linked clusters (status only).
	Linked []linkedCluster
	// ClusterLinks are the link controller's ClusterLinks (status only).
	ClusterLinks []clusterLinkState
	// Set are the effective settings (flags, else published, else
	// defaults); Published what the nodes publish (settings.go).
	Set       settings
	Published clusterSettings
}

// pskPlaceholder stands for a preshared key meshctl does not read: Peers
// referencing one stay usable and are shown with a reference to the Secret.
var pskPlaceholder = make([]byte, 32)

// newModel converts the snapshot like the daemons do and computes the
// topology. resolve (nil: the system resolver) resolves Peer endpoint names.
func newModel(ctx context.Context, s *snapshot, opts mesh.Options, set settings, now time.Time, resolve func(context.Context, string) ([]netip.Addr, error)) (*model, error) {
	m := &model{
		Server:   s.Server,
		Set:      set,
		Opts:     opts,
		Now:      now,
		Objs:     make(map[string]*corev1.Node, len(s.Nodes)),
		PeerObjs: make(map[string]*v1alpha1.Peer, len(s.Peers)),
	}
	for _, n := range s.Nodes {
		m.Objs[n.Name] = n
	}
	for _, p := range s.Peers {
		m.PeerObjs[p.Name] = p
	}
	m.Input = convert.NewMeshInput(ctx, s.Nodes, s.Peers, convert.MeshInputOptions{
		Parse: convert.ParseOptions{TopologyLabel: set.topologyLabel, Port: set.port},
		// meshctl does not read Secrets: see pskPlaceholder.
		Secret:  func(_, _, _ string) ([]byte, error) { return pskPlaceholder, nil },
		Resolve: resolve,
	})
	m.Notes = outsideMeshCIDR(m.Input.Nodes, opts.MeshCIDRs)
	if s.Leases != nil {
		m.Live, m.Leases = leaseLiveness(s.Leases, set.leaseDuration, now)
		// The leader candidates and the data-plane votes they publish on
		// their Leases, judged as every meshd judges them
		// (docs/failover.md).
		m.Reports = leaseReports(s.Leases)
		m.Live, m.Candidates = judgeCandidates(m.Live, m.Reports, m.Input.Nodes, opts.Granularity, set.leaderCandidates)
	}
	t, err := mesh.NewTopology(m.Input.Nodes, m.Input.Peers, mesh.Local{Live: m.Live, Candidates: m.Candidates}, opts)
	if err != nil {
		return nil, fmt.Errorf("computing the topology: %w", err)
	}
	m.Topo = t
	return m, nil
}

// outsideMeshCIDR notes mesh IPs the nodes published outside --mesh-cidr: the
// flags then do not match the cluster's meshd, and the computed mesh IPs
// would be wrong.
func outsideMeshCIDR(nodes []mesh.Node, cidrs []netip.Prefix) []string {
	var notes []string
	for _, n := range nodes {
		for _, ip := range n.WireGuardIPs {
			inside := false
			for _, c := range cidrs {
				inside = inside || c.Contains(ip)
			}
			if !inside {
				notes = append(notes, fmt.Sprintf("node %s publishes mesh IP %s outside --mesh-cidr %v: pass the cluster's meshd --mesh-cidr, or the output is wrong", n.Name, ip, cidrs))
			}
		}
	}
	return notes
}

// leaseLiveness judges nodes from their heartbeat Leases: live when renewed
// within timeout of now. The daemons instead time when they see a Lease
// change (immune to clock skew); meshctl sees one snapshot, so it compares
// the renew time with its own clock.
func leaseLiveness(leases []*coordinationv1.Lease, timeout time.Duration, now time.Time) (live, has map[string]bool) {
	live, has = map[string]bool{}, map[string]bool{}
	for _, l := range leases {
		node, ok := liveness.NodeNameFromLease(l)
		if !ok {
			continue
		}
		has[node] = true
		if l.Spec.RenewTime != nil {
			live[node] = now.Sub(l.Spec.RenewTime.Time) < timeout
		}
	}
	return live, has
}

// judgeCandidates judges the nodes as the daemons do (liveness.Judge): by
// their Leases and the probe reports of the leader candidates
// (mesh.Candidates, walked with leaseLive), the only nodes that probe and
// may lead.
func judgeCandidates(leaseLive map[string]bool, reports map[string]liveness.Report, nodes []mesh.Node, g mesh.Granularity, k int) (live, candidates map[string]bool) {
	candidates = mesh.Candidates(nodes, g, k, leaseLive)
	votes := make(map[string]liveness.Report, len(candidates))
	for n, r := range reports {
		if candidates[n] {
			votes[n] = r
		}
	}
	return liveness.Judge(leaseLive, votes, convert.LocationKeys(nodes, g)), candidates
}

// leaseReports are the probe reports published on the heartbeat Leases.
func leaseReports(leases []*coordinationv1.Lease) map[string]liveness.Report {
	out := make(map[string]liveness.Report, len(leases))
	for _, l := range leases {
		if node, ok := liveness.NodeNameFromLease(l); ok {
			out[node] = liveness.ReportFromLease(l)
		}
	}
	return out
}

// nodeNames lists the known nodes, for errors.
func (m *model) nodeNames() []string {
	out := make([]string, 0, len(m.Objs))
	for n := range m.Objs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (m *model) peerNames() []string {
	out := make([]string, 0, len(m.PeerObjs))
	for n := range m.PeerObjs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func unknown(kind, name string, known []string) error {
	if len(known) == 0 {
		return fmt.Errorf("%s %q not found: the cluster has no %ss", kind, name, kind)
	}
	return fmt.Errorf("%s %q not found; known %ss: %s", kind, name, kind, strings.Join(known, ", "))
}

// segmentOf returns the index of the segment holding node name, -1 if the
// node is not a WireGuard member.
func (m *model) segmentOf(name string) int {
	for s := range m.Topo.Segments {
		if slices.Contains(m.Topo.Segments[s].Nodes, name) {
			return s
		}
	}
	return -1
}

// node returns the converted node.
func (m *model) node(name string) (mesh.Node, bool) {
	for _, n := range m.Input.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return mesh.Node{}, false
}
