package mirror

import (
	"context"
	"maps"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// nodeLiveness follows a source cluster's meshd heartbeat Leases (read
// through the link, never probed): a node whose Lease has not changed for
// its leaseDurationSeconds, timed on the local clock from when this process
// saw the change, is dead, and the endpoints on it are stale (not ready).
// A node without a Lease (no meshd there, or Leases not readable) is never
// dead: its endpoints follow the source's EndpointSlices alone.
type nodeLiveness struct {
	now func() time.Time

	mu   sync.Mutex
	obs  map[string]leaseObs
	dead map[string]bool
}

type leaseObs struct {
	version string
	at      time.Time
	ttl     time.Duration
}

func newNodeLiveness(now func() time.Time) *nodeLiveness {
	return &nodeLiveness{now: now, obs: map[string]leaseObs{}, dead: map[string]bool{}}
}

func (l *nodeLiveness) observe(o any) {
	lease, ok := o.(*coordinationv1.Lease)
	if !ok {
		return
	}
	node, ok := liveness.NodeNameFromLease(lease)
	if !ok || lease.Labels[liveness.LabelManagedBy] != liveness.ManagedBy {
		return
	}
	ttl := 40 * time.Second
	if d := lease.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		ttl = time.Duration(*d) * time.Second
	}
	version := lease.ResourceVersion
	if lease.Spec.RenewTime != nil {
		version += "/" + lease.Spec.RenewTime.String()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.obs[node]; ok && old.version == version {
		return
	}
	l.obs[node] = leaseObs{version: version, at: l.now(), ttl: ttl}
}

func (l *nodeLiveness) forget(o any) {
	if node, ok := deletedLeaseNode(o); ok {
		l.mu.Lock()
		delete(l.obs, node)
		l.mu.Unlock()
	}
}

// deletedLeaseNode is the node whose heartbeat Lease an informer's delete
// event o (possibly a tombstone) removed; ok is false for anything else.
func deletedLeaseNode(o any) (node string, ok bool) {
	if t, isTomb := o.(cache.DeletedFinalStateUnknown); isTomb {
		o = t.Obj
	}
	lease, isLease := o.(*coordinationv1.Lease)
	if !isLease {
		return "", false
	}
	return liveness.NodeNameFromLease(lease)
}

// recompute updates the dead set; it reports whether it changed.
func (l *nodeLiveness) recompute() (dead []string, changed bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	next := map[string]bool{}
	for n, o := range l.obs {
		if now.Sub(o.at) > o.ttl {
			next[n] = true
			dead = append(dead, n)
		}
	}
	changed = !maps.Equal(next, l.dead)
	l.dead = next
	return dead, changed
}

func (l *nodeLiveness) isDead(node string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dead[node]
}

// runNodeLiveness watches r's heartbeat Leases in namespace and queues r's
// imports when a node dies or comes back. It does not hold up r's sync: a
// link that may not read Leases only loses this signal.
func (c *Controller) runNodeLiveness(ctx context.Context, r *remote, namespace string) {
	f := informers.NewSharedInformerFactoryWithOptions(r.Kube, c.opts.Resync, informers.WithNamespace(namespace))
	inf := f.Coordination().V1().Leases().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: r.live.observe, UpdateFunc: func(_, o any) { r.live.observe(o) }, DeleteFunc: r.live.forget,
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		c.log.Debug("cannot watch a source cluster's heartbeat Leases; its endpoints follow its EndpointSlices alone", "cluster", r.Name, "error", err)
	})
	f.Start(ctx.Done())
	t := time.NewTicker(min(c.opts.ProbeInterval, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if dead, changed := r.live.recompute(); changed {
			c.log.Info("source cluster's meshd nodes by heartbeat Lease changed; updating their imported endpoints", "cluster", r.Name, "dead", dead)
			c.mcs.enqueueSource(r)
		}
	}
}
