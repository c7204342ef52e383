package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// Options tune the Controller. Zero values take the defaults.
type Options struct {
	// NameSuffix names mirrors <name>-<cluster> instead of <name>.
	NameSuffix bool
	// SkipMissingNamespaces skips (instead of creating) a mirror whose
	// namespace does not exist locally.
	SkipMissingNamespaces bool
	// GracePeriod is how long a remote cluster may be unreachable before
	// its mirrors' endpoints are marked not ready (default 60s).
	GracePeriod time.Duration
	// ProbeInterval is how often remote clusters are probed (default a
	// third of the grace period, at most 10s).
	ProbeInterval time.Duration
	// Resync is the informers' resync period (default 10m; negative: none).
	Resync time.Duration
	// Workers is the number of reconcile workers (default 2).
	Workers int
	// Now is the clock (tests); default time.Now.
	Now func() time.Time

	// ClusterID is this cluster's ID in the clusterset (EnsureClusterID).
	// With LocalDynamic set it turns on the Multi-Cluster Services objects:
	// ServiceImports, their derived Services and EndpointSlices, and the
	// status of this cluster's ServiceExports.
	ClusterID string
	// LocalDynamic writes the ServiceImports and ServiceExport status.
	LocalDynamic dynamic.Interface
	// NoMirrors turns the Linkerd-style mirror Services off (MCS only);
	// existing mirrors are deleted once their cluster has synced.
	NoMirrors bool
	// StaticRemotes: every remote is added before Run (no link watching),
	// so MCS objects of any other cluster may be deleted once all synced.
	StaticRemotes bool
	// Health, when set, tells whether the data plane reaches a source
	// cluster; its endpoints turn not ready while it does not.
	Health ClusterHealth
	// LeaseNamespace is where source clusters keep their meshd heartbeat
	// Leases; with it, an imported endpoint on a node whose Lease expired
	// (the source cluster's own liveness data) is not ready. Empty: off.
	LeaseNamespace string
	// EventNamespace is the Namespace that gets the Event saying the MCS
	// CRDs are missing (the mirror's own namespace).
	EventNamespace string
}

func (o Options) withDefaults() Options {
	if o.GracePeriod <= 0 {
		o.GracePeriod = 60 * time.Second
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = min(o.GracePeriod/3, 10*time.Second)
	}
	switch {
	case o.Resync == 0:
		o.Resync = 10 * time.Minute
	case o.Resync < 0:
		o.Resync = 0
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

const (
	indexCluster = "cluster" // local mirrors by source cluster
	// EventReasonClash is the reason of the Event on a local Service that
	// has the name of a mirror but is not meshd's mirror of that source.
	EventReasonClash = "MirrorNameClash"
)

// leanCache keeps the mirror's informer caches (Services, EndpointSlices,
// Namespaces, Leases, local and remote) without managedFields, often the
// largest part of such an object, which the mirror never reads. Updates
// sent from a cached object keep the server's managedFields: an update
// without them leaves them as they are.
var leanCache = informers.WithTransform(convert.DropManagedFields)

// Controller mirrors the exported Services of remote clusters into the
// local cluster.
type Controller struct {
	log      *slog.Logger
	local    kubernetes.Interface
	recorder record.EventRecorder
	metrics  *Metrics
	opts     Options
	now      func() time.Time
	queue    workqueue.TypedRateLimitingInterface[Key]

	factory, sliceFactory informers.SharedInformerFactory
	services, slices, nss cache.SharedIndexInformer
	localSynced           chan struct{}
	// allKnown: every remote cluster is known (WatchLinks synced), so
	// mirrors of other clusters are orphans to delete.
	allKnown atomic.Bool

	mu      sync.Mutex
	ctx     context.Context // set by Run
	remotes map[string]*remote
	// tunnel is the default Options.Health (tunnel.go), nil when Health
	// was given or there are no local Leases to read.
	tunnel    *leaseHealth
	removed   map[string]bool             // clusters removed by RemoveRemote
	pending   map[Key]time.Time           // first unsynced remote change
	blocked   map[string]map[Key]struct{} // "ns/name" (clash) or "ns:" (namespace) → keys waiting
	blockedBy map[Key]string
	clashes   map[Key]types.UID // reported clashes
	mirrored  map[string]map[Key]bool

	mcs *mcsController // nil: no MCS objects
}

// New returns a Controller writing mirrors with local. recorder gets the
// clash Events (connect.NewEventRecorder); metrics may be nil.
func New(log *slog.Logger, local kubernetes.Interface, recorder record.EventRecorder, metrics *Metrics, opts Options) *Controller {
	opts = opts.withDefaults()
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	c := &Controller{
		log: log, local: local, recorder: recorder, metrics: metrics, opts: opts, now: opts.Now,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[Key](),
			workqueue.TypedRateLimitingQueueConfig[Key]{Name: "mirror"}),
		localSynced: make(chan struct{}),
		remotes:     map[string]*remote{},
		removed:     map[string]bool{},
		pending:     map[Key]time.Time{},
		blocked:     map[string]map[Key]struct{}{},
		blockedBy:   map[Key]string{},
		clashes:     map[Key]types.UID{},
		mirrored:    map[string]map[Key]bool{},
	}
	if opts.ClusterID != "" && opts.LocalDynamic != nil {
		c.mcs = newMCS(c)
	}
	if c.opts.Health == nil && c.opts.LeaseNamespace != "" {
		c.tunnel = newLeaseHealth(c.now)
		c.opts.Health = c.tunnel
	}
	c.factory = informers.NewSharedInformerFactoryWithOptions(local, opts.Resync, leanCache)
	c.sliceFactory = informers.NewSharedInformerFactoryWithOptions(local, opts.Resync, leanCache,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelManagedBy + "=" + ManagedByMirror
		}))
	c.services = c.factory.Core().V1().Services().Informer()
	c.nss = c.factory.Core().V1().Namespaces().Informer()
	c.slices = c.sliceFactory.Discovery().V1().EndpointSlices().Informer()
	_ = c.services.AddIndexers(cache.Indexers{indexCluster: func(o any) ([]string, error) {
		if s, ok := o.(*corev1.Service); ok {
			if k, ok := ownerKey(s); ok {
				return []string{k.Cluster}, nil
			}
		}
		return nil, nil
	}})
	_ = c.slices.AddIndexers(cache.Indexers{indexService: sliceServiceIndex, indexImport: importIndex})
	owned := func(o any) {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		if m, ok := o.(metav1.Object); ok {
			if k, ok := ownerKey(m); ok {
				c.queue.Add(k)
			}
		}
	}
	owned2 := func(o any) {
		owned(o)
		c.mcs.enqueueOwned(o)
	}
	_, _ = c.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: owned2, UpdateFunc: func(_, o any) { owned2(o) },
		DeleteFunc: func(o any) {
			owned2(o)
			ns, name := namespaceName(o)
			c.enqueueBlocked(ns + "/" + name)
		},
	})
	_, _ = c.slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: owned2, UpdateFunc: func(_, o any) { owned2(o) }, DeleteFunc: owned2,
	})
	_, _ = c.nss.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			_, name := namespaceName(o)
			c.enqueueBlocked(name + ":")
			c.mcs.enqueueAll(name)
		},
	})
	return c
}

// AddRemote starts mirroring the exports of r (replacing a remote of the
// same name). It may be called before or after Run.
func (c *Controller) AddRemote(r Remote) error {
	if errs := validation.IsDNS1123Label(r.Name); len(errs) > 0 {
		return fmt.Errorf("adding remote cluster %q: the name is not a DNS label: %s", r.Name, strings.Join(errs, "; "))
	}
	if r.Kube == nil || r.Dynamic == nil {
		return fmt.Errorf("adding remote cluster %s: missing clients", r.Name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.remotes[r.Name]; old != nil && old.started {
		old.cancel()
	}
	rr := &remote{Remote: r}
	c.remotes[r.Name] = rr
	delete(c.removed, r.Name)
	if c.ctx != nil {
		c.startRemote(c.ctx, rr)
	}
	return nil
}

// RemoveRemote stops mirroring cluster name and deletes its mirrors.
func (c *Controller) RemoveRemote(name string) {
	c.mu.Lock()
	if r := c.remotes[name]; r != nil && r.started {
		r.cancel()
	}
	delete(c.remotes, name)
	c.removed[name] = true
	c.mu.Unlock()
	c.metrics.forget(name)
	c.enqueueCluster(name)
	c.mcs.enqueueAll("") // its imported slices go
}

// Run starts the informers and workers and mirrors until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.factory.Start(ctx.Done())
	c.sliceFactory.Start(ctx.Done())
	defer c.factory.Shutdown()
	defer c.sliceFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.services.HasSynced, c.slices.HasSynced, c.nss.HasSynced) {
		return fmt.Errorf("waiting for the local Service, EndpointSlice and Namespace caches: %w", ctx.Err())
	}
	c.mu.Lock()
	c.ctx = ctx
	for _, r := range c.remotes {
		if !r.started {
			c.startRemote(ctx, r)
		}
	}
	c.mu.Unlock()
	close(c.localSynced)
	c.log.Info("mirroring", "workers", c.opts.Workers, "grace", c.opts.GracePeriod, "suffix", c.opts.NameSuffix, "mirrors", !c.opts.NoMirrors, "mcs", c.mcs != nil)
	var wg sync.WaitGroup
	if c.tunnel != nil {
		synced := make(chan struct{})
		wg.Go(func() { c.runTunnelHealth(ctx, c.tunnel, synced) })
		select {
		case <-synced:
		case <-time.After(tunnelSyncWait):
			c.log.Warn("the local heartbeat Leases did not sync; tunnel health unknown until they do", "namespace", c.opts.LeaseNamespace)
		case <-ctx.Done():
		}
	}
	if c.mcs != nil {
		wg.Go(func() { c.mcs.run(ctx) })
	}
	for range c.opts.Workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	if err := c.syncKey(ctx, k); err != nil {
		c.metrics.errors.WithLabelValues(k.Cluster).Inc()
		c.log.Warn("mirror sync failed; retrying", "export", k.String(), "retries", c.queue.NumRequeues(k), "error", err)
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

// remoteChanged records when a remote change was first observed and queues
// its key.
func (c *Controller) remoteChanged(k Key) {
	c.mu.Lock()
	if _, ok := c.pending[k]; !ok {
		c.pending[k] = c.now()
	}
	c.mu.Unlock()
	c.queue.Add(k)
}

// enqueueCluster queues every export and every local mirror of cluster.
func (c *Controller) enqueueCluster(cluster string) {
	c.mu.Lock()
	r := c.remotes[cluster]
	c.mu.Unlock()
	if r != nil && r.exports != nil {
		for _, key := range r.exports.GetStore().ListKeys() {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			c.queue.Add(Key{Cluster: cluster, Namespace: ns, Name: name})
		}
	}
	objs, _ := c.services.GetIndexer().ByIndex(indexCluster, cluster)
	for _, o := range objs {
		if k, ok := ownerKey(o.(*corev1.Service)); ok {
			c.queue.Add(k)
		}
	}
}

func (c *Controller) enqueueAllLocal() {
	for _, o := range c.services.GetStore().List() {
		if k, ok := ownerKey(o.(*corev1.Service)); ok {
			c.queue.Add(k)
		}
	}
}

func (c *Controller) enqueueBlocked(index string) {
	c.mu.Lock()
	keys := make([]Key, 0, len(c.blocked[index]))
	for k := range c.blocked[index] {
		keys = append(keys, k)
	}
	c.mu.Unlock()
	for _, k := range keys {
		c.queue.Add(k)
	}
}

// block records that k waits for index (a local Service or namespace).
func (c *Controller) block(k Key, index string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unblockLocked(k)
	if c.blocked[index] == nil {
		c.blocked[index] = map[Key]struct{}{}
	}
	c.blocked[index][k] = struct{}{}
	c.blockedBy[k] = index
}

func (c *Controller) unblockLocked(k Key) {
	if old, ok := c.blockedBy[k]; ok {
		delete(c.blocked[old], k)
		if len(c.blocked[old]) == 0 {
			delete(c.blocked, old)
		}
		delete(c.blockedBy, k)
	}
}

// result is what one sync did.
type result struct {
	wrote    bool // changed a local object
	mirrored bool // a mirror of the key exists
	clash    bool
	merged   bool // endpoints added to another cluster's same-name mirror
}

func (c *Controller) syncKey(ctx context.Context, k Key) error {
	c.mu.Lock()
	seen, hadPending := c.pending[k]
	delete(c.pending, k)
	c.mu.Unlock()
	res, err := c.reconcile(ctx, k)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if _, ok := c.pending[k]; hadPending && !ok {
			c.pending[k] = seen
		}
		return err
	}
	if !res.clash {
		delete(c.clashes, k)
	}
	if res.mirrored && !res.merged {
		c.unblockLocked(k)
	}
	m := c.mirrored[k.Cluster]
	if m == nil {
		m = map[Key]bool{}
		c.mirrored[k.Cluster] = m
	}
	if res.mirrored {
		m[k] = true
	} else {
		delete(m, k)
	}
	if c.removed[k.Cluster] {
		if len(m) == 0 {
			delete(c.mirrored, k.Cluster)
		}
		c.metrics.forget(k.Cluster)
	} else {
		c.metrics.services.WithLabelValues(k.Cluster).Set(float64(len(m)))
		n := 0
		for ck := range c.clashes {
			if ck.Cluster == k.Cluster {
				n++
			}
		}
		c.metrics.clashes.WithLabelValues(k.Cluster).Set(float64(n))
	}
	if res.wrote && hadPending {
		c.metrics.propagation.Observe(c.now().Sub(seen).Seconds())
	}
	return nil
}

// reconcile brings the local mirror of k to the desired state.
func (c *Controller) reconcile(ctx context.Context, k Key) (result, error) {
	name := MirrorName(k, c.opts.NameSuffix)
	c.mu.Lock()
	r, removed := c.remotes[k.Cluster], c.removed[k.Cluster]
	c.mu.Unlock()
	if r == nil {
		if removed || c.allKnown.Load() {
			return c.deleteMirror(ctx, k, name)
		}
		// A cluster this process does not manage (another mirror's).
		return result{}, nil
	}
	if r.isExpired() {
		return c.markNotReady(ctx, k, name)
	}
	if !r.synced.Load() {
		// Never act on a partial view; the key is queued again once synced.
		return result{mirrored: c.ownedService(k, name) != nil}, nil
	}
	src := r.service(k.Namespace, k.Name)
	if c.opts.NoMirrors || src == nil || !r.exported(k.Namespace, k.Name) {
		return c.deleteMirror(ctx, k, name)
	}
	if src.Spec.Type == corev1.ServiceTypeExternalName {
		c.log.Debug("not mirroring an ExternalName Service", "export", k.String())
		return c.deleteMirror(ctx, k, name)
	}
	if err := validMirrorName(name); err != nil {
		// Permanent until the Service or the naming changes: not retried.
		c.log.Warn("cannot mirror", "export", k.String(), "error", err)
		return result{}, nil
	}
	existing := c.localService(k.Namespace, name)
	if existing != nil && !ownedBy(existing, k) && c.mergeable(existing, k) {
		// The same Service exported by several clusters (the HA case): one
		// mirror Service, this cluster's endpoints added to it. When its
		// owner goes, the key is queued again and takes the Service over.
		c.block(k, existing.Namespace+"/"+existing.Name)
		w, err := c.applySlices(ctx, k, name, existing, c.mirrorSlices(k, name, src, r))
		return result{wrote: w, mirrored: true, merged: true}, err
	}
	if existing != nil && !ownedBy(existing, k) {
		c.reportClash(k, existing)
		return result{clash: true}, nil
	}
	if existing == nil {
		ok, err := c.ensureNamespace(ctx, k)
		if err != nil || !ok {
			return result{}, err
		}
	}
	svc, wrote, err := c.applyService(ctx, k, existing, desiredService(k, name, src))
	var clash *clashError
	if errors.As(err, &clash) {
		c.reportClash(k, clash.svc)
		return result{clash: true}, nil
	}
	if err != nil {
		return result{wrote: wrote}, err
	}
	w2, err := c.applySlices(ctx, k, name, svc, c.mirrorSlices(k, name, src, r))
	return result{wrote: wrote || w2, mirrored: true}, err
}

// mirrorSlices are the desired EndpointSlices of the mirror of src (from
// r): while the data plane says r's tunnel is down, every endpoint is not
// ready and not serving (the slices stay, so nothing is deleted and the
// tunnel coming back restores them), as for MCS imports.
func (c *Controller) mirrorSlices(k Key, name string, src *corev1.Service, r *remote) []*discoveryv1.EndpointSlice {
	out := desiredSlices(k, name, src, r.endpointSlices(k.Namespace, k.Name))
	if c.tunnelDown(r) {
		for _, sl := range out {
			for i := range sl.Endpoints {
				sl.Endpoints[i].Conditions.Ready, sl.Endpoints[i].Conditions.Serving = ptr(false), ptr(false)
			}
		}
	}
	return out
}

// tunnelDown: the data plane (Options.Health) says the tunnel to r's
// cluster, by its cluster ID or its link name, is down.
func (c *Controller) tunnelDown(r *remote) bool {
	h := c.opts.Health
	if h == nil {
		return false
	}
	if up, known := h.Reachable(r.clusterID); known && !up {
		return true
	}
	if r.clusterID != r.Name {
		if up, known := h.Reachable(r.Name); known && !up {
			return true
		}
	}
	return false
}

// mergeable: existing is meshd's same-name mirror of the Service k names,
// from another cluster.
func (c *Controller) mergeable(existing *corev1.Service, k Key) bool {
	o, ok := ownerKey(existing)
	return ok && !c.opts.NameSuffix && o.Namespace == k.Namespace && o.Name == k.Name && o.Cluster != k.Cluster
}

func (c *Controller) localService(ns, name string) *corev1.Service {
	o, ok, _ := c.services.GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil
	}
	s, _ := o.(*corev1.Service)
	return s
}

func (c *Controller) ownedService(k Key, name string) *corev1.Service {
	if s := c.localService(k.Namespace, name); s != nil && ownedBy(s, k) {
		return s
	}
	return nil
}

// ownedSlices are the local EndpointSlices of mirror name that meshd made
// for k.
func (c *Controller) ownedSlices(k Key, name string) []*discoveryv1.EndpointSlice {
	objs, _ := c.slices.GetIndexer().ByIndex(indexService, k.Namespace+"/"+name)
	var out []*discoveryv1.EndpointSlice
	for _, o := range objs {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok && ownedBy(sl, k) && sl.Labels[discoveryv1.LabelManagedBy] == ManagedByMirror {
			out = append(out, sl)
		}
	}
	return out
}

type clashError struct{ svc *corev1.Service }

func (e *clashError) Error() string {
	return fmt.Sprintf("Service %s/%s exists and is not this mirror", e.svc.Namespace, e.svc.Name)
}

// reportClash reports (once per clashing object) that k cannot be mirrored
// because a local Service meshd does not own for k has the mirror's name.
func (c *Controller) reportClash(k Key, existing *corev1.Service) {
	c.block(k, existing.Namespace+"/"+existing.Name)
	c.mu.Lock()
	uid, known := c.clashes[k]
	reported := known && uid == existing.UID
	c.clashes[k] = existing.UID
	c.mu.Unlock()
	if reported {
		return
	}
	owner := "not created by meshd"
	if ok, isMirror := ownerKey(existing); isMirror {
		owner = "meshd's mirror of " + ok.source() + " from cluster " + ok.Cluster
	}
	c.log.Warn("not mirroring: a local Service has the mirror's name", "export", k.String(),
		"service", existing.Namespace+"/"+existing.Name, "owner", owner)
	if c.recorder != nil {
		c.recorder.Eventf(existing, corev1.EventTypeWarning, EventReasonClash,
			"Not mirroring Service %s from cluster %s: this Service has the mirror's name and is %s; it is left untouched",
			k.source(), k.Cluster, owner)
	}
}

func (c *Controller) ensureNamespace(ctx context.Context, k Key) (bool, error) {
	if _, ok, _ := c.nss.GetIndexer().GetByKey(k.Namespace); ok {
		return true, nil
	}
	if c.opts.SkipMissingNamespaces {
		c.mu.Lock()
		_, known := c.blockedBy[k]
		c.mu.Unlock()
		if !known {
			c.log.Info("not mirroring: namespace missing locally (namespaces are not created)", "export", k.String(), "namespace", k.Namespace)
		}
		c.block(k, k.Namespace+":")
		return false, nil
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.Namespace, Labels: map[string]string{liveness.LabelManagedBy: liveness.ManagedBy}}}
	if _, err := c.local.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return false, fmt.Errorf("creating namespace %s for the mirror of %s: %w", k.Namespace, k, err)
	}
	c.log.Info("created namespace for a mirror", "namespace", k.Namespace, "export", k.String())
	return true, nil
}

// applyService creates or updates the mirror Service; a headless change
// recreates it (the cluster IP is immutable).
func (c *Controller) applyService(ctx context.Context, k Key, existing, want *corev1.Service) (*corev1.Service, bool, error) {
	api := c.local.CoreV1().Services(want.Namespace)
	if existing == nil {
		created, err := api.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			c.log.Info("created mirror", "export", k.String(), "mirror", want.Namespace+"/"+want.Name)
			return created, true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, false, fmt.Errorf("creating mirror Service %s/%s of %s: %w", want.Namespace, want.Name, k, err)
		}
		// The cache was behind.
		if existing, err = api.Get(ctx, want.Name, metav1.GetOptions{}); err != nil {
			return nil, false, fmt.Errorf("reading Service %s/%s: %w", want.Namespace, want.Name, err)
		}
		if !ownedBy(existing, k) {
			return nil, false, &clashError{svc: existing}
		}
	}
	if isHeadless(existing) != isHeadless(want) {
		uid := existing.UID
		err := api.Delete(ctx, existing.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, false, fmt.Errorf("deleting mirror Service %s/%s to change its cluster IP: %w", existing.Namespace, existing.Name, err)
		}
		created, err := api.Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return nil, true, fmt.Errorf("recreating mirror Service %s/%s of %s: %w", want.Namespace, want.Name, k, err)
		}
		c.log.Info("recreated mirror (headless changed)", "export", k.String(), "headless", isHeadless(want))
		return created, true, nil
	}
	if serviceUpToDate(existing, want) {
		return existing, false, nil
	}
	updated, err := api.Update(ctx, updateService(existing, want), metav1.UpdateOptions{})
	if err != nil {
		return nil, false, fmt.Errorf("updating mirror Service %s/%s of %s: %w", want.Namespace, want.Name, k, err)
	}
	c.log.Debug("updated mirror Service", "export", k.String())
	return updated, true, nil
}

// applySlices makes the mirror's EndpointSlices equal to want.
func (c *Controller) applySlices(ctx context.Context, k Key, name string, svc *corev1.Service, want []*discoveryv1.EndpointSlice) (bool, error) {
	api := c.local.DiscoveryV1().EndpointSlices(k.Namespace)
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID, Controller: ptr(true)}
	have := map[string]*discoveryv1.EndpointSlice{}
	for _, sl := range c.ownedSlices(k, name) {
		have[sl.Name] = sl
	}
	wrote := false
	var errs []error
	for _, w := range want {
		w.OwnerReferences = []metav1.OwnerReference{owner}
		h := have[w.Name]
		delete(have, w.Name)
		if h == nil {
			_, err := api.Create(ctx, w, metav1.CreateOptions{})
			if err == nil {
				wrote = true
				continue
			}
			if !apierrors.IsAlreadyExists(err) {
				errs = append(errs, fmt.Errorf("creating EndpointSlice %s/%s: %w", w.Namespace, w.Name, err))
				continue
			}
			if h, err = c.getOwnedSlice(ctx, k, w.Namespace, w.Name); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if h.AddressType != w.AddressType {
			if err := c.deleteSlice(ctx, h); err != nil {
				errs = append(errs, err)
				continue
			}
			if _, err := api.Create(ctx, w, metav1.CreateOptions{}); err != nil {
				errs = append(errs, fmt.Errorf("recreating EndpointSlice %s/%s: %w", w.Namespace, w.Name, err))
			}
			wrote = true
			continue
		}
		if sliceUpToDate(h, w) && len(h.OwnerReferences) == 1 && h.OwnerReferences[0].UID == svc.UID {
			continue
		}
		if err := c.updateSlice(ctx, k, h, w); err != nil {
			errs = append(errs, err)
			continue
		}
		wrote = true
	}
	for _, h := range have {
		if err := c.deleteSlice(ctx, h); err != nil {
			errs = append(errs, err)
			continue
		}
		wrote = true
	}
	if err := errors.Join(errs...); err != nil {
		return wrote, fmt.Errorf("syncing the EndpointSlices of mirror %s/%s of %s: %w", k.Namespace, name, k, err)
	}
	return wrote, nil
}

// updateSlice makes the existing slice h carry w's ports, endpoints and
// meshd's metadata. The informer cache may lag meshd's own previous write
// (back-to-back remote changes); on a conflict the slice is read again and
// the update retried, instead of waiting for a backoff.
func (c *Controller) updateSlice(ctx context.Context, k Key, h, w *discoveryv1.EndpointSlice) error {
	api := c.local.DiscoveryV1().EndpointSlices(h.Namespace)
	for attempt := 0; ; attempt++ {
		u := h.DeepCopy()
		mergeMeta(&u.ObjectMeta, &w.ObjectMeta)
		u.OwnerReferences = w.OwnerReferences
		u.Ports, u.Endpoints = w.Ports, w.Endpoints
		_, err := api.Update(ctx, u, metav1.UpdateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == 2 {
			return fmt.Errorf("updating EndpointSlice %s/%s: %w", u.Namespace, u.Name, err)
		}
		if h, err = c.getOwnedSlice(ctx, k, w.Namespace, w.Name); err != nil {
			return err
		}
		if h.AddressType != w.AddressType {
			return fmt.Errorf("EndpointSlice %s/%s changed its address type under meshd; retrying", w.Namespace, w.Name)
		}
	}
}

// getOwnedSlice reads a slice from the API server (the cache was behind:
// a create found it, or an update conflicted) and checks it is k's mirror's.
func (c *Controller) getOwnedSlice(ctx context.Context, k Key, namespace, name string) (*discoveryv1.EndpointSlice, error) {
	sl, err := c.local.DiscoveryV1().EndpointSlices(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading EndpointSlice %s/%s: %w", namespace, name, err)
	}
	if !ownedBy(sl, k) {
		return nil, fmt.Errorf("EndpointSlice %s/%s exists and is not meshd's: left untouched", namespace, name)
	}
	return sl, nil
}

func (c *Controller) deleteSlice(ctx context.Context, sl *discoveryv1.EndpointSlice) error {
	uid := sl.UID
	err := c.local.DiscoveryV1().EndpointSlices(sl.Namespace).Delete(ctx, sl.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting EndpointSlice %s/%s: %w", sl.Namespace, sl.Name, err)
	}
	return nil
}

// deleteMirror deletes the mirror of k and its EndpointSlices, if meshd
// owns them; anything else is left alone.
func (c *Controller) deleteMirror(ctx context.Context, k Key, name string) (result, error) {
	c.mu.Lock()
	c.unblockLocked(k)
	c.mu.Unlock()
	wrote := false
	var errs []error
	for _, sl := range c.ownedSlices(k, name) {
		if err := c.deleteSlice(ctx, sl); err != nil {
			errs = append(errs, err)
		}
		wrote = true
	}
	if s := c.ownedService(k, name); s != nil {
		uid := s.UID
		err := c.local.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting mirror Service %s/%s: %w", s.Namespace, s.Name, err))
		} else {
			c.log.Info("deleted mirror", "export", k.String(), "mirror", s.Namespace+"/"+s.Name)
		}
		wrote = true
	}
	if err := errors.Join(errs...); err != nil {
		return result{wrote: wrote, mirrored: true}, fmt.Errorf("deleting the mirror of %s: %w", k, err)
	}
	return result{wrote: wrote}, nil
}

// markNotReady sets every endpoint of k's mirror not ready (its cluster is
// unreachable past the grace period); nothing is deleted.
// Its endpoints merged into another cluster's same-name mirror (the HA
// case) are marked too: that Service is not k's, its slices are.
func (c *Controller) markNotReady(ctx context.Context, k Key, name string) (result, error) {
	owned := c.ownedService(k, name) != nil
	sls := c.ownedSlices(k, name)
	if !owned && len(sls) == 0 {
		return result{}, nil
	}
	// merged: syncKey keeps k blocked on the other cluster's Service.
	res := result{mirrored: true, merged: !owned}
	for _, sl := range sls {
		wrote, err := c.setSliceNotReady(ctx, sl)
		if err != nil {
			return res, fmt.Errorf("%w (cluster %s unreachable)", err, k.Cluster)
		}
		res.wrote = res.wrote || wrote
	}
	return res, nil
}

// sliceReady reports whether an endpoint of sl is (or may be) ready or
// serving.
func sliceReady(sl *discoveryv1.EndpointSlice) bool {
	for _, e := range sl.Endpoints {
		cd := e.Conditions
		if cd.Ready == nil || *cd.Ready || cd.Serving == nil || *cd.Serving {
			return true
		}
	}
	return false
}

// setSliceNotReady sets every endpoint of the local slice sl not ready and
// not serving (nothing else changes); a slice already so is left alone. It
// reports whether it wrote.
func (c *Controller) setSliceNotReady(ctx context.Context, sl *discoveryv1.EndpointSlice) (bool, error) {
	if !sliceReady(sl) {
		return false, nil
	}
	u := sl.DeepCopy()
	for i := range u.Endpoints {
		u.Endpoints[i].Conditions.Ready, u.Endpoints[i].Conditions.Serving = ptr(false), ptr(false)
	}
	if _, err := c.local.DiscoveryV1().EndpointSlices(u.Namespace).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("marking EndpointSlice %s/%s not ready: %w", u.Namespace, u.Name, err)
	}
	return true, nil
}
