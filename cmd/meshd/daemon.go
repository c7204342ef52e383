package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/dnscache"
	"meshd.io/meshd/pkg/iptables"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/client/clientset/versioned"
	meshdinformers "meshd.io/meshd/pkg/k8s/client/informers/externalversions/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/k8s/secrets"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/probe"
	"meshd.io/meshd/pkg/route"
	"meshd.io/meshd/pkg/wg"
)

// queueKey is the only work item: every event asks for one full reconcile,
// so a burst of events coalesces into one (see coalescer).
const queueKey = "mesh"

// routeResyncInterval is how often the route Manager lists and repairs its
// routes on its own, a net behind its netlink watch: every reconcile, the
// resync ticker's (--resync-period) included, applies the whole desired set
// anyway, so a second listing on the same period would only double the
// cost (about 20 ms of CPU per listing of 2,000 routes at 1,000 nodes).
const routeResyncInterval = 10 * time.Minute

// apiRequestTimeout bounds every API request the reconcile makes.
const apiRequestTimeout = 10 * time.Second

// daemon wires the informers, the reconciler and the HTTP endpoints.
type daemon struct {
	cfg  *config
	log  *slog.Logger
	rec  *reconciler
	reg  *prometheus.Registry
	kube *connect.Clients

	nodes, peers cache.SharedIndexInformer
	leases       *leaseWatch               // the heartbeat Leases this node needs (leases.go)
	secrets      cache.SharedIndexInformer // Peer preshared keys
	// apiServerSlices caches the EndpointSlice default/kubernetes (the API
	// server's own addresses, apiserver.go); unavailable when it may not
	// be read.
	apiServerSlices            cache.SharedIndexInformer
	apiServerSlicesUnavailable atomic.Bool
	dns                        *dnscache.Resolver
	queue                      workqueue.TypedRateLimitingInterface[string]
	coalesce                   *coalescer
	routes                     *route.Manager
	device                     *wg.Manager
	// clusterLinks caches the ClusterLinks the link controller writes
	// (nil: --cluster-links=false). Nodes hold no link credentials.
	clusterLinks cache.SharedIndexInformer
	stopEvents   func() // flushes and stops the Event broadcaster
	// prober: the data-plane failover signal (failover.go).
	prober *probe.Prober
	// tunnel probes the linked clusters' leaders through the tunnels
	// (ICMP to their mesh addresses; failover.go).
	tunnel *probe.Prober
	// republish asks the heartbeat to write what changed (a probe report,
	// the candidacy) now rather than at the next renewal.
	republish  chan struct{}
	filter     nodeFilter
	peerStatus *convert.PeerStatusWriter
	pingMu     sync.Mutex // one debug ping at a time (debug.go)
	nextKey    wgtypes.Key
}

func newDaemon(c *config, opts mesh.Options, log *slog.Logger) (*daemon, error) {
	clients, err := connect.NewClients(c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	key, err := wg.LoadOrCreateKey(c.StateDir)
	if err != nil {
		return nil, fmt.Errorf("loading the WireGuard key from %s: %w", c.StateDir, err)
	}
	// A key rotation in progress when meshd stopped resumes (rotate.go).
	nextKey, _, err := wg.LoadNextKey(c.StateDir)
	if err != nil {
		return nil, fmt.Errorf("loading the next WireGuard key of a rotation from %s: %w", c.StateDir, err)
	}
	facts, err := discoverLocal(log)
	if err != nil {
		// Not fatal: the Node's own addresses usually suffice.
		log.Warn("cannot discover the default-route interface; relying on the Node's addresses", "error", err)
	}
	mtu, _ := c.mtu()
	if mtu == 0 {
		mtu = facts.wireGuardMTU()
	}
	d := &daemon{cfg: c, log: log, kube: clients, reg: prometheus.NewRegistry(), nextKey: nextKey, republish: make(chan struct{}, 1)}
	exec, err := d.openExecutors(opts, key, mtu)
	if err != nil {
		return nil, err
	}
	if err := d.build(opts, facts, exec); err != nil {
		d.device.Close()
		return nil, err
	}
	return d, nil
}

// openExecutors opens the WireGuard interface, netlink and iptables.
func (d *daemon) openExecutors(opts mesh.Options, key wgtypes.Key, mtu int) (executors, error) {
	c, log := d.cfg, d.log
	lazy, lazyAbove := c.LazyPeers.options()
	dev, err := wg.NewManager(context.Background(), wg.Options{Name: c.Interface, Mode: wg.Mode(c.WireGuard), MTU: mtu, Logger: log, LazyPeers: lazy, LazyPeersAbove: lazyAbove})
	if err != nil {
		return executors{}, fmt.Errorf("opening WireGuard interface %s: %w", c.Interface, err)
	}
	routes, err := route.New(route.Options{Protocol: mesh.DefaultRouteProto, Table: opts.RouteTable, Logger: log, ResyncInterval: routeResyncInterval})
	if err != nil {
		dev.Close()
		return executors{}, fmt.Errorf("opening netlink: %w", err)
	}
	ipt4, err4 := iptables.New(iptables.Options{Family: iptables.IPv4, Backend: c.IPTablesMode, Logger: log})
	ipt6, err6 := iptables.New(iptables.Options{Family: iptables.IPv6, Backend: c.IPTablesMode, Logger: log})
	if err4 != nil {
		dev.Close()
		return executors{}, fmt.Errorf("setting up iptables: %w", err4)
	}
	writes := executorWrites{"wireguard": dev.Writes, "routes": routes.Writes, "iptables": ipt4.Restores}
	exec := executors{device: dev, routes: routes, ipt4: ipt4, key: key, mtu: mtu}
	if err6 != nil {
		log.Warn("IPv6 iptables unavailable; IPv6 rules are skipped", "error", err6)
	} else {
		exec.ipt6 = ipt6 // never a nil *Manager in the interface
		writes["iptables"] = func() uint64 { return ipt4.Restores() + ipt6.Restores() }
	}
	d.reg.MustRegister(writes, lazyPeerMetrics(dev.LazyStats))
	if c.LazyPeers == lazyPeersOn && dev.Kind() != wg.KindUserspaceInProcess {
		log.Warn("--wireguard-lazy-peers applies to the built-in userspace device only; every peer stays in this one", "kind", dev.Kind())
	}
	d.device, d.routes = dev, routes
	return exec, nil
}

// build makes the work queue, the informers and the reconciler (once all its
// parts exist: newReconciler).
func (d *daemon) build(opts mesh.Options, facts localFacts, exec executors) error {
	c, log := d.cfg, d.log
	m := newMetrics(d.reg, d.device)
	m.setPeerSeriesLimit(c.PeerMetricsLimit)
	clientGo := registerClientMetrics(d.reg)
	// Writes from the reconcile (node annotations, Events) get a request
	// timeout, so a hung API server cannot stall the single worker; the
	// informers' long-running watches keep the untimed client.
	writeCfg := rest.CopyConfig(d.kube.Config)
	writeCfg.Timeout = apiRequestTimeout
	writer, err := kubernetes.NewForConfig(writeCfg)
	if err != nil {
		return fmt.Errorf("building the API client: %w", err)
	}
	events, stopEvents := connect.NewEventRecorder(writer, "meshd")
	d.stopEvents = stopEvents
	d.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "meshd", MetricsProvider: clientGo})
	d.coalesce = newCoalescer(clock.RealClock{}, coalesceDelay, coalesceInterval, coalesceBurst, func() { d.queue.Add(queueKey) })
	d.filter = nodeFilter{self: c.Hostname, parse: convert.ParseOptions{TopologyLabel: c.TopologyLabel, Port: c.Port}}
	src, err := d.newSources()
	if err != nil {
		return err
	}
	// Report: Peer status, written in the background (peerstatus.go).
	peerWriter, err := versioned.NewForConfig(writeCfg)
	if err != nil {
		return fmt.Errorf("building the API client: %w", err)
	}
	d.peerStatus = convert.NewPeerStatusWriter(convert.PeerStatusOptions{Peers: peerWriter.MeshdV1alpha1(), Store: d.peers.GetStore(), Timeout: apiRequestTimeout, Metrics: clientGo, Logger: log})
	if err := d.setupFailover(opts.RulePriority); err != nil {
		return err
	}
	p := reconcilerParts{
		log: log, opts: opts, node: c.Hostname, port: c.Port, topology: c.TopologyLabel, facts: facts,
		sources: src, executors: exec, events: events, kube: writer, metrics: m, stateDir: c.StateDir,
		nextKey: d.nextKey, peerStatus: d.peerStatus, settings: c.publishedSettings(opts.MeshCIDRs, opts.ServiceCIDRs).Encode(),
		leaderCandidates: c.LeaderCandidates, republish: d.poke,
	}
	if d.prober != nil {
		p.prober, p.probePort = d.prober, c.ProbePort
	}
	if d.tunnel != nil {
		p.tunnel = d.tunnel
	}
	d.rec = newReconciler(p)
	return nil
}

// newSources starts nothing: it makes the informers (lean caches: convert.LeanNode),
// the DNS cache and the link watchers a reconcile reads from.
func (d *daemon) newSources() (sources, error) {
	c, clients, log := d.cfg, d.kube, d.log
	// Lean caches (convert.LeanNode, convert.DropManagedFields): only what
	// meshd reads is kept. No informer resync (period 0): a resync replays
	// every cached object to the handlers, which at 1,000 nodes means
	// re-parsing 1,000 Nodes and re-observing 1,000 Leases per period only
	// for the handlers to drop them as unchanged; the resync ticker (tick)
	// reconciles from the caches every --resync-period instead.
	factory := informers.NewSharedInformerFactoryWithOptions(clients.Kube, noInformerResync, informers.WithTransform(convert.LeanNode))
	d.nodes = factory.Core().V1().Nodes().Informer()
	leases, err := newLeaseWatch(clients.Kube, c, d.leaseHandler())
	if err != nil {
		return sources{}, fmt.Errorf("watching heartbeat Leases: %w", err)
	}
	d.leases = leases
	d.peers = connect.NewPeerInformer(clients, noInformerResync)
	if err := setTransform(d.peers, convert.DropManagedFields); err != nil {
		return sources{}, err
	}
	// Preshared-key Secrets come from a cache of the one namespace meshd may
	// read Secrets in; never from a live read in the reconcile.
	secretNS := c.PeerSecretNamespace
	d.secrets = informers.NewSharedInformerFactoryWithOptions(clients.Kube, noInformerResync, informers.WithNamespace(secretNS)).Core().V1().Secrets().Informer()
	d.apiServerSlices = newAPIServerSlices(clients.Kube)
	if err := setTransform(d.apiServerSlices, convert.DropManagedFields); err != nil {
		return sources{}, err
	}
	if err := d.apiServerSlices.SetWatchErrorHandlerWithContext(d.apiServerSlicesError); err != nil {
		return sources{}, err
	}
	d.dns = dnscache.NewResolver(dnscache.ResolverOptions{OnChange: d.enqueue, Logger: log})
	src := sources{
		nodeLister:      d.nodes.GetStore(),
		peerLister:      d.peers.GetStore(),
		secrets:         secrets.NewPresharedKeys(d.secrets.GetStore(), secretNS).Lookup,
		dns:             d.dns.Lookup,
		liveness:        liveness.NewLiveness(c.LeaseDuration, time.Now),
		freeze:          newLiveFreeze(log, c.LeaseDuration, time.Now()),
		apiServers:      convert.APIServerAddrs(clients.Config),
		apiServerSlices: d.apiServerSlices.GetStore(),
	}
	src.liveness.SetTakeoverDelay(c.TakeoverDelay)
	if c.ClusterLinks {
		d.clusterLinks = meshdinformers.NewClusterLinkInformer(clients.Meshd, c.ResyncPeriod, cache.Indexers{})
		if err := setTransform(d.clusterLinks, convert.DropManagedFields); err != nil {
			return sources{}, err
		}
		src.links = clusterlink.Source{Store: d.clusterLinks.GetStore(), Synced: d.clusterLinks.HasSynced}
	}
	return src, nil
}

// noInformerResync turns off the informers' own periodic replay of their
// caches (see newSources); the resync ticker covers drift.
const noInformerResync time.Duration = 0

// enqueue asks for a reconcile soon; repeated calls coalesce.
func (d *daemon) enqueue() { d.coalesce.signal() }

// handler enqueues a reconcile on every Peer event but informer resyncs
// (the same object again: the resync ticker covers them) and status writes
// (nodes reporting: nothing to plan).
func (d *daemon) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { d.enqueue() },
		UpdateFunc: func(old, cur any) {
			if sameVersion(old, cur) || statusOnly(old, cur) {
				return
			}
			d.enqueue()
		},
		DeleteFunc: func(any) { d.enqueue() },
	}
}

// nodeHandler enqueues a reconcile for Node adds and deletes, and for
// updates that change the mesh input (see nodeFilter).
func (d *daemon) nodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { d.enqueue() },
		UpdateFunc: func(old, cur any) {
			if o, ok := old.(*corev1.Node); ok {
				if n, ok := cur.(*corev1.Node); ok {
					if !d.filter.changed(o, n) {
						d.rec.metrics.filtered.Inc()
						return // kubelet heartbeats, our own writes, resyncs: nothing to plan
					}
					if d.filter.keyChanged(o, n) {
						// A rotated key: the node's packets wait for this
						// node to follow; skip the coalescing delay.
						d.queue.Add(queueKey)
						return
					}
				}
			}
			d.enqueue()
		},
		DeleteFunc: func(any) { d.enqueue() },
	}
}

func sameVersion(old, cur any) bool {
	o, err1 := meta.Accessor(old)
	c, err2 := meta.Accessor(cur)
	return err1 == nil && err2 == nil && o.GetResourceVersion() != "" && o.GetResourceVersion() == c.GetResourceVersion()
}

// poke asks the heartbeat to publish what changed now.
func (d *daemon) poke() {
	select {
	case d.republish <- struct{}{}:
	default:
	}
}

func (d *daemon) leaseHandler() cache.ResourceEventHandler {
	// renewed: the Lease itself changed (not an informer resync replaying it).
	observe := func(obj any, renewed bool) {
		l, ok := obj.(*coordinationv1.Lease)
		if !ok {
			return
		}
		node, mine := liveness.NodeNameFromLease(l)
		if !mine {
			return
		}
		if renewed && node == d.cfg.Hostname {
			d.rec.freeze.selfObserved(time.Now())
		}
		// A renewal that changes no liveness decision plans nothing.
		if d.rec.liveness.Observe(l) && d.rec.liveness.Changed() {
			d.enqueue()
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { observe(obj, true) },
		UpdateFunc: func(old, cur any) { observe(cur, !sameVersion(old, cur)) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if l, ok := obj.(*coordinationv1.Lease); ok {
				if node, mine := liveness.NodeNameFromLease(l); mine {
					d.rec.liveness.Forget(node)
					d.enqueue()
				}
			}
		},
	}
}

// secretHandler enqueues a reconcile when a Secret that a Peer references
// changes, so a rotated preshared key applies within the coalescing delay.
func (d *daemon) secretHandler() cache.ResourceEventHandler {
	changed := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		s, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		for _, o := range d.peers.GetStore().List() {
			if p, ok := o.(*v1alpha1.Peer); ok {
				if ref := p.Spec.PresharedKeySecretRef; ref != nil && ref.Namespace == s.Namespace && ref.Name == s.Name {
					d.enqueue()
					return
				}
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, cur any) { changed(cur) },
		DeleteFunc: changed,
	}
}

// synced reports whether every local cache has synced.
func (d *daemon) synced() bool {
	return d.nodes.HasSynced() && d.peers.HasSynced() && d.leases.synced() && d.secrets.HasSynced() && d.apiServerSlicesSynced()
}

// Run runs until ctx ends. Kernel state is left in place on return.
func (d *daemon) Run(ctx context.Context) error {
	for _, inf := range []struct {
		i cache.SharedIndexInformer
		h cache.ResourceEventHandler
	}{{d.nodes, d.nodeHandler()}, {d.peers, d.handler()}, {d.secrets, d.secretHandler()}, {d.apiServerSlices, d.apiServerSlicesHandler()}} {
		if _, err := inf.i.AddEventHandler(inf.h); err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
	}
	var g run.Group
	add := func(name string, run func(context.Context) error) { addActor(&g, ctx, d.log, name, run) }
	// The informers.
	add("informers", func(ictx context.Context) error {
		go d.nodes.RunWithContext(ictx)
		go d.peers.RunWithContext(ictx)
		go d.leases.Run(ictx)
		go d.secrets.RunWithContext(ictx)
		go d.apiServerSlices.RunWithContext(ictx)
		<-ictx.Done()
		return nil
	})
	// Peer endpoint names, resolved in the background.
	add("peer endpoint names", d.dns.Run)
	// Peer status: the report stage's writes.
	add("peer status", d.peerStatus.Run)
	// The reconcile worker.
	addActor(&g, ctx, d.log, "reconcile worker", d.work, d.coalesce.stop, d.queue.ShutDown)
	// Periodic resync and liveness expiry.
	add("resync", func(tctx context.Context) error { d.tick(tctx); return nil })
	// Route repair: the netlink watch.
	add("route repair", func(rctx context.Context) error {
		return d.routes.Run(rctx, func() { d.rec.metrics.repairs.WithLabelValues("routes").Inc(); d.enqueue() })
	})
	// The WireGuard interface: put back when deleted or recreated (its
	// routes went with it, so reconcile), first handshakes retried.
	add("WireGuard interface", func(lctx context.Context) error { return d.device.Run(lctx, d.enqueue) })
	if d.clusterLinks != nil { // linked clusters, as the link controller reports them
		if _, err := d.clusterLinks.AddEventHandler(d.handler()); err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
		add("cluster links", func(lctx context.Context) error { d.clusterLinks.RunWithContext(lctx); return nil })
	}
	// The liveness heartbeat, and the data-plane probes.
	add("heartbeat", d.runHeartbeat)
	if d.prober != nil {
		add("probes", d.prober.Run)
	}
	if d.tunnel != nil {
		add("tunnel probes", d.runTunnelProbes)
	}
	if d.cfg.DebugPprof != "" { // opt-in Go profiles
		add("pprof", func(pctx context.Context) error { return servePprof(pctx, d.log, d.cfg.DebugPprof) })
	}
	d.addServer(&g)
	addStopOnDone(&g, ctx)
	return g.Run()
}

// addServer adds to g the HTTP server of metrics, probes and debug state.
func (d *daemon) addServer(g *run.Group) {
	srv := &http.Server{Addr: d.cfg.Listen, Handler: d.mux(), ReadHeaderTimeout: 5 * time.Second}
	g.Add(func() error {
		d.log.Info("serving metrics and probes", "listen", d.cfg.Listen)
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("stopping: a part of meshd ended", "part", "metrics and probes server", "error", err)
			return fmt.Errorf("serving %s: %w", d.cfg.Listen, err)
		}
		return nil
	}, func(error) {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	})
}

// addStopOnDone adds to g an actor that stops the group when ctx is done
// (the signal), for the actors that do not watch ctx themselves (the HTTP
// server). When another actor stops the group first, it returns too: it
// used to wait for ctx alone, so an actor that failed left meshd hung,
// serving nothing and never logging why.
func addStopOnDone(g *run.Group, ctx context.Context) {
	sctx, cancel := context.WithCancel(ctx)
	g.Add(func() error { <-sctx.Done(); return ctx.Err() }, func(error) { cancel() })
}

// addActor adds to g an actor that runs run with a context of its own,
// derived from ctx and cancelled when the group stops, then calls stops
// (what else ends run, e.g. shutting its queue down). An actor that ends
// while ctx is not done stops the whole group: that is logged at once,
// with its name, since the error reaches the log only once every other
// actor has stopped.
func addActor(g *run.Group, ctx context.Context, log *slog.Logger, name string, run func(context.Context) error, stops ...func()) {
	actx, cancel := context.WithCancel(ctx)
	g.Add(func() error {
		err := run(actx)
		if actx.Err() == nil {
			log.Error("stopping: a part of meshd ended", "part", name, "error", err)
		}
		return err
	}, func(error) {
		cancel()
		for _, stop := range stops {
			stop()
		}
	})
}

// work is the single worker: it waits for the caches, then reconciles
// whenever asked, backing off on errors.
func (d *daemon) work(ctx context.Context) error {
	start := time.Now()
	// Program the node from the persisted state at once unless the caches
	// are already there (an API outage must not leave a restarted node
	// empty).
	if !d.synced() {
		d.rec.restore()
	}
	// Poll the caches every 10 ms (WaitForCacheSync's 100 ms would add up to
	// that much to every cold start).
	if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		return d.synced(), nil
	}); err != nil {
		return ctx.Err()
	}
	d.log.Info("caches synced", "node", d.cfg.Hostname, "wireguard", d.device.Kind(), "since_start", time.Since(start))
	d.queue.Add(queueKey)
	for first := true; ; first = false {
		key, shutdown := d.queue.Get()
		if shutdown {
			return nil
		}
		err := d.rec.reconcile(ctx)
		if first {
			trimStartupPages(d.log)
		}
		if err != nil {
			d.log.Error("reconcile failed; retrying with backoff", "error", err, "retries", d.queue.NumRequeues(key))
			d.queue.AddRateLimited(key)
		} else {
			d.queue.Forget(key)
		}
		d.queue.Done(key)
	}
}

// tick enqueues a full reconcile every resync period and when a liveness
// decision changes by the clock alone (a Lease expiring, a recovered node
// done settling), at that moment.
func (d *daemon) tick(ctx context.Context) {
	resync := time.NewTicker(d.cfg.ResyncPeriod)
	defer resync.Stop()
	expiry := time.NewTimer(time.Second)
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resync.C:
			d.enqueue()
		case <-expiry.C:
			if d.livenessChanged() {
				d.enqueue()
			}
			expiry.Reset(d.nextLivenessCheck())
		}
	}
}

func (d *daemon) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhandler(d.reg))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if age := d.rec.sinceLastAttempt(); age > 3*d.cfg.ResyncPeriod+time.Minute {
			http.Error(w, fmt.Sprintf("no reconcile attempt for %s", age.Round(time.Second)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, msg := d.readiness()
		if !ok {
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, msg)
	})
	d.debugHandlers(mux)
	return mux
}

// readiness says whether the node is programmed from fresh data: every local
// cache synced and the last reconcile applied and published without error.
// A node running on its persisted state (restarted during an API outage), or
// whose last reconcile failed, is not ready; the message says why.
func (d *daemon) readiness() (bool, string) {
	if !d.synced() {
		if t := d.rec.restoredAt.Load(); t != nil {
			return false, fmt.Sprintf("programmed from the state persisted at %s; waiting for the API caches to sync", t.Format(time.RFC3339))
		}
		return false, "waiting for the API caches to sync"
	}
	if !d.rec.ready.Load() {
		return false, "the last reconcile failed or has not run yet (see the log and meshd_reconcile_errors_total)"
	}
	return true, "ok: programmed from synced caches"
}

// Close releases the device; with cleanup it removes everything meshd owns.
func (d *daemon) Close(cleanupAll bool) error {
	var errs []error
	if cleanupAll {
		errs = append(errs, d.rec.cleanup())
		errs = append(errs, d.device.Delete())
	}
	errs = append(errs, d.device.Close())
	d.stopEvents()
	return errors.Join(errs...)
}
