package clusterlink

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// LinkLiveness judges the nodes of linked clusters the way those clusters'
// own nodes judge them: for each link it watches the linked cluster's
// heartbeat Leases (with their probe reports) in the lease namespace and
// keeps a liveness.Liveness for it. A linked cluster's leaders then fail over within
// the same budget as the local ones, and both clusters agree on them.
// Sync starts and stops the watches as links come and go; a link whose
// Leases cannot be read (an older reader role without `leases`, run
// `meshctl link` again) keeps every node live, as before. Safe for
// concurrent use.
type LinkLiveness struct {
	log       *slog.Logger
	namespace string
	timeout   time.Duration
	takeover  time.Duration
	resync    time.Duration
	onChange  func()
	now       func() time.Time

	mu      sync.Mutex
	ctx     context.Context
	remotes map[string]*remoteLeases // by link Secret name
}

type remoteLeases struct {
	// reach is what the Lease watch says of the linked API server:
	// reachUnknown until a Lease event or a failed watch, reachYes after a
	// Lease event (heartbeats renew every quarter lease duration), reachNo
	// after a watch failed (not for lack of permission).
	reach atomic.Int32
	// lastEvent is when the last Lease event arrived (unix nanoseconds; 0:
	// none yet). A linked API server that hangs fails no watch for a long
	// time: silence longer than half the lease duration, while its nodes
	// renew every quarter, says it as well (CheckSilence).
	lastEvent atomic.Int64
	// since is when the Lease watch last began to answer (unix
	// nanoseconds; 0: not yet): the first Lease event after a start or
	// after the cluster was unreachable. Until a lease duration has passed
	// since, a node's Lease may not have been renewed since the outage
	// ended (see Settled).
	since    atomic.Int64
	kc       []byte
	cancel   context.CancelFunc
	liveness *liveness.Liveness
	leases   cache.SharedIndexInformer
}

// NewLinkLiveness returns a LinkLiveness; onChange is called when a linked
// cluster's liveness decision may have changed. Nothing runs before Run.
func NewLinkLiveness(log *slog.Logger, namespace string, timeout, takeover, resync time.Duration, onChange func()) *LinkLiveness {
	return &LinkLiveness{log: log, namespace: namespace, timeout: timeout, takeover: takeover, resync: resync,
		onChange: onChange, now: time.Now, remotes: map[string]*remoteLeases{}}
}

// Run keeps the watches Sync asks for until ctx ends.
func (w *LinkLiveness) Run(ctx context.Context) error {
	w.bind(ctx)
	<-ctx.Done()
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, r := range w.remotes {
		r.cancel()
		delete(w.remotes, name)
	}
	w.ctx = nil
	return nil
}

// bind makes Sync start watches under ctx (Run does it; a caller that must
// not race Run's start calls it first).
func (w *LinkLiveness) bind(ctx context.Context) {
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
}

// Sync makes the watches match the linked clusters: one per usable link,
// restarted when its kubeconfig changes. It never blocks on the network.
func (w *LinkLiveness) Sync(remotes []RemoteCluster) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil {
		return // not running (yet)
	}
	seen := map[string]bool{}
	for _, rc := range remotes {
		if rc.Err != nil || rc.Secret == nil {
			continue
		}
		_, kc, err := LinkFromSecret(rc.Secret)
		if err != nil {
			continue
		}
		name := rc.Secret.Name
		seen[name] = true
		if old, ok := w.remotes[name]; ok {
			if bytes.Equal(old.kc, kc) {
				continue
			}
			old.cancel()
			delete(w.remotes, name)
		}
		r, err := w.start(kc)
		if err != nil {
			w.log.Warn("cannot watch a linked cluster's Leases; its nodes count as live", "cluster", rc.Settings.Name, "error", err)
			continue
		}
		w.remotes[name] = r
	}
	for name, r := range w.remotes {
		if !seen[name] {
			r.cancel()
			delete(w.remotes, name)
		}
	}
}

func (w *LinkLiveness) start(kc []byte) (*remoteLeases, error) {
	cfg, err := RESTConfig(kc)
	if err != nil {
		return nil, fmt.Errorf("parsing the link kubeconfig: %w", err)
	}
	cfg.UserAgent = "meshd-link-liveness"
	cfg.Timeout = 15 * time.Second
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building a client for %s: %w", cfg.Host, err)
	}
	l := liveness.NewLiveness(w.timeout, w.now)
	l.SetTakeoverDelay(w.takeover)
	inf := informers.NewSharedInformerFactoryWithOptions(c, w.resync, informers.WithNamespace(w.namespace),
		informers.WithTransform(convert.DropManagedFields)).Coordination().V1().Leases().Informer()
	r := &remoteLeases{kc: kc, liveness: l, leases: inf}
	if _, err := inf.AddEventHandler(w.leaseHandler(r)); err != nil {
		return nil, err
	}
	// The linked cluster unreachable: freeze, do not declare its nodes dead.
	_ = inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) {
			return // an older reader role without leases: every node live, as before
		}
		if l.SetAPIReachable(false) {
			w.log.Warn("linked cluster's Leases unreachable; its liveness decisions are frozen", "host", cfg.Host, "error", err)
		}
		if r.reach.Swap(reachNo) != reachNo {
			w.onChange()
		}
	})
	ctx, cancel := context.WithCancel(w.ctx)
	r.cancel = cancel
	go inf.RunWithContext(ctx)
	return r, nil
}

// CheckSilence marks every linked cluster whose Leases have been silent for
// more than half the lease duration unreachable (and freezes its liveness
// decisions, as a failed watch does); it reports whether one changed.
func (w *LinkLiveness) CheckSilence() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := false
	now := w.now().UnixNano()
	for name, r := range w.remotes {
		last := r.lastEvent.Load()
		if last == 0 || time.Duration(now-last) <= w.timeout/2 || r.reach.Load() == reachNo {
			continue
		}
		r.reach.Store(reachNo)
		r.liveness.SetAPIReachable(false)
		w.log.Warn("linked cluster's Leases silent; counting it unreachable, its liveness decisions frozen", "secret", name, "silent_for", time.Duration(now-last).Round(time.Second))
		changed = true
	}
	return changed
}

const (
	reachUnknown int32 = iota
	reachYes
	reachNo
)

// leaseHandler observes a linked cluster's heartbeat Leases into r.
func (w *LinkLiveness) leaseHandler(r *remoteLeases) cache.ResourceEventHandler {
	l := r.liveness
	observe := func(o any) {
		if lease, ok := o.(*coordinationv1.Lease); ok {
			reach := l.SetAPIReachable(true)
			r.lastEvent.Store(w.now().UnixNano())
			if r.reach.Swap(reachYes) != reachYes {
				reach = true
				r.since.Store(w.now().UnixNano())
			}
			if l.Observe(lease) && l.Changed() || reach {
				w.onChange()
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: observe,
		UpdateFunc: func(old, o any) {
			// A resync replays the same Lease: no sign of life.
			if a, ok := old.(*coordinationv1.Lease); ok {
				if b, ok := o.(*coordinationv1.Lease); ok && a.ResourceVersion != "" && a.ResourceVersion == b.ResourceVersion {
					return
				}
			}
			observe(o)
		},
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if lease, ok := o.(*coordinationv1.Lease); ok {
				if node, mine := liveness.NodeNameFromLease(lease); mine {
					l.Forget(node)
					w.onChange()
				}
			}
		},
	}
}

// remote is the Lease watch of the cluster linked by the Secret
// secretName, nil if there is none.
func (w *LinkLiveness) remote(secretName string) *remoteLeases {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.remotes[secretName]
}

// Reachable reports whether the cluster linked by the Secret secretName
// answers: false once a watch of its Leases failed (for another reason than
// a missing permission), true once a Lease event arrived; known is false
// before either happened.
func (w *LinkLiveness) Reachable(secretName string) (ok, known bool) {
	r := w.remote(secretName)
	if r == nil {
		return false, false
	}
	switch r.reach.Load() {
	case reachYes:
		return true, true
	case reachNo:
		return false, true
	}
	return false, false
}

// notSeenDying reports whether every one of leaders (of the cluster linked
// by the Secret secretName) is live, or dead only by its Lease having been
// stale on first sight (liveness.Liveness.StaleOnFirstSight): none was seen
// dying since the Lease watch began.
func (w *LinkLiveness) notSeenDying(secretName string, leaders []v1alpha1.ClusterLinkLeader, live map[string]bool) bool {
	r := w.remote(secretName)
	if r == nil {
		return false
	}
	for _, l := range leaders {
		if !live[l.Name] && !r.liveness.StaleOnFirstSight(l.Name) {
			return false
		}
	}
	return true
}

// Settled reports whether the liveness of the cluster linked by the Secret
// secretName rests on Leases observed for a full lease duration since its
// Lease watch last began to answer (after a start or an outage). Before,
// a Lease that looks stale may only not yet have been renewed after the
// outage (every node's heartbeat failed during it): wait is how long until
// it is settled. A cluster without a watch counts as settled.
func (w *LinkLiveness) Settled(secretName string) (ok bool, wait time.Duration) {
	r := w.remote(secretName)
	if r == nil {
		return true, 0
	}
	since := r.since.Load()
	if since == 0 || r.reach.Load() != reachYes {
		return false, w.timeout
	}
	if d := w.timeout - time.Duration(w.now().UnixNano()-since); d > 0 {
		return false, d
	}
	return true, 0
}

// Judge returns the RemotePeersLive judge of the cluster linked by the
// Secret secretName; nil (every node live) until its Leases have synced.
func (w *LinkLiveness) Judge(secretName string) RemoteJudge {
	r := w.remote(secretName)
	if r == nil || !r.leases.HasSynced() || len(r.leases.GetStore().ListKeys()) == 0 {
		return nil
	}
	return r.liveness.DecideCandidates
}

// Changed reports whether any linked cluster's decision changed since it
// was last used (see liveness.Liveness.Changed).
func (w *LinkLiveness) Changed() bool {
	for _, l := range w.all() {
		if l.Changed() {
			return true
		}
	}
	return false
}

// NextChange is the earliest liveness.Liveness.NextChange of the linked clusters.
func (w *LinkLiveness) NextChange() (t time.Time, ok bool) {
	for _, l := range w.all() {
		if c, cok := l.NextChange(); cok && (!ok || c.Before(t)) {
			t, ok = c, true
		}
	}
	return t, ok
}

func (w *LinkLiveness) all() []*liveness.Liveness {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*liveness.Liveness, 0, len(w.remotes))
	for _, r := range w.remotes {
		out = append(out, r.liveness)
	}
	return out
}
