package clusterlink

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/convert"
)

// RemoteCluster is a linked cluster as last seen: its settings, the Secret
// that links it (for Events) and its Nodes. A cluster that stops answering
// keeps its last Nodes, so a blip never removes its peers.
type RemoteCluster struct {
	Settings LinkSettings
	Secret   *corev1.Secret
	Nodes    []*corev1.Node
	// Synced is false until the cluster's Nodes were listed once (since
	// meshd started or the link's kubeconfig changed): Nodes is then
	// incomplete, and the cluster's last known peers must be kept.
	Synced bool
	// Err is set when the link Secret itself is unusable.
	Err error
}

// LinkWatcher watches the link Secrets of a namespace and, for each, the
// Nodes of the linked cluster, calling onChange whenever anything changes.
type LinkWatcher struct {
	log       *slog.Logger
	kube      kubernetes.Interface
	namespace string
	resync    time.Duration
	onChange  func()

	listed atomic.Bool // the link Secrets were listed once

	mu      sync.Mutex
	remotes map[string]*remoteWatch // by Secret name
}

// Listed reports whether the link Secrets have been listed: before, an
// empty Snapshot means "not known yet", not "no linked cluster".
func (w *LinkWatcher) Listed() bool { return w.listed.Load() }

type remoteWatch struct {
	secret   *corev1.Secret
	settings LinkSettings
	kc       []byte
	err      error
	cancel   context.CancelFunc
	nodes    cache.SharedIndexInformer
}

// NewLinkWatcher returns a watcher of link Secrets in namespace.
func NewLinkWatcher(log *slog.Logger, kube kubernetes.Interface, namespace string, resync time.Duration, onChange func()) *LinkWatcher {
	return &LinkWatcher{log: log, kube: kube, namespace: namespace, resync: resync, onChange: onChange, remotes: map[string]*remoteWatch{}}
}

// LinkSecretEvents are the callbacks of [WatchLinkSecrets]. They run one at
// a time, on the watch's goroutine.
type LinkSecretEvents struct {
	// Upsert is called for a link Secret added or changed (and at resyncs).
	Upsert func(*corev1.Secret)
	// Delete is called with the name of a link Secret deleted.
	Delete func(name string)
	// Synced, if set, is called once, after every link Secret present when
	// the watch started has been passed to Upsert.
	Synced func()
}

// WatchLinkSecrets watches the cluster-link Secrets (label
// meshd.io/cluster-link=true) of namespace until ctx ends. It is the one
// watcher of link Secrets: the node daemon's LinkWatcher and the service
// mirror both use it.
func WatchLinkSecrets(ctx context.Context, kube kubernetes.Interface, namespace string, resync time.Duration, ev LinkSecretEvents) error {
	factory := informers.NewSharedInformerFactoryWithOptions(kube, resync,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelClusterLink + "=true" }))
	inf := factory.Core().V1().Secrets().Informer()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if s, ok := o.(*corev1.Secret); ok {
				ev.Upsert(s)
			}
		},
		UpdateFunc: func(_, o any) {
			if s, ok := o.(*corev1.Secret); ok {
				ev.Upsert(s)
			}
		},
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if s, ok := o.(*corev1.Secret); ok {
				ev.Delete(s.Name)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching link Secrets in %s: %w", namespace, err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if ev.Synced != nil {
		if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return nil
		}
		ev.Synced()
	}
	<-ctx.Done()
	return nil
}

// Run watches until ctx ends, then stops every remote watch.
func (w *LinkWatcher) Run(ctx context.Context) error {
	err := WatchLinkSecrets(ctx, w.kube, w.namespace, w.resync, LinkSecretEvents{
		Upsert: func(s *corev1.Secret) { w.upsert(ctx, s) },
		Delete: w.remove,
		Synced: func() { w.listed.Store(true); w.onChange() },
	})
	w.mu.Lock()
	for name, r := range w.remotes {
		r.cancel()
		delete(w.remotes, name)
	}
	w.mu.Unlock()
	return err
}

func (w *LinkWatcher) upsert(ctx context.Context, s *corev1.Secret) {
	settings, kc, err := LinkFromSecret(s)
	w.mu.Lock()
	old := w.remotes[s.Name]
	if old != nil && err == nil && old.err == nil && bytes.Equal(old.kc, kc) && old.settings.Name == settings.Name {
		old.secret, old.settings = s, settings // settings only: no reconnect
		w.mu.Unlock()
		w.onChange()
		return
	}
	w.mu.Unlock()
	// Connect outside the lock; publish the complete watch under it.
	r := &remoteWatch{secret: s, settings: settings, kc: kc, err: err, cancel: func() {}}
	if err == nil {
		r.nodes, r.cancel, r.err = w.start(ctx, settings.Name, kc)
	}
	w.mu.Lock()
	if old := w.remotes[s.Name]; old != nil {
		old.cancel()
	}
	w.remotes[s.Name] = r
	w.mu.Unlock()
	if r.err != nil {
		w.log.Error("cannot use cluster link; keeping the linked cluster's last known peers", "secret", s.Namespace+"/"+s.Name, "error", r.err)
	} else {
		w.log.Info("watching linked cluster", "cluster", settings.Name, "secret", s.Namespace+"/"+s.Name)
	}
	w.onChange()
}

// start begins watching the Nodes of the cluster reached by kubeconfig kc.
func (w *LinkWatcher) start(ctx context.Context, cluster string, kc []byte) (cache.SharedIndexInformer, context.CancelFunc, error) {
	none := func() {}
	cfg, err := RESTConfig(kc)
	if err != nil {
		return nil, none, fmt.Errorf("link to cluster %s: parsing its kubeconfig: %w", cluster, err)
	}
	cfg.UserAgent = "meshd-link"
	cfg.Timeout = 15 * time.Second
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, none, fmt.Errorf("link to cluster %s: building a client for %s: %w", cluster, cfg.Host, err)
	}
	// Lean cache (convert.LeanNode): only what Leaders reads of each
	// linked Node is kept, and an update that leaves that the same (a
	// kubelet status update, another component's annotation) calls no
	// onChange. A resync (same resourceVersion) still does.
	nodes := informers.NewSharedInformerFactoryWithOptions(c, w.resync, informers.WithTransform(convert.LeanNode)).Core().V1().Nodes().Informer()
	handler := func(any) { w.onChange() }
	reg, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: handler, DeleteFunc: handler,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && o.ResourceVersion != n.ResourceVersion && convert.SameLeanNode(o, n) {
				return
			}
			handler(cur)
		},
	})
	if err != nil {
		return nil, none, fmt.Errorf("link to cluster %s: %w", cluster, err)
	}
	_ = nodes.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		w.log.Warn("linked cluster unreachable; keeping its last known nodes", "cluster", cluster, "error", err)
	})
	rctx, cancel := context.WithCancel(ctx)
	go nodes.RunWithContext(rctx)
	// The first sync changes what Snapshot reports (Synced) even for a
	// cluster without nodes.
	go func() {
		if cache.WaitForCacheSync(rctx.Done(), reg.HasSynced) {
			w.onChange()
		}
	}()
	return nodes, cancel, nil
}

func (w *LinkWatcher) remove(name string) {
	w.mu.Lock()
	if r, ok := w.remotes[name]; ok {
		r.cancel()
		delete(w.remotes, name)
		w.log.Info("cluster unlinked", "cluster", r.settings.Name)
	}
	w.mu.Unlock()
	w.onChange()
}

// Snapshot returns the linked clusters, sorted by name.
func (w *LinkWatcher) Snapshot() []RemoteCluster {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]RemoteCluster, 0, len(w.remotes))
	for _, r := range w.remotes {
		rc := RemoteCluster{Settings: r.settings, Secret: r.secret, Err: r.err}
		if r.nodes != nil {
			rc.Synced = r.nodes.HasSynced()
			for _, o := range r.nodes.GetStore().List() {
				if n, ok := o.(*corev1.Node); ok {
					rc.Nodes = append(rc.Nodes, n)
				}
			}
		}
		out = append(out, rc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Settings.Name < out[j].Settings.Name })
	return out
}
