package connect

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/client/clientset/versioned"
	meshdinformers "meshd.io/meshd/pkg/k8s/client/informers/externalversions/meshd/v1alpha1"
)

// Clients are the API clients meshd uses.
type Clients struct {
	// Kube is the core Kubernetes clientset.
	Kube kubernetes.Interface
	// Meshd is the generated clientset of the meshd.io API (Peers).
	Meshd versioned.Interface
	// Config is the configuration both were built from.
	Config *rest.Config
}

// NewClients builds the clients. An empty kubeconfig means the in-cluster
// configuration when running in a pod, else the usual client rules
// ($KUBECONFIG, then ~/.kube/config); a non-empty one is that file.
func NewClients(kubeconfig string) (*Clients, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return NewClientsForConfig(cfg)
}

// NewClientsForConfig builds the clients from a rest.Config (tests, e2e).
func NewClientsForConfig(cfg *rest.Config) (*Clients, error) {
	if cfg == nil {
		return nil, errors.New("building API clients: nil rest.Config")
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "meshd"
	}
	// client-go's default (5 requests/s, burst 10, per API group) caps the
	// mirror's bulk writes at about 10/s; meshd's own writes are rare.
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client for %s: %w", cfg.Host, err)
	}
	m, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the meshd.io client for %s: %w", cfg.Host, err)
	}
	return &Clients{Kube: kube, Meshd: m, Config: cfg}, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err == nil {
			return cfg, nil
		}
		if !errors.Is(err, rest.ErrNotInCluster) {
			return nil, fmt.Errorf("loading the in-cluster configuration: %w", err)
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		if kubeconfig != "" {
			return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
		return nil, fmt.Errorf("loading a kubeconfig (not in a cluster; tried $KUBECONFIG and ~/.kube/config): %w", err)
	}
	return cfg, nil
}

// NewPeerInformer returns an informer over all Peers (cluster-scoped),
// without indexers; meshd reads its store. Its handlers get a resync every
// resync (0 disables it).
func NewPeerInformer(c *Clients, resync time.Duration) cache.SharedIndexInformer {
	return meshdinformers.NewPeerInformer(c.Meshd, resync, cache.Indexers{})
}

// NewEventRecorder returns a recorder whose Events (e.g. Warnings about a
// Node's malformed annotations) are written to the API, and a function that
// stops it. It knows the core types and Peers. Events about cluster-scoped
// objects such as Nodes and Peers land in the default namespace, as
// kubelet's do.
func NewEventRecorder(c kubernetes.Interface, component string) (record.EventRecorder, func()) {
	s := runtime.NewScheme()
	// Both only register types into the fresh scheme; they cannot fail.
	_ = scheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.CoreV1().Events("")})
	return b.NewRecorder(s, corev1.EventSource{Component: component}), b.Shutdown
}
