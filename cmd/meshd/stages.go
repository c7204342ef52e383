package main

import (
	"cmp"
	"log/slog"
	"net/netip"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
)

// The stages of one reconcile (reconciler.apply), in the order data flows:
//
//	sources ──snapshot──► inputs ──mesh.Build──► *mesh.Plan ──► executors
//	                                                     └────► report (reporter, publish)
//
// Each stage reads only what the one before handed it: nothing after the
// snapshot reads the API server, and the plan is a pure function of inputs.

// sources are where a reconcile's inputs come from: local caches and
// in-memory judges, never a live call.
type sources struct {
	nodeLister, peerLister lister
	// links lists the linked clusters as the link controller reports them
	// in ClusterLinks (nil: no cluster links).
	links linkSource
	// secrets reads Peer preshared keys from the Secret informer's cache
	// (secrets.PresharedKeys: a vanished Secret keeps the last known key);
	// dns answers Peer endpoint names from the background resolver's cache.
	// Nil: Peers with a preshared key are unusable, names resolve live.
	secrets convert.SecretLookup
	dns     func(host string) (netip.Addr, error)
	// liveness decides which nodes are live; freeze keeps its decisions
	// while the API is unreachable (nil: off).
	liveness *liveness.Liveness
	freeze   *liveFreeze
	// apiServers are the addresses of the API server meshd dials (its
	// kubeconfig's, when an IP) and apiServerSlices the cache of the
	// kubernetes Service's EndpointSlice (nil: none), whose endpoints are
	// where that address leads in a Pod (the ClusterIP, through
	// kube-proxy). No Peer and no linked cluster's range may cover either.
	apiServers      []netip.Addr
	apiServerSlices lister
}

// inputs are the planner's inputs of one reconcile, converted from a
// snapshot of the sources (reconciler.inputs).
type inputs struct {
	self    *corev1.Node // this node's object, for reporting and publishing
	nodes   []mesh.Node
	objects []mesh.Peer // from Peer objects
	remote  []mesh.Peer // from linked clusters
	local   mesh.Local  // this node and the liveness decision
	// candidates are the leader candidates (mesh.Candidates); judged are
	// the nodes with an observed Lease (the keys of the decision's Live
	// before any freeze). A candidate probes the judged candidates.
	candidates, judged map[string]bool
}

// peers are every peer the plan routes to.
func (in inputs) peers() []mesh.Peer { return append(slices.Clip(in.objects), in.remote...) }

// executors apply a plan (executors.apply): each keeps its part of the
// kernel equal to it.
type executors struct {
	device     wgDevice
	routes     routeSetter
	ipt4, ipt6 iptablesSetter // ipt6 nil: no IPv6 iptables
	key        wgtypes.Key    // the WireGuard private key
	mtu        int
}

// reporter tells users about bad input and the plan's warnings: a log line
// and an Event, once per change.
type reporter struct {
	log    *slog.Logger
	events record.EventRecorder
	// reported remembers the last annotation problems reported per object, so
	// a bad annotation yields one Event, not one per resync.
	reported map[string]string
	// planWarnings are the warnings of the last plan, so each is logged and
	// raised as an Event once, not on every reconcile.
	planWarnings map[string]bool
}

// reconcilerParts are what a reconciler is built from.
type reconcilerParts struct {
	log      *slog.Logger
	opts     mesh.Options
	node     string // this node's Node name
	port     int
	topology string // the node label giving the location
	facts    localFacts

	sources   sources
	executors executors
	events    record.EventRecorder
	kube      kubernetes.Interface // publishes this node's annotations
	metrics   *metrics
	// prober, when set, gets the probe targets of every plan.
	prober    probeSetter
	probePort int
	// tunnel, when set, gets the tunnel probe targets (linked clusters'
	// leaders) while this node leads its location.
	tunnel   probeSetter
	stateDir string // "" persists nothing
	// nextKey is a key rotation's next key found on disk at start (zero:
	// none; rotate.go).
	nextKey wgtypes.Key
	// peerStatus takes the Peer findings of every reconcile (nil: none).
	peerStatus peerReporter
	// settings is the meshd.io/settings value this node publishes.
	settings string
	// leaderCandidates is --leader-candidates (mesh.Candidates; 0: the
	// default); republish has the heartbeat publish a changed candidacy
	// at once (nil: at the next renewal).
	leaderCandidates int
	republish        func()
}

// newReconciler builds the reconciler: the one place it is assembled, for
// the daemon and the tests alike.
func newReconciler(p reconcilerParts) *reconciler {
	r := &reconciler{
		opts: p.opts, node: p.node, port: p.port, topology: p.topology, facts: p.facts,
		sources:   p.sources,
		executors: p.executors,
		reporter:  reporter{log: p.log, events: p.events},
		kube:      p.kube,
		prober:    p.prober, probePort: p.probePort, tunnel: p.tunnel,
		metrics:  p.metrics,
		stateDir: p.stateDir,
		nextKey:  p.nextKey, peerStatus: p.peerStatus, settings: p.settings,
		leaderCandidates: cmp.Or(p.leaderCandidates, mesh.DefaultLeaderCandidates), republish: p.republish,
	}
	r.setKey(p.executors.key)
	return r
}

// setKey makes k the WireGuard private key. Only the reconcile goroutine
// calls it (a key rotation); others read the public key with publicKey.
func (r *reconciler) setKey(k wgtypes.Key) {
	r.key = k
	pub := k.PublicKey()
	r.pub.Store(&pub)
}

// publicKey is the public key of the current private key, for readers
// outside the reconcile goroutine (the debug endpoint).
func (r *reconciler) publicKey() wgtypes.Key {
	if p := r.pub.Load(); p != nil {
		return *p
	}
	return wgtypes.Key{}
}
