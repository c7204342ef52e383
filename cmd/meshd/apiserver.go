package main

import (
	"context"
	"net/netip"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/convert"
)

// The API server's addresses. In a Pod meshd dials the kubernetes
// Service's ClusterIP (KUBERNETES_SERVICE_HOST), and kube-proxy sends the
// connection to an endpoint of that Service: the API server's own address,
// which the API server publishes in the EndpointSlice default/kubernetes.
// A Peer or linked cluster whose range covers that address would route the
// node's API traffic into a tunnel, so the reconcile protects the endpoints
// as well as the address dialled (reconciler.apiServerAddrs), from a cache
// of that one object (RBAC: the Role meshd-apiserver-endpoints in default,
// resourceNames kubernetes).

// newAPIServerSlices returns the informer of the EndpointSlice
// default/kubernetes and nothing else (a metadata.name field selector, so
// the Role may name the object).
func newAPIServerSlices(kube kubernetes.Interface) cache.SharedIndexInformer {
	return informers.NewSharedInformerFactoryWithOptions(kube, noInformerResync,
		informers.WithNamespace(convert.APIServerEndpointSliceNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", convert.APIServerEndpointSliceName).String()
		}),
	).Discovery().V1().EndpointSlices().Informer()
}

// apiServerSlicesHandler reconciles when the API server's addresses change
// (an API server added, moved or removed), and logs the new set.
func (d *daemon) apiServerSlicesHandler() cache.ResourceEventHandler {
	changed := func() {
		d.log.Info("API server addresses: no Peer or linked cluster may route them", "addresses", d.rec.apiServerAddrs())
		d.enqueue()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed() },
		UpdateFunc: func(old, cur any) {
			if !slices.Equal(sliceAddrs(old), sliceAddrs(cur)) {
				changed()
			}
		},
		DeleteFunc: func(any) { changed() },
	}
}

func sliceAddrs(o any) []netip.Addr {
	s, _ := o.(*discoveryv1.EndpointSlice)
	return convert.APIServerEndpoints([]*discoveryv1.EndpointSlice{s})
}

// apiServerSlicesError handles the informer's list and watch errors. A
// meshd whose ServiceAccount may not read the EndpointSlice (the RBAC of
// an older release) protects only the address it dials: it says so once,
// and its caches count as synced without this one, so the node is
// programmed all the same. Other errors are retried as by any informer.
func (d *daemon) apiServerSlicesError(ctx context.Context, r *cache.Reflector, err error) {
	if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
		if !d.apiServerSlicesUnavailable.Load() { // only the reflector calls this
			d.log.Warn("cannot read the EndpointSlice default/kubernetes: only the API server address meshd dials is protected from Peers and linked clusters, not the API server's own addresses behind the kubernetes Service; grant the Role meshd-apiserver-endpoints (manifests/rbac.yaml)", "error", err)
			d.apiServerSlicesUnavailable.Store(true)
		}
		return
	}
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

// apiServerSlicesSynced: the cache has synced, or cannot (see
// apiServerSlicesError).
func (d *daemon) apiServerSlicesSynced() bool {
	return d.apiServerSlices == nil || d.apiServerSlices.HasSynced() || d.apiServerSlicesUnavailable.Load()
}
