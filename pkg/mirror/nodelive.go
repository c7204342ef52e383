package mirror

import (
	"context"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// defaultLeaseDuration is the lifetime of a heartbeat Lease without
// leaseDurationSeconds.
const defaultLeaseDuration = 40 * time.Second

// newLeaseLiveness follows meshd heartbeat Leases (of a source cluster, read
// through the link and never probed, or of the local cluster): a node whose
// Lease has not changed for its leaseDurationSeconds, timed on the local
// clock from when this process saw the change, is dead (LeaseExpired), and
// the endpoints on it are stale (not ready). A node without a Lease (no
// meshd there, or Leases not readable) is never dead: its endpoints follow
// the source's EndpointSlices alone. Only the Leases count, not the probe
// reports in them.
func newLeaseLiveness(now func() time.Time) *liveness.Liveness {
	l := liveness.NewLiveness(defaultLeaseDuration, now)
	l.UseLeaseDurations()
	return l
}

// heartbeatLease is the meshd heartbeat Lease an informer's add or update
// event o carries; ok is false for anything else.
func heartbeatLease(o any) (lease *coordinationv1.Lease, node string, ok bool) {
	lease, ok = o.(*coordinationv1.Lease)
	if !ok || lease.Labels[liveness.LabelManagedBy] != liveness.ManagedBy {
		return nil, "", false
	}
	node, ok = liveness.NodeNameFromLease(lease)
	return lease, node, ok
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

// observeLease and forgetLease feed l from a Lease informer.
func observeLease(l *liveness.Liveness, o any) {
	if lease, _, ok := heartbeatLease(o); ok {
		l.Observe(lease)
	}
}

func forgetLease(l *liveness.Liveness, o any) {
	if node, ok := deletedLeaseNode(o); ok {
		l.Forget(node)
	}
}

// nodeDead reports whether r's liveness data says node is dead.
func (r *remote) nodeDead(node string) bool {
	return r.live != nil && r.live.LeaseExpired(node)
}

// runNodeLiveness watches r's heartbeat Leases in namespace and queues r's
// imports when a node dies or comes back. It does not hold up r's sync: a
// link that may not read Leases only loses this signal.
func (c *Controller) runNodeLiveness(ctx context.Context, r *remote, namespace string) {
	f := informers.NewSharedInformerFactoryWithOptions(r.Kube, c.opts.Resync, informers.WithNamespace(namespace), leanCache)
	inf := f.Coordination().V1().Leases().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { observeLease(r.live, o) },
		UpdateFunc: func(_, o any) { observeLease(r.live, o) },
		DeleteFunc: func(o any) { forgetLease(r.live, o) },
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		c.log.Debug("cannot watch a source cluster's heartbeat Leases; its endpoints follow its EndpointSlices alone", "cluster", r.Name, "error", err)
	})
	f.Start(ctx.Done())
	t := time.NewTicker(min(c.opts.ProbeInterval, time.Second))
	defer t.Stop()
	var dead []string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if next := r.live.ExpiredLeases(); !slices.Equal(next, dead) {
			dead = next
			c.log.Info("source cluster's meshd nodes by heartbeat Lease changed; updating their imported endpoints", "cluster", r.Name, "dead", dead)
			c.mcs.enqueueSource(r)
		}
	}
}
