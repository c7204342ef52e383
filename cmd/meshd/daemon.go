package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"meshd.io/meshd/pkg/iptables"
	"meshd.io/meshd/pkg/k8s"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/route"
	"meshd.io/meshd/pkg/wg"
)

// queueKey is the only work item: every event asks for one full reconcile,
// so a burst of events coalesces into one (see coalescer).
const queueKey = "mesh"

// daemon wires the informers, the reconciler and the HTTP endpoints.
type daemon struct {
	cfg  *config
	log  *slog.Logger
	rec  *reconciler
	reg  *prometheus.Registry
	kube *k8s.Clients

	nodes, peers, leases cache.SharedIndexInformer
	queue                workqueue.TypedRateLimitingInterface[string]
	coalesce             *coalescer
	routes               *route.Manager
	device               *device
	links                *k8s.LinkWatcher
	filter               nodeFilter
}

func newDaemon(c *config, opts mesh.Options, log *slog.Logger) (*daemon, error) {
	clients, err := k8s.NewClients(c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	key, err := wg.LoadOrCreateKey(c.StateDir)
	if err != nil {
		return nil, fmt.Errorf("loading the WireGuard key from %s: %w", c.StateDir, err)
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
	dev, err := openDevice(context.Background(), log, wg.Options{Name: c.Interface, Mode: wg.Mode(c.WireGuard), MTU: mtu, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("opening WireGuard interface %s: %w", c.Interface, err)
	}
	routes, err := route.New(route.Options{Protocol: mesh.DefaultRouteProto, Table: opts.RouteTable, Logger: log})
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	ipt4, err4 := iptables.New(iptables.Options{Family: iptables.IPv4, Backend: c.IPTablesMode, Logger: log})
	ipt6, err6 := iptables.New(iptables.Options{Family: iptables.IPv6, Backend: c.IPTablesMode, Logger: log})
	if err4 != nil {
		dev.Close()
		return nil, fmt.Errorf("setting up iptables: %w", err4)
	}
	if err6 != nil {
		log.Warn("IPv6 iptables unavailable; IPv6 rules are skipped", "error", err6)
		ipt6 = nil
	}
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, dev)
	registerClientMetrics(m)
	writes := executorWrites{"wireguard": dev.Writes, "routes": routes.Writes, "iptables": ipt4.Restores}
	if ipt6 != nil {
		writes["iptables"] = func() uint64 { return ipt4.Restores() + ipt6.Restores() }
	}
	reg.MustRegister(writes)
	events, stopEvents := k8s.NewEventRecorder(clients.Kube, "meshd")
	_ = stopEvents // stopped with the process
	r := &reconciler{
		log:      log,
		opts:     opts,
		node:     c.Hostname,
		port:     c.Port,
		topology: c.TopologyLabel,
		key:      key,
		mtu:      mtu,
		facts:    facts,
		kube:     clients.Kube,
		events:   events,
		liveness: k8s.NewLiveness(c.LeaseDuration, time.Now),
		device:   dev,
		routes:   routes,
		ipt4:     ipt4,
		metrics:  m,
	}
	if ipt6 != nil {
		r.ipt6 = ipt6
	}
	d := &daemon{
		cfg: c, log: log, rec: r, reg: reg, kube: clients,
		routes: routes, device: dev,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "meshd"}),
	}
	d.coalesce = newCoalescer(clock.RealClock{}, coalesceDelay, coalesceInterval, coalesceBurst, func() { d.queue.Add(queueKey) })
	d.filter = nodeFilter{self: c.Hostname, parse: k8s.ParseOptions{TopologyLabel: c.TopologyLabel, Port: c.Port}}
	// Lean caches (cache.go): only what meshd reads is kept.
	factory := informers.NewSharedInformerFactoryWithOptions(clients.Kube, c.ResyncPeriod, informers.WithTransform(leanNode))
	d.nodes = factory.Core().V1().Nodes().Informer()
	leaseFactory := informers.NewSharedInformerFactoryWithOptions(clients.Kube, c.ResyncPeriod, informers.WithNamespace(c.LeaseNamespace), informers.WithTransform(dropManagedFields))
	d.leases = leaseFactory.Coordination().V1().Leases().Informer()
	d.peers = k8s.NewPeerInformer(clients, c.ResyncPeriod)
	if err := setTransform(d.peers, dropManagedFields); err != nil {
		return nil, err
	}
	r.nodeLister = d.nodes.GetStore()
	r.peerLister = d.peers.GetStore()
	if c.ClusterLinks {
		d.links = k8s.NewLinkWatcher(log, clients.Kube, c.LeaseNamespace, c.ResyncPeriod, d.enqueue)
		r.links = d.links
	}
	return d, nil
}

// enqueue asks for a reconcile soon; repeated calls coalesce.
func (d *daemon) enqueue() { d.coalesce.signal() }

// handler enqueues a reconcile on every Peer event but informer resyncs
// (the same object again: the resync ticker covers them).
func (d *daemon) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { d.enqueue() },
		UpdateFunc: func(old, cur any) {
			if sameVersion(old, cur) {
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
				if n, ok := cur.(*corev1.Node); ok && !d.filter.changed(o, n) {
					d.rec.metrics.filtered.Inc()
					return // kubelet heartbeats, our own writes, resyncs: nothing to plan
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

func (d *daemon) leaseHandler() cache.ResourceEventHandler {
	observe := func(obj any) {
		if l, ok := obj.(*coordinationv1.Lease); ok {
			if _, mine := k8s.NodeNameFromLease(l); mine && d.rec.liveness.Observe(l) {
				d.enqueue()
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, cur any) { observe(cur) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if l, ok := obj.(*coordinationv1.Lease); ok {
				if node, mine := k8s.NodeNameFromLease(l); mine {
					d.rec.liveness.Forget(node)
					d.enqueue()
				}
			}
		},
	}
}

// Run runs until ctx ends. Kernel state is left in place on return.
func (d *daemon) Run(ctx context.Context) error {
	for _, inf := range []struct {
		i cache.SharedIndexInformer
		h cache.ResourceEventHandler
	}{{d.nodes, d.nodeHandler()}, {d.peers, d.handler()}, {d.leases, d.leaseHandler()}} {
		if _, err := inf.i.AddEventHandler(inf.h); err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
	}
	var g run.Group
	{ // informers
		ictx, cancel := context.WithCancel(ctx)
		g.Add(func() error {
			go d.nodes.RunWithContext(ictx)
			go d.peers.RunWithContext(ictx)
			go d.leases.RunWithContext(ictx)
			<-ictx.Done()
			return nil
		}, func(error) { cancel() })
	}
	{ // the reconcile worker
		wctx, cancel := context.WithCancel(ctx)
		g.Add(func() error { return d.work(wctx) }, func(error) { cancel(); d.coalesce.stop(); d.queue.ShutDown() })
	}
	{ // periodic resync and liveness expiry
		tctx, cancel := context.WithCancel(ctx)
		g.Add(func() error { d.tick(tctx); return nil }, func(error) { cancel() })
	}
	{ // route repair: netlink watch
		rctx, cancel := context.WithCancel(ctx)
		g.Add(func() error {
			return d.routes.Run(rctx, func() { d.rec.metrics.repairs.WithLabelValues("routes").Inc(); d.enqueue() })
		}, func(error) { cancel() })
	}
	{ // the WireGuard interface deleted or recreated: its routes went with it
		wctx, cancel := context.WithCancel(ctx)
		g.Add(func() error { return wg.WatchLink(wctx, d.log, d.cfg.Interface, d.enqueue) }, func(error) { cancel() })
	}
	if d.links != nil { // linked clusters
		lctx, cancel := context.WithCancel(ctx)
		g.Add(func() error { return d.links.Run(lctx) }, func(error) { cancel() })
	}
	{ // liveness heartbeat
		hctx, cancel := context.WithCancel(ctx)
		g.Add(func() error {
			return k8s.RunHeartbeat(hctx, d.kube.Kube, d.cfg.LeaseNamespace, d.cfg.Hostname, d.cfg.LeaseDuration/4, d.log)
		}, func(error) { cancel() })
	}
	{ // HTTP: metrics and probes
		srv := &http.Server{Addr: d.cfg.Listen, Handler: d.mux(), ReadHeaderTimeout: 5 * time.Second}
		g.Add(func() error {
			d.log.Info("serving metrics and probes", "listen", d.cfg.Listen)
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving %s: %w", d.cfg.Listen, err)
			}
			return nil
		}, func(error) {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			srv.Shutdown(sctx)
		})
	}
	{ // stop with ctx
		g.Add(func() error { <-ctx.Done(); return ctx.Err() }, func(error) {})
	}
	return g.Run()
}

// work is the single worker: it waits for the caches, then reconciles
// whenever asked, backing off on errors.
func (d *daemon) work(ctx context.Context) error {
	// Poll the caches every 10 ms (WaitForCacheSync's 100 ms would add up to
	// that much to every cold start).
	if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		return d.nodes.HasSynced() && d.peers.HasSynced() && d.leases.HasSynced(), nil
	}); err != nil {
		return ctx.Err()
	}
	d.log.Info("caches synced", "node", d.cfg.Hostname, "wireguard", d.device.Kind())
	d.queue.Add(queueKey)
	for {
		key, shutdown := d.queue.Get()
		if shutdown {
			return nil
		}
		err := d.rec.reconcile(ctx)
		if err != nil {
			d.log.Error("reconcile failed; retrying with backoff", "error", err, "retries", d.queue.NumRequeues(key))
			d.queue.AddRateLimited(key)
		} else {
			d.queue.Forget(key)
		}
		d.device.scheduleHandshakeRetries()
		d.queue.Done(key)
	}
}

// tick enqueues a full reconcile every resync period and when a node's
// liveness is due to expire.
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
			if d.rec.liveness.Expired() {
				d.enqueue()
			}
			expiry.Reset(time.Second)
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
		if !d.rec.ready.Load() {
			http.Error(w, "not reconciled yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// Close releases the device; with cleanup it removes everything meshd owns.
func (d *daemon) Close(cleanupAll bool) error {
	var errs []error
	if cleanupAll {
		errs = append(errs, d.rec.cleanup())
		errs = append(errs, d.device.Delete())
	}
	errs = append(errs, d.device.Close())
	return errors.Join(errs...)
}
