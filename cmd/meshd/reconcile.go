package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/iptables"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/probe"
	"meshd.io/meshd/pkg/route"
	"meshd.io/meshd/pkg/wg"
)

// The executors, narrowed to what the reconciler needs.
type (
	wgDevice interface {
		Set(wg.Config) error
		Stats() ([]wg.PeerStats, error)
	}
	routeSetter interface {
		Set([]route.Route, []route.Rule) error
		Cleanup() error
	}
	iptablesSetter interface {
		Set(iptables.Config) error
		Cleanup() error
	}
	lister interface{ List() []any }
	// linkSource lists the linked clusters (nil: no cluster links); Listed
	// is false until the link Secrets were listed once.
	linkSource interface {
		Snapshot() []clusterlink.Remote
		Listed() bool
	}
	// probeSetter takes the data-plane probe targets (failover.go).
	probeSetter interface{ SetTargets([]probe.Target) bool }
)

// discoveredFresh is how recent a handshake must be for its endpoint to be
// published for NAT traversal.
const discoveredFresh = convert.DiscoveredFresh

// reconciler runs one pass of the stages (stages.go): snapshot → inputs →
// mesh.Build → executors → report. newReconciler builds it.
type reconciler struct {
	opts     mesh.Options
	node     string
	port     int
	topology string
	facts    localFacts

	sources   // where the inputs come from: local caches only
	executors // what applies a plan
	reporter  // bad input and plan warnings, to users (its log is r.log)

	kube kubernetes.Interface // publishes this node's annotations
	// prober, when set, gets the probe targets of every plan (failover.go).
	prober    probeSetter
	probePort int
	tunnel    probeSetter // tunnel probes (failover.go), nil: none
	metrics   *metrics

	mu          sync.Mutex
	lastAttempt time.Time
	ready       atomic.Bool

	// stateDir holds the last applied state (state.go); "" persists nothing.
	stateDir string
	// savedPlan and savedLinks are what was last persisted (nil: nothing
	// yet); see saveState.
	savedPlan  *mesh.Plan
	savedLinks map[string][]mesh.Peer
	restoredAt atomic.Pointer[time.Time] // when the restored state was saved
	// linkPeers are the last known peers of every linked cluster, by link
	// Secret name (persisted with the plan).
	linkPeers map[string][]mesh.Peer
	// linkMesh are the mesh CIDRs of every linked cluster with known peers
	// (where its leaders' tunnel probe addresses are).
	linkMesh map[string][]netip.Prefix
	// discovered decides which discovered endpoints this node publishes
	// (with hysteresis); the plan uses the same view for this node.
	discovered convert.DiscoveredEndpoints
	// nodes keeps the conversions of unchanged Nodes between reconciles.
	nodes convert.NodeCache

	// nextKey is the next private key of a key rotation in progress (zero:
	// none); see rotate.go. rotationWarned: a request without a state
	// directory was reported.
	nextKey        wgtypes.Key
	rotationWarned bool
	// pub is the public key of executors.key (setKey), read by other
	// goroutines.
	pub atomic.Pointer[wgtypes.Key]
	// peerStatus takes the Peer findings of every reconcile (nil: none).
	peerStatus peerReporter
	// settings is the meshd.io/settings value this node publishes ("":
	// none); debug keeps the last plan for the debug endpoints (debug.go).
	settings string
	debug    debugRecord
	// leaderCandidates and republish: see reconcilerParts; candidacy is
	// whether this node is a leader candidate (published on its Lease).
	leaderCandidates int
	republish        func()
	candidacy        candidacy
}

func (r *reconciler) sinceLastAttempt() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastAttempt.IsZero() {
		return 0
	}
	return time.Since(r.lastAttempt)
}

// snapshot is the input of one reconcile, read from the caches.
type snapshot struct {
	nodes []*corev1.Node
	peers []*v1alpha1.Peer
	// apiServers are the API server's addresses (sources.apiServers and
	// the endpoints of the kubernetes Service's EndpointSlice).
	apiServers []netip.Addr
}

func (r *reconciler) snapshot() snapshot {
	var s snapshot
	for _, o := range r.nodeLister.List() {
		if n, ok := o.(*corev1.Node); ok {
			s.nodes = append(s.nodes, n)
		}
	}
	for _, o := range r.peerLister.List() {
		if p, ok := o.(*v1alpha1.Peer); ok {
			s.peers = append(s.peers, p)
		}
	}
	s.apiServers = r.apiServerAddrs()
	return s
}

// apiServerAddrs are the addresses meshd dials and the endpoints of the
// kubernetes Service's EndpointSlice in the cache (convert.APIServerEndpoints),
// sorted, once each.
func (r *reconciler) apiServerAddrs() []netip.Addr {
	if r.apiServerSlices == nil {
		return r.apiServers
	}
	var eps []*discoveryv1.EndpointSlice
	for _, o := range r.apiServerSlices.List() {
		// The informer lists that one object; a filter as well, for a cache
		// (or a fake) that holds more.
		if e, ok := o.(*discoveryv1.EndpointSlice); ok && e.Namespace == convert.APIServerEndpointSliceNamespace && e.Name == convert.APIServerEndpointSliceName {
			eps = append(eps, e)
		}
	}
	return convert.APIServerEndpoints(eps, r.apiServers...)
}

// reconcile makes the node equal to the plan for the current caches. A
// panic (a planner bug on input every node shares would otherwise crash-loop
// every node at once) is recovered and returned as an error: the node keeps
// what it last applied, and the caller retries with back-off.
func (r *reconciler) reconcile(ctx context.Context) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = r.recovered(p)
		}
	}()
	return r.apply(ctx, r.snapshot())
}

// errPanicked is what a reconcile that panicked counts as in the metrics.
var errPanicked = errors.New("reconcile panicked")

// recovered reports a recovered panic: log with the stack, metric, Event.
func (r *reconciler) recovered(p any) error {
	r.ready.Store(false)
	if r.metrics != nil {
		r.metrics.panics.Inc()
	}
	r.log.Error("reconcile panicked; keeping the last applied state and retrying with back-off", "panic", p, "stack", string(debug.Stack()))
	if r.events != nil {
		ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: r.node, UID: types.UID(r.node)}
		r.events.Eventf(ref, corev1.EventTypeWarning, "ReconcilePanic",
			"meshd recovered from a panic while reconciling; the node keeps its last applied state: %v", p)
	}
	return fmt.Errorf("%w: %v", errPanicked, p)
}

func (r *reconciler) apply(ctx context.Context, s snapshot) (err error) {
	// Every return sets err; only a panic leaves this value for the
	// deferred metrics.
	err = errPanicked
	start := time.Now()
	r.mu.Lock()
	r.lastAttempt = start
	r.mu.Unlock()
	defer func() {
		r.metrics.observe(time.Since(start), err)
	}()

	// A key rotation's switch starts before the plan (rotate.go).
	sw, rotErr := r.rotationBefore(s.self(r.node))
	defer func() { r.rotationUnfinished(sw, err) }()
	// Inputs: the snapshot converted into the planner's inputs.
	in, err := r.inputs(ctx, s)
	if err != nil {
		r.metrics.fail("snapshot")
		return err
	}
	// Plan: a pure function of the inputs.
	plan, err := mesh.Build(in.nodes, in.peers(), in.local, r.opts)
	if err != nil {
		r.metrics.fail("plan")
		return fmt.Errorf("planning: %w", err)
	}
	if r.prober != nil {
		r.prober.SetTargets(probeTargets(in.nodes, r.node, r.opts.Granularity, in.candidates, in.judged, plan.Leaders, r.probePort))
	}
	// Whether this node is a leader candidate: the heartbeat labels its
	// Lease, so that every node watches it (leases.go).
	if r.candidacy.set(in.candidates[r.node]) && r.republish != nil {
		r.republish()
	}
	if r.tunnel != nil {
		var ts []probe.Target
		if plan.Leader {
			ts = tunnelTargets(r.linkPeers, r.linkMesh)
		}
		if r.tunnel.SetTargets(ts) {
			r.log.Info("tunnel probe targets changed", "targets", len(ts), "leader", plan.Leader)
		}
	}
	r.reportWarnings(in.self, plan.Warnings)

	// Apply: every part is attempted even if another fails.
	errs := r.executors.apply(plan, r.metrics)
	sw, errs = r.rotationExecuted(sw, errs, rotErr)
	// Persist what was applied for a restart during an API outage, also
	// after a partial failure: every part that could be applied was, and
	// restoring an older plan would undo it (peers that work removed).
	r.saveState(plan)
	// Report: publish what other nodes need.
	perr := r.publish(ctx, in.self, plan, sw, newDiscoveryKeys(in.nodes, in.peers()))
	if perr != nil {
		r.metrics.fail("publish")
		errs = append(errs, fmt.Errorf("publishing node annotations: %w", perr))
	}
	if err := r.rotationPublished(plan, sw, perr); err != nil {
		errs = append(errs, err)
	}
	r.metrics.setPlan(plan, r.opts.Granularity, len(in.nodes), in.objects, in.remote)
	r.reportPeers(s.peers, in.objects, plan)
	r.debug.set(plan, errs)
	// Ready: programmed from fresh data, everything applied and reported.
	r.ready.Store(len(errs) == 0)
	if len(errs) == 0 {
		r.log.Debug("reconciled", "duration", time.Since(start), "peers", len(plan.WireGuard.Peers), "routes", len(plan.Routes), "leader", plan.Leader)
	}
	return errors.Join(errs...)
}

// inputs converts a snapshot into the planner's inputs: the Node and Peer
// objects (reporting each object's problems), the linked clusters' peers
// and the liveness decision.
func (r *reconciler) inputs(ctx context.Context, s snapshot) (inputs, error) {
	nodes, peers, self, err := r.meshInput(ctx, s)
	if err != nil {
		return inputs{}, err
	}
	in := inputs{self: self, nodes: nodes, objects: peers, remote: r.remotePeers(nodes, s.apiServers)}
	live := r.liveness.DecideCandidates(nodes, r.opts.Granularity, r.leaderCandidates)
	in.candidates, in.judged = live.Candidates, make(map[string]bool, len(live.Live))
	for n := range live.Live {
		in.judged[n] = true
	}
	if r.freeze != nil {
		// The API server unreachable from here: keep the last live set
		// (freeze.go); the Lease ages are frozen too (liveness.Liveness).
		live.Live = r.freeze.live(live.Live, time.Now())
	}
	in.local = mesh.Local{NodeName: r.node, Live: live.Live, Settling: live.Settling, Candidates: live.Candidates}
	return in, nil
}

// apply hands the plan to every executor (WireGuard, routes, iptables);
// each one is attempted even if another fails.
func (e *executors) apply(plan *mesh.Plan, m *metrics) []error {
	var errs []error
	if err := e.device.Set(wireGuardConfig(plan, e.key, e.mtu)); err != nil {
		m.fail("wireguard")
		errs = append(errs, fmt.Errorf("%w: %w", errConfigureWireGuard, err))
	}
	if err := e.routes.Set(routes(plan), rules(plan)); err != nil {
		m.fail("routes")
		errs = append(errs, fmt.Errorf("setting routes: %w", err))
	}
	if err := e.ipt4.Set(iptablesConfig(plan.IPTables.V4)); err != nil {
		m.fail("iptables")
		errs = append(errs, fmt.Errorf("setting IPv4 iptables: %w", err))
	}
	if e.ipt6 != nil {
		if err := e.ipt6.Set(iptablesConfig(plan.IPTables.V6)); err != nil {
			m.fail("iptables")
			errs = append(errs, fmt.Errorf("setting IPv6 iptables: %w", err))
		}
	}
	return errs
}

// meshInput converts the Node and Peer objects like every node does
// (convert.NewMeshInput), reports each object's problems once (log line and
// Event), and replaces the local node by what this node knows about itself.
func (r *reconciler) meshInput(ctx context.Context, s snapshot) ([]mesh.Node, []mesh.Peer, *corev1.Node, error) {
	in := convert.NewMeshInput(ctx, s.nodes, s.peers, convert.MeshInputOptions{
		Parse:  r.parseOptions(),
		Nodes:  &r.nodes,
		Secret: r.secrets,
		Cached: r.dns,
		// No Peer may route the API server (nor a node's address or endpoint).
		APIServers: s.apiServers,
	})
	var self *corev1.Node
	seen := make(map[string]bool, len(s.nodes)+len(s.peers))
	for _, o := range s.nodes {
		id := "node/" + o.Name
		r.report(o, id, "MalformedAnnotation", in.Problems[id])
		seen[id] = true
		if o.Name == r.node {
			self = o
		}
	}
	for _, o := range s.peers {
		id := "peer/" + o.Name
		r.report(o, id, "InvalidPeer", in.Problems[id])
		seen[id] = true
	}
	r.forgetReports("node/", seen)
	r.forgetReports("peer/", seen)
	if self == nil {
		return nil, nil, nil, fmt.Errorf("node %q not found in the API (set --hostname or $NODE_NAME to this node's Node name)", r.node)
	}
	r.observeDiscovered(self)
	for i := range in.Nodes {
		if in.Nodes[i].Name == r.node {
			in.Nodes[i] = r.selfNode(self)
		}
	}
	return in.Nodes, in.Peers, self, nil
}

// parseOptions are how this node parses Node objects (convert.NodeFromObject).
func (r *reconciler) parseOptions() convert.ParseOptions {
	return convert.ParseOptions{TopologyLabel: r.topology, Port: r.port}
}

// selfNode parses the local Node from what the user and the cluster say,
// ignoring what meshd itself published earlier (so a removed force-*
// annotation or a changed --port takes effect), and fills in what only this
// node knows: its key, and its addresses when the Node object has none.
func (r *reconciler) selfNode(o *corev1.Node) mesh.Node {
	o = o.DeepCopy()
	delete(o.Annotations, convert.AnnotationEndpoint)
	delete(o.Annotations, convert.AnnotationInternalIP)
	n, _ := convert.NodeFromObject(o, r.parseOptions())
	n.PublicKey = r.key.PublicKey()
	n.DiscoveredEndpoints = r.discovered.Published()
	if len(n.InternalIPs) == 0 {
		n.InternalIPs = slices.Clone(r.facts.addrs)
	}
	if n.Endpoint.IsZero() && len(n.InternalIPs) > 0 {
		n.Endpoint = mesh.Endpoint{Addr: netip.AddrPortFrom(preferV4(n.InternalIPs), uint16(r.port))}
	}
	return n
}

func preferV4(as []netip.Addr) netip.Addr {
	for _, a := range as {
		if a.Is4() {
			return a
		}
	}
	return as[0]
}

// remotePeers turns the location leaders of every linked cluster, as the
// link controller (`meshd link`) wrote them into its ClusterLink, into
// peers. Remote ranges overlapping this cluster's pod, mesh or service
// ranges, covering a node's underlay address, a WireGuard endpoint or the API
// server, or outside the ranges agreed at link time are dropped and reported
// on the ClusterLink (and meshd_cluster_link_refused_ranges), never routed.
//
// A linked cluster's peers are never removed because it cannot be read:
// until the controller has listed its Nodes, or while its link is unusable,
// the cluster keeps its last known peers (persisted with the plan). Only
// deleting the ClusterLink (the controller does when the link Secret goes)
// removes them.
func (r *reconciler) remotePeers(nodes []mesh.Node, apiServers []netip.Addr) []mesh.Peer {
	if r.links == nil {
		return nil
	}
	if r.linkPeers == nil {
		r.linkPeers = map[string][]mesh.Peer{}
	}
	if !r.links.Listed() {
		r.metrics.staleLinks.Set(float64(len(r.linkPeers)))
		var peers []mesh.Peer
		for _, name := range slices.Sorted(maps.Keys(r.linkPeers)) {
			peers = append(peers, r.linkPeers[name]...)
		}
		return peers
	}
	remotes := r.links.Snapshot()
	guard := mesh.LocalGuard(r.opts, nodes, apiServers...)
	var peers []mesh.Peer
	stale := 0
	defer func() { r.metrics.staleLinks.Set(float64(stale)) }()
	seen := make(map[string]bool, len(remotes))
	states := make(map[string]linkState, len(remotes))
	for _, rc := range remotes {
		name := rc.Link.Cluster
		id := "link/" + name
		seen[id] = true
		if rc.Err != nil || !rc.Observed {
			if rc.Err != nil {
				r.report(rc.Object, id, "InvalidClusterLink", []error{rc.Err})
			}
			if last, ok := r.linkPeers[name]; ok {
				stale++
				r.log.Debug("linked cluster not observed or unusable; keeping its last known peers", "cluster", name, "peers", len(last))
				peers = append(peers, last...)
			}
			continue
		}
		if rc.Unreachable {
			stale++ // fresh as of the controller's last sight of the cluster
		}
		ps, problems := rc.Peers(guard)
		r.report(rc.Object, id, clusterlink.RefusalEventReason(problems), problems)
		states[name] = linkState{expires: rc.TokenExpires, refused: problems}
		r.linkPeers[name] = ps
		if r.linkMesh == nil {
			r.linkMesh = map[string][]netip.Prefix{}
		}
		r.linkMesh[name] = slices.Clone(rc.Link.MeshCIDRs)
		peers = append(peers, ps...)
	}
	r.metrics.setLinks(states)
	for name := range r.linkPeers {
		if !seen["link/"+name] {
			delete(r.linkPeers, name) // unlinked
			delete(r.linkMesh, name)
		}
	}
	r.forgetReports("link/", seen)
	return peers
}

// report logs and records an Event for an object's problems when they
// differ from the last report.
func (r *reporter) report(obj runtimeObject, id, reason string, problems []error) {
	if r.reported == nil {
		r.reported = map[string]string{}
	}
	msg := errors.Join(problems...)
	text := ""
	if msg != nil {
		text = msg.Error()
	}
	if r.reported[id] == text {
		return
	}
	r.reported[id] = text
	if text == "" {
		return
	}
	r.log.Warn("ignoring malformed input", "object", id, "error", text)
	if r.events != nil {
		r.events.Event(obj, corev1.EventTypeWarning, reason, strings.ReplaceAll(text, "\n", "; "))
	}
}

// reportWarnings logs the plan's warnings that the previous plan did not
// have and raises each as a Warning Event on the node (reason PlanWarning);
// warnings gone are logged once as resolved. An unchanged set says nothing.
func (r *reporter) reportWarnings(self *corev1.Node, warnings []string) {
	cur := make(map[string]bool, len(warnings))
	for _, w := range warnings {
		if cur[w] {
			continue
		}
		cur[w] = true
		if r.planWarnings[w] {
			continue
		}
		r.log.Warn("plan", "warning", w)
		if r.events != nil {
			r.events.Event(self, corev1.EventTypeWarning, "PlanWarning", w)
		}
	}
	for w := range r.planWarnings {
		if !cur[w] {
			r.log.Info("plan warning resolved", "warning", w)
		}
	}
	r.planWarnings = cur
}

func (r *reporter) forgetReports(prefix string, seen map[string]bool) {
	for id := range r.reported {
		if strings.HasPrefix(id, prefix) && !seen[id] {
			delete(r.reported, id)
		}
	}
}

// errConfigureWireGuard marks a failed WireGuard write among the errors of
// execute.
var errConfigureWireGuard = errors.New("configuring WireGuard")

// self returns the Node object of node name in the snapshot, or nil.
func (s snapshot) self(name string) *corev1.Node {
	for _, n := range s.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// discoveryKeys says which discovered endpoints a node may publish: those
// of keys some node or peer of the plan's input still has (known), so a
// rotated-away key disappears at once, and, among them, those of nodes the
// plan may reach at a discovered endpoint (needed; mesh.UsesDiscoveredEndpoint),
// which are never left out for convert.DiscoveredLimit.
type discoveryKeys struct{ known, needed map[wgtypes.Key]bool }

func newDiscoveryKeys(nodes []mesh.Node, peers []mesh.Peer) discoveryKeys {
	k := discoveryKeys{known: make(map[wgtypes.Key]bool, len(nodes)+len(peers)), needed: mesh.DiscoveryKeys(nodes)}
	for _, n := range nodes {
		k.known[n.PublicKey] = true
	}
	for _, p := range peers {
		k.known[p.PublicKey] = true
	}
	return k
}

// publish writes this node's public facts to its Node object (only what
// changed; nothing when equal). The private key is never published.
// Discovered endpoints are published for known keys only, all of those
// needed and at most convert.DiscoveredLimit others (convert.LimitDiscovered),
// keeping the ones self already lists; sw is a key rotation's switch in this
// reconcile, if any (rotate.go).
func (r *reconciler) publish(ctx context.Context, self *corev1.Node, plan *mesh.Plan, sw *rotationSwitch, keys discoveryKeys) error {
	me := r.selfNode(self)
	pub := convert.Published{
		PublicKey:    r.key.PublicKey(),
		InternalIPs:  me.InternalIPs,
		WireGuardIPs: plan.MeshIPs[r.node],
	}
	if self.Annotations[convert.AnnotationForceEndpoint] == "" && me.Endpoint.Addr.IsValid() {
		pub.Endpoint = me.Endpoint.Addr
	}
	eps := maps.Clone(me.DiscoveredEndpoints)
	maps.DeleteFunc(eps, func(k wgtypes.Key, _ netip.AddrPort) bool { return !keys.known[k] })
	cur, _ := convert.NodeFromObject(self, r.parseOptions())
	pub.DiscoveredEndpoints = convert.LimitDiscovered(eps, func(k wgtypes.Key) bool { return keys.needed[k] }, cur.DiscoveredEndpoints, convert.DiscoveredLimit)
	want := convert.NodeAnnotations(pub)
	maps.Copy(want, r.rotationAnnotations(sw))
	if r.settings != "" {
		want[convert.AnnotationSettings] = r.settings
	}
	_, err := convert.PublishNode(ctx, r.kube, r.node, want, self)
	return err
}

// observeDiscovered feeds the endpoints of peers with a recent handshake
// into the hysteresis (convert.DiscoveredEndpoints), which starts from what this
// node published before. Handshake times themselves stay local (metrics).
func (r *reconciler) observeDiscovered(self *corev1.Node) {
	now := time.Now()
	if prev, _ := convert.NodeFromObject(self, r.parseOptions()); prev.DiscoveredEndpoints != nil {
		r.discovered.Seed(now, prev.DiscoveredEndpoints)
	}
	if stats, err := r.device.Stats(); err == nil {
		r.discovered.Observe(now, discovered(stats, now))
	}
}

// discovered returns the endpoints of peers with a recent handshake.
func discovered(stats []wg.PeerStats, now time.Time) map[wgtypes.Key]netip.AddrPort {
	var out map[wgtypes.Key]netip.AddrPort
	for _, s := range stats {
		if s.Endpoint == nil || s.LastHandshake.IsZero() || now.Sub(s.LastHandshake) > discoveredFresh {
			continue
		}
		ap := s.Endpoint.AddrPort()
		if !ap.IsValid() {
			continue
		}
		if out == nil {
			out = map[wgtypes.Key]netip.AddrPort{}
		}
		out[s.PublicKey] = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return out
}

// cleanup removes routes, rules and chains (the device is the caller's).
func (e *executors) cleanup() error {
	errs := []error{e.routes.Cleanup(), e.ipt4.Cleanup()}
	if e.ipt6 != nil {
		errs = append(errs, e.ipt6.Cleanup())
	}
	return errors.Join(errs...)
}
