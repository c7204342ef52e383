package k8s

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// RemoteCluster is a linked cluster as last seen: its settings, the Secret
// that links it (for Events) and its Nodes. A cluster that stops answering
// keeps its last Nodes, so a blip never removes its peers.
type RemoteCluster struct {
	Settings LinkSettings
	Secret   *corev1.Secret
	Nodes    []*corev1.Node
	Synced   bool
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

	mu      sync.Mutex
	remotes map[string]*remoteWatch // by Secret name
}

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

// Run watches until ctx ends, then stops every remote watch.
func (w *LinkWatcher) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(w.kube, w.resync,
		informers.WithNamespace(w.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelClusterLink + "=true" }))
	inf := factory.Core().V1().Secrets().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.upsert(ctx, o) },
		UpdateFunc: func(_, o any) { w.upsert(ctx, o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if s, ok := o.(*corev1.Secret); ok {
				w.remove(s.Name)
			}
		},
	}); err != nil {
		return fmt.Errorf("watching link Secrets: %w", err)
	}
	inf.RunWithContext(ctx)
	w.mu.Lock()
	for name, r := range w.remotes {
		r.cancel()
		delete(w.remotes, name)
	}
	w.mu.Unlock()
	return nil
}

func (w *LinkWatcher) upsert(ctx context.Context, o any) {
	s, ok := o.(*corev1.Secret)
	if !ok {
		return
	}
	settings, kc, err := LinkFromSecret(s)
	w.mu.Lock()
	old := w.remotes[s.Name]
	if old != nil && err == nil && old.err == nil && bytes.Equal(old.kc, kc) && old.settings.Name == settings.Name {
		old.secret, old.settings = s, settings // settings only: no reconnect
		w.mu.Unlock()
		w.onChange()
		return
	}
	if old != nil {
		old.cancel()
	}
	r := &remoteWatch{secret: s, settings: settings, kc: kc, err: err, cancel: func() {}}
	w.remotes[s.Name] = r
	w.mu.Unlock()
	if err == nil {
		r.err = w.start(ctx, r)
	}
	if r.err != nil {
		w.log.Error("cannot use cluster link", "secret", s.Namespace+"/"+s.Name, "error", r.err)
	} else {
		w.log.Info("watching linked cluster", "cluster", settings.Name, "secret", s.Namespace+"/"+s.Name)
	}
	w.onChange()
}

func (w *LinkWatcher) start(ctx context.Context, r *remoteWatch) error {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(r.kc)
	if err != nil {
		return fmt.Errorf("link to cluster %s: parsing its kubeconfig: %w", r.settings.Name, err)
	}
	cfg.UserAgent = "meshd-link"
	cfg.Timeout = 15 * time.Second
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("link to cluster %s: building a client for %s: %w", r.settings.Name, cfg.Host, err)
	}
	rctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	r.nodes = informers.NewSharedInformerFactory(c, w.resync).Core().V1().Nodes().Informer()
	handler := func(any) { w.onChange() }
	if _, err := r.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: handler, UpdateFunc: func(_, o any) { handler(o) }, DeleteFunc: handler,
	}); err != nil {
		cancel()
		return fmt.Errorf("link to cluster %s: %w", r.settings.Name, err)
	}
	_ = r.nodes.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		w.log.Warn("linked cluster unreachable; keeping its last known nodes", "cluster", r.settings.Name, "error", err)
	})
	go r.nodes.RunWithContext(rctx)
	return nil
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
