package mirror

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// leaseHealth is the ClusterHealth meshd mirror uses by default: it reads
// the tunnel reports the local meshd nodes publish on their own heartbeat
// Leases (meshd.io/clusters-up/-down: location leaders probe the linked
// clusters' leaders through the WireGuard tunnels) and judges them with
// liveness.JudgeClusters: a cluster is down when a strict majority of the
// live local nodes reporting on it say down. A Lease not renewed for its
// leaseDurationSeconds (on this process's clock) does not vote; a cluster
// no live node reports on is unknown, and its endpoints keep following the
// remote API alone. A down verdict that turns unknown (the leader restarted
// and has not heard the cluster yet, or its Lease went stale) is held for
// tunnelHold, so a restart during an outage does not make the endpoints
// ready again.
type leaseHealth struct {
	live *liveness.Liveness
	now  func() time.Time

	mu      sync.Mutex
	reports map[string]liveness.Report
	judged  map[string]bool
	held    map[string]time.Time // down verdicts gone unknown, until when they hold
}

// tunnelHold is how long a down verdict outlives its reports.
const tunnelHold = 2 * time.Minute

func newLeaseHealth(now func() time.Time) *leaseHealth {
	return &leaseHealth{live: newLeaseLiveness(now), now: now, reports: map[string]liveness.Report{}, judged: map[string]bool{}, held: map[string]time.Time{}}
}

// Reachable implements ClusterHealth.
func (h *leaseHealth) Reachable(cluster string) (up, known bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if up, known = h.judged[cluster]; known {
		return up, known
	}
	if until, ok := h.held[cluster]; ok && h.now().Before(until) {
		return false, true
	}
	return false, false
}

func (h *leaseHealth) observe(o any) {
	lease, node, ok := heartbeatLease(o)
	if !ok {
		return
	}
	h.live.Observe(lease)
	h.mu.Lock()
	h.reports[node] = liveness.ReportFromLease(lease)
	h.mu.Unlock()
}

func (h *leaseHealth) forget(o any) {
	if node, ok := deletedLeaseNode(o); ok {
		h.live.Forget(node)
		h.mu.Lock()
		delete(h.reports, node)
		h.mu.Unlock()
	}
}

// recompute judges again; it returns the clusters whose judgement changed
// (became down, came back up, or became known or unknown), sorted.
func (h *leaseHealth) recompute() (changed []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	leaseLive := make(map[string]bool, len(h.reports))
	for n := range h.reports {
		leaseLive[n] = !h.live.LeaseExpired(n)
	}
	next := liveness.JudgeClusters(leaseLive, h.reports)
	now := h.now()
	for c, up := range next {
		delete(h.held, c)
		if old, ok := h.judged[c]; !ok || old != up {
			changed = append(changed, c)
		}
	}
	for c, up := range h.judged {
		if _, ok := next[c]; !ok {
			if up {
				changed = append(changed, c)
			} else {
				h.held[c] = now.Add(tunnelHold) // still down for the endpoints
			}
		}
	}
	for c, until := range h.held {
		if !now.Before(until) {
			delete(h.held, c)
			changed = append(changed, c)
		}
	}
	h.judged = next
	slices.Sort(changed)
	return changed
}

func (h *leaseHealth) down() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, c := range slices.Sorted(maps.Keys(h.judged)) {
		if !h.judged[c] {
			out = append(out, c)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(h.held)) {
		out = append(out, c+" (held)")
	}
	return out
}

// tunnelSyncWait bounds how long the MCS workers wait for the local Leases
// (a mirror that may not list them only loses this signal).
const tunnelSyncWait = 10 * time.Second

// runTunnelHealth watches the local heartbeat Leases and queues every
// source cluster's imports and mirrors when a tunnel judgement changes: at once on a
// Lease change, and at least every second (a Lease expiring). It closes
// synced after the first judgement from a synced cache, so a restarted
// mirror does not write endpoints ready before it knows the tunnels.
func (c *Controller) runTunnelHealth(ctx context.Context, h *leaseHealth, synced chan<- struct{}) {
	f := informers.NewSharedInformerFactoryWithOptions(c.local, c.opts.Resync, informers.WithNamespace(c.opts.LeaseNamespace), leanCache)
	inf := f.Coordination().V1().Leases().Informer()
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { h.observe(o); poke() },
		UpdateFunc: func(_, o any) { h.observe(o); poke() },
		DeleteFunc: func(o any) { h.forget(o); poke() },
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		c.log.Debug("cannot watch the local heartbeat Leases; tunnel health unknown, endpoints follow the source clusters' APIs", "namespace", c.opts.LeaseNamespace, "error", err)
	})
	f.Start(ctx.Done())
	defer f.Shutdown()
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			poke()
		}
	}()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		changed := h.recompute()
		if synced != nil && inf.HasSynced() {
			close(synced)
			synced = nil
		}
		if len(changed) > 0 {
			c.log.Info("tunnel health of source clusters changed; updating their imported endpoints", "changed", changed, "down", h.down())
			c.mu.Lock()
			for _, r := range c.remotes {
				c.mcs.enqueueSource(r)
			}
			names := slices.Collect(maps.Keys(c.remotes))
			c.mu.Unlock()
			for _, name := range names {
				c.enqueueCluster(name) // the <name>-<cluster> mirrors
			}
		}
	}
}
