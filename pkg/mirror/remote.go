package mirror

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// ServiceExportGVR is the MCS API's ServiceExport resource.
// v1beta1 is the version upstream stores; v1alpha1 objects are served as
// v1beta1 too (same schema, no conversion).
var ServiceExportGVR = schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1beta1", Resource: "serviceexports"}

// Remote is a source cluster: its name (as in the mirrors' labels) and
// read-only clients.
type Remote struct {
	// Name is the cluster's name, a DNS label.
	Name string
	// Kube reads Services and EndpointSlices.
	Kube kubernetes.Interface
	// Dynamic reads ServiceExports.
	Dynamic dynamic.Interface
	// Probe checks the cluster answers; nil asks its API server's version.
	Probe func(context.Context) error
}

// NewRemote builds the clients of a remote cluster from a rest.Config.
func NewRemote(name string, cfg *rest.Config) (Remote, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "meshd-mirror"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 15 * time.Second
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Remote{}, fmt.Errorf("building the Kubernetes client of cluster %s (%s): %w", name, cfg.Host, err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Remote{}, fmt.Errorf("building the dynamic client of cluster %s (%s): %w", name, cfg.Host, err)
	}
	return Remote{Name: name, Kube: kube, Dynamic: dyn}, nil
}

const indexService = "service" // EndpointSlices by namespace/service-name

func sliceServiceIndex(o any) ([]string, error) {
	sl, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := sl.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{sl.Namespace + "/" + name}, nil
}

// remote is a running remote cluster: its informers and health.
type remote struct {
	Remote
	services, slices, exports cache.SharedIndexInformer
	cancel                    context.CancelFunc
	started                   bool
	synced                    atomic.Bool
	// self: the local cluster as a source of the MCS objects (not mirrored).
	self bool
	// clusterID is the cluster's ID in the clusterset (ClusterProperty
	// cluster.clusterset.k8s.io), resolved before synced is set.
	clusterID string
	// live follows its meshd heartbeat Leases (nil: not followed).
	live *liveness.Liveness

	mu      sync.Mutex
	lastOK  time.Time // last successful probe (or the start)
	probeOK bool
	expired bool // unreachable for longer than the grace period
}

func (r *remote) isExpired() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expired
}

// exported reports whether namespace/name has a ServiceExport.
func (r *remote) exported(ns, name string) bool {
	_, ok, _ := r.exports.GetIndexer().GetByKey(ns + "/" + name)
	return ok
}

// export is the ServiceExport namespace/name, nil if none.
func (r *remote) export(ns, name string) *unstructured.Unstructured {
	o, ok, _ := r.exports.GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil
	}
	u, _ := o.(*unstructured.Unstructured)
	return u
}

func (r *remote) service(ns, name string) *corev1.Service {
	o, ok, _ := r.services.GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil
	}
	s, _ := o.(*corev1.Service)
	return s
}

func (r *remote) endpointSlices(ns, name string) []*discoveryv1.EndpointSlice {
	objs, _ := r.slices.GetIndexer().ByIndex(indexService, ns+"/"+name)
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, sl)
		}
	}
	return out
}

// start runs the informers and the health probe of r until ctx ends.
func (c *Controller) startRemote(ctx context.Context, r *remote) {
	ctx, cancel := context.WithCancel(ctx)
	r.cancel, r.started = cancel, true
	r.mu.Lock()
	r.lastOK = c.now()
	r.mu.Unlock()
	factory := informers.NewSharedInformerFactoryWithOptions(r.Kube, c.opts.Resync, leanCache)
	r.services = factory.Core().V1().Services().Informer()
	r.slices = factory.Discovery().V1().EndpointSlices().Informer()
	_ = r.slices.AddIndexers(cache.Indexers{indexService: sliceServiceIndex})
	r.exports = dynamicinformer.NewFilteredDynamicInformer(r.Dynamic, ServiceExportGVR, "", c.opts.Resync, cache.Indexers{}, nil).Informer()
	_ = r.exports.SetTransform(convert.DropManagedFields) // not started: cannot fail

	changed := func(ns, name string) {
		if !r.self {
			c.remoteChanged(Key{Cluster: r.Name, Namespace: ns, Name: name})
		}
		c.mcs.enqueue(ns, name)
	}
	byObject := func(o any) {
		ns, name := namespaceName(o)
		if name != "" && r.exported(ns, name) {
			changed(ns, name)
		}
	}
	bySlice := func(o any) {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
			if name := sl.Labels[discoveryv1.LabelServiceName]; name != "" && r.exported(sl.Namespace, name) {
				changed(sl.Namespace, name)
			}
		}
	}
	byExport := func(o any) {
		if ns, name := namespaceName(o); name != "" {
			changed(ns, name)
		}
	}
	for _, h := range []struct {
		inf  cache.SharedIndexInformer
		f    func(any)
		what string
	}{{r.services, byObject, "Services"}, {r.slices, bySlice, "EndpointSlices"}, {r.exports, byExport, "ServiceExports"}} {
		_, _ = h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: h.f, UpdateFunc: func(_, o any) { h.f(o) }, DeleteFunc: h.f,
		})
		what := h.what
		_ = h.inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			c.log.Warn("cannot watch a remote cluster; keeping its mirrors", "cluster", r.Name, "resource", what, "error", err)
		})
	}
	factory.Start(ctx.Done())
	go r.exports.RunWithContext(ctx)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), r.services.HasSynced, r.slices.HasSynced, r.exports.HasSynced) {
			return
		}
		if r.self {
			r.synced.Store(true)
			return
		}
		if c.mcs != nil {
			id, from := remoteClusterID(ctx, r.Remote, r.Name)
			r.clusterID = id
			c.log.Info("remote cluster ID", "cluster", r.Name, "clusterID", id, "from", from)
		}
		r.synced.Store(true)
		c.log.Info("remote cluster synced", "cluster", r.Name, "exports", len(r.exports.GetStore().ListKeys()))
		c.enqueueCluster(r.Name)
		c.mcs.enqueueAll("")
	}()
	if !r.self {
		// r.live before the probe loop, which freezes it while r's API is down.
		if c.mcs != nil && c.opts.LeaseNamespace != "" {
			r.live = newLeaseLiveness(c.now)
			go c.runNodeLiveness(ctx, r, c.opts.LeaseNamespace)
		}
		go c.probeLoop(ctx, r)
	}
}

// probeLoop probes r every ProbeInterval. Unreachable for longer than the
// grace period, r's mirrors are marked not ready; answering again, they are
// synced from its (relisted) state. While r does not answer, the ages of
// its heartbeat Leases are frozen (no renewal can be seen then), so an API
// outage shorter than the grace period marks no node dead; past the grace
// period they count again, from where the grace period ended.
func (c *Controller) probeLoop(ctx context.Context, r *remote) {
	probe := r.Probe
	if probe == nil {
		probe = func(context.Context) error {
			_, err := r.Kube.Discovery().ServerVersion()
			return err
		}
	}
	t := time.NewTicker(c.opts.ProbeInterval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, max(c.opts.ProbeInterval, 5*time.Second))
		err := probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := c.now()
		r.mu.Lock()
		if err == nil {
			r.lastOK = now
		}
		wasOK, wasExpired := r.probeOK, r.expired
		r.probeOK = err == nil
		r.expired = err != nil && now.Sub(r.lastOK) > c.opts.GracePeriod
		expired := r.expired
		r.mu.Unlock()
		if r.live != nil {
			switch {
			case err == nil:
				r.live.SetAPIReachable(true)
			case expired:
				// Past the grace period the outage counts against the
				// Leases: a node that died meanwhile is not live again
				// when r answers.
				r.live.Thaw(c.opts.GracePeriod)
			default:
				r.live.SetAPIReachable(false)
			}
		}
		if err == nil {
			c.metrics.reachable.WithLabelValues(r.Name).Set(1)
		} else {
			c.metrics.reachable.WithLabelValues(r.Name).Set(0)
		}
		switch {
		case err != nil && wasOK:
			c.log.Warn("remote cluster unreachable; keeping its mirrors for the grace period", "cluster", r.Name, "grace", c.opts.GracePeriod, "error", err)
		case err == nil && !wasOK:
			c.log.Info("remote cluster reachable", "cluster", r.Name)
		}
		if expired != wasExpired {
			if expired {
				c.log.Warn("remote cluster unreachable past the grace period; marking its mirrors' endpoints not ready", "cluster", r.Name, "since", r.lastOK)
			}
			c.enqueueCluster(r.Name)
			c.mcs.enqueueSource(r)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func namespaceName(o any) (string, string) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	m, ok := o.(interface {
		GetNamespace() string
		GetName() string
	})
	if !ok {
		return "", ""
	}
	return m.GetNamespace(), m.GetName()
}
