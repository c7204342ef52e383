package main

import (
	"context"
	"sync"
	"sync/atomic"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
)

// leaseWatch keeps in the caches the heartbeat Leases this node needs, and
// no others (docs/scale.md): its own (the API path's health, freeze.go)
// and, in location mesh, those of every location's leader candidates
// (liveness.LabelCandidate; mesh.Candidates), whose liveness and probe
// reports elect the leaders. In full mesh every node is its own location's
// only member: no other node's liveness changes its plan. At 1,000 nodes
// in 10 locations a daemon so receives about 4 Lease renewals a second
// instead of 100.
type leaseWatch struct {
	own, candidates cache.SharedIndexInformer // candidates nil: full mesh
}

func newLeaseWatch(kube kubernetes.Interface, c *config, handler cache.ResourceEventHandler) (*leaseWatch, error) {
	informer := func(tweak func(*metav1.ListOptions), h cache.ResourceEventHandler) (cache.SharedIndexInformer, error) {
		f := informers.NewSharedInformerFactoryWithOptions(kube, noInformerResync, informers.WithNamespace(c.LeaseNamespace),
			informers.WithTransform(convert.DropManagedFields), informers.WithTweakListOptions(tweak))
		i := f.Coordination().V1().Leases().Informer()
		_, err := i.AddEventHandler(h)
		return i, err
	}
	ownName := liveness.LeaseName(c.Hostname)
	own := fields.OneTermEqualSelector("metadata.name", ownName).String()
	w := &leaseWatch{}
	var err error
	if w.own, err = informer(func(o *metav1.ListOptions) { o.FieldSelector = own }, handler); err != nil {
		return nil, err
	}
	if c.Granularity == string(mesh.GranularityFull) {
		return w, nil
	}
	r, err := labels.NewRequirement(liveness.LabelCandidate, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	candidates := labels.NewSelector().Add(*r).String()
	// The own Lease is the own informer's: it leaving the candidates (a
	// "deletion" there) is no news of this node.
	others := cache.FilteringResourceEventHandler{Handler: handler, FilterFunc: func(obj any) bool {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		l, ok := obj.(*coordinationv1.Lease)
		return !ok || l.Name != ownName
	}}
	w.candidates, err = informer(func(o *metav1.ListOptions) { o.LabelSelector = candidates }, others)
	return w, err
}

// Run runs the informers until ctx ends, and returns once they stopped.
func (w *leaseWatch) Run(ctx context.Context) {
	var wg sync.WaitGroup
	if w.candidates != nil {
		wg.Go(func() { w.candidates.RunWithContext(ctx) })
	}
	w.own.RunWithContext(ctx)
	wg.Wait()
}

// synced: every informer has synced.
func (w *leaseWatch) synced() bool {
	return w.own.HasSynced() && (w.candidates == nil || w.candidates.HasSynced())
}

// candidacy is whether this node is a leader candidate, as its last
// reconcile computed it (0: not yet known, 1: no, 2: yes): the heartbeat
// labels its Lease accordingly.
type candidacy struct{ state atomic.Int32 }

// set records candidate and reports whether that changed what the
// heartbeat publishes.
func (c *candidacy) set(candidate bool) bool {
	v := int32(1)
	if candidate {
		v = 2
	}
	return c.state.Swap(v) != v
}

// get is the heartbeat's liveness.HeartbeatOptions.Candidate.
func (c *candidacy) get() (candidate, known bool) {
	v := c.state.Load()
	return v == 2, v != 0
}
