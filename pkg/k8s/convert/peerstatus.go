package convert

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	meshdv1alpha1 "meshd.io/meshd/pkg/k8s/client/clientset/versioned/typed/meshd/v1alpha1"
)

const (
	// PeerHandshakeResolution is how much newer a handshake must be than
	// the one a leader last wrote before it writes it: WireGuard
	// re-handshakes every 2 minutes while traffic or keepalives flow, so a
	// working Peer costs one status write per leader every ~4 minutes, and
	// its handshake age reads at most about 5 minutes.
	PeerHandshakeResolution = 3 * time.Minute
	// MaxPeerStatusLeaders caps status.leaders: with more locations (a full
	// mesh of many nodes) only the leaders of the first ones by name report
	// (the daemon decides), and an entry beyond the cap is never added.
	MaxPeerStatusLeaders = 32
	// maxPeerStatusMessage is the CRD's limit on status.leaders[].message.
	maxPeerStatusMessage = 1024
)

// PeerReport is what one node knows about the Peers after a reconcile: the
// "report" stage of watch → snapshot → plan → apply → report.
type PeerReport struct {
	// Node and Location are this node and its location (plan.Location).
	Node, Location string
	// Leader says whether this node leads its location. A node that does
	// not removes its own entries and writes nothing else.
	Leader bool
	// Locations are the locations of the current plan; a leader drops the
	// entries of locations that no longer exist. Nil drops nothing.
	Locations map[string]bool
	// Peers are this leader's findings by Peer name. A Peer object without
	// an entry here is left alone.
	Peers map[string]PeerFinding
}

// PeerFinding is one leader's view of one Peer.
type PeerFinding struct {
	// Accepted: the Peer converted (it is usable); Message tells the
	// problems found, also for an accepted Peer.
	Accepted bool
	Message  string
	// Applied: the Peer is on this node's WireGuard interface.
	Applied bool
	// LastHandshake is the latest handshake with the Peer (zero: none).
	LastHandshake time.Time
}

// PeerStatusFor returns the status p should have after merging report r
// (this node's entry, recomputed summary), and whether it differs from p's
// current status. Only this node's entry changes, and entries of locations
// gone; the summary (conditions, lastHandshakeTime) is a function of the
// entries, so leaders writing concurrently agree on it.
func PeerStatusFor(p *v1alpha1.Peer, r PeerReport, now time.Time) (v1alpha1.PeerStatus, bool) {
	cur := p.Status
	var own *v1alpha1.PeerLeaderStatus
	leaders := make([]v1alpha1.PeerLeaderStatus, 0, len(cur.Leaders)+1)
	for _, e := range cur.Leaders {
		switch {
		case e.Node == r.Node:
			if e.Location == r.Location {
				own = e.DeepCopy()
			}
			continue // rewritten below (or dropped: no longer a leader)
		case r.Leader && e.Location == r.Location:
			continue // this node took over the location
		case r.Leader && r.Locations != nil && !r.Locations[e.Location]:
			continue // the location is gone
		}
		leaders = append(leaders, e)
	}
	if f, ok := r.Peers[p.Name]; ok && r.Leader && (own != nil || len(leaders) < MaxPeerStatusLeaders) {
		e := v1alpha1.PeerLeaderStatus{
			Location:           r.Location,
			Node:               r.Node,
			Accepted:           f.Accepted,
			Applied:            f.Applied,
			Message:            truncate(f.Message, maxPeerStatusMessage),
			ObservedGeneration: p.Generation,
		}
		if own != nil {
			e.LastHandshakeTime = own.LastHandshakeTime
		}
		if !f.LastHandshake.IsZero() {
			hs := f.LastHandshake.Truncate(time.Second) // the API's precision
			if e.LastHandshakeTime == nil || !hs.Before(e.LastHandshakeTime.Add(PeerHandshakeResolution)) {
				e.LastHandshakeTime = &metav1.Time{Time: hs}
			}
		}
		leaders = append(leaders, e)
	} else if own != nil && r.Leader && !ok {
		leaders = append(leaders, *own) // nothing new to say about it
	}
	slices.SortFunc(leaders, func(a, b v1alpha1.PeerLeaderStatus) int { return cmp.Compare(a.Location, b.Location) })

	out := v1alpha1.PeerStatus{Conditions: slices.Clone(cur.Conditions)}
	if len(leaders) > 0 {
		out.Leaders = leaders
	}
	for _, e := range leaders {
		if e.LastHandshakeTime != nil && (out.LastHandshakeTime == nil || e.LastHandshakeTime.After(out.LastHandshakeTime.Time)) {
			out.LastHandshakeTime = e.LastHandshakeTime.DeepCopy()
		}
	}
	setPeerConditions(&out, p.Generation, now)
	return out, !equality.Semantic.DeepEqual(normalize(cur), normalize(out))
}

// setPeerConditions sets Accepted and Applied from the entries (none: no
// conditions). A condition's lastTransitionTime changes only with its
// status.
func setPeerConditions(s *v1alpha1.PeerStatus, generation int64, now time.Time) {
	if len(s.Leaders) == 0 {
		s.Conditions = nil
		return
	}
	now = now.Truncate(time.Second)
	var invalid []string
	applied := 0
	for _, e := range s.Leaders {
		if !e.Accepted {
			invalid = append(invalid, fmt.Sprintf("%s (node %s): %s", e.Location, e.Node, e.Message))
		}
		if e.Applied {
			applied++
		}
	}
	acc := metav1.Condition{Type: v1alpha1.PeerAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.PeerReasonValid,
		Message: fmt.Sprintf("usable on all %d reporting location leaders", len(s.Leaders)), ObservedGeneration: generation}
	if len(invalid) > 0 {
		acc.Status, acc.Reason = metav1.ConditionFalse, v1alpha1.PeerReasonInvalid
		acc.Message = truncate("not usable on "+strings.Join(invalid, "; "), 32768)
	}
	app := metav1.Condition{Type: v1alpha1.PeerApplied, Status: metav1.ConditionTrue, Reason: v1alpha1.PeerReasonApplied,
		Message: fmt.Sprintf("on the WireGuard interface of %d of %d reporting location leaders", applied, len(s.Leaders)), ObservedGeneration: generation}
	if applied == 0 {
		app.Status, app.Reason = metav1.ConditionFalse, v1alpha1.PeerReasonNotApplied
	}
	for _, c := range []metav1.Condition{acc, app} {
		c.LastTransitionTime = metav1.Time{Time: now}
		meta.SetStatusCondition(&s.Conditions, c)
	}
}

func normalize(s v1alpha1.PeerStatus) v1alpha1.PeerStatus {
	if len(s.Leaders) == 0 {
		s.Leaders = nil
	}
	if len(s.Conditions) == 0 {
		s.Conditions = nil
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// PeerStatusWriter writes this node's entry of every Peer's status from
// the latest PeerReport. Report never blocks the reconcile; Run writes in
// the background, only what changed, compared with the Peer informer's
// cache. A failed write is logged and retried with back-off (per Peer, up
// to 5 minutes); it never touches what the node applied.
type PeerStatusWriter struct {
	peers   meshdv1alpha1.PeersGetter
	store   cache.Store
	log     *slog.Logger
	timeout time.Duration
	now     func() time.Time
	limit   *rate.Limiter // all writes of this node together

	mu     sync.Mutex
	report *PeerReport
	failed map[string]bool // Peers whose last write failed (logged once)
	queue  workqueue.TypedRateLimitingInterface[string]
}

// PeerStatusOptions configure NewPeerStatusWriter.
type PeerStatusOptions struct {
	// Peers is the Peer client (Clients.Meshd.MeshdV1alpha1()); Store the
	// Peer informer's store.
	Peers meshdv1alpha1.PeersGetter
	Store cache.Store
	// Timeout bounds one write (default 10 s).
	Timeout time.Duration
	// QPS and Burst bound all status writes of this node together
	// (default 1/s, burst 10).
	QPS   float64
	Burst int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Metrics reports the write queue (workqueue_*{name="meshd_peer_status"});
	// nil: client-go's global provider.
	Metrics workqueue.MetricsProvider
	Logger  *slog.Logger
}

// NewPeerStatusWriter returns a writer; start it with Run.
func NewPeerStatusWriter(o PeerStatusOptions) *PeerStatusWriter {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.QPS <= 0 {
		o.QPS = 1
	}
	if o.Burst <= 0 {
		o.Burst = 10
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute)
	return &PeerStatusWriter{
		peers: o.Peers, store: o.Store, log: o.Logger, timeout: o.Timeout, now: o.Now,
		limit:  rate.NewLimiter(rate.Limit(o.QPS), o.Burst),
		failed: map[string]bool{},
		queue:  workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "meshd_peer_status", MetricsProvider: o.Metrics}),
	}
}

// Report hands over the findings of a reconcile and queues every Peer
// whose status would change. It does not wait for any write.
func (w *PeerStatusWriter) Report(r PeerReport) {
	w.mu.Lock()
	w.report = &r
	w.mu.Unlock()
	now := w.now()
	for _, o := range w.store.List() {
		p, ok := o.(*v1alpha1.Peer)
		if !ok {
			continue
		}
		if _, changed := PeerStatusFor(p, r, now); changed {
			w.queue.Add(p.Name)
		}
	}
}

// Run writes queued statuses until ctx ends.
func (w *PeerStatusWriter) Run(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for {
		name, shutdown := w.queue.Get()
		if shutdown {
			return nil
		}
		err := w.write(ctx, name)
		w.mu.Lock()
		switch {
		case apierrors.IsConflict(err):
			// Another leader wrote first: retry once the cache has its write.
			w.log.Debug("Peer status changed meanwhile; retrying", "peer", name)
			w.queue.AddRateLimited(name)
		case err != nil && ctx.Err() != nil:
			// Stopping.
		case err != nil:
			if !w.failed[name] {
				w.log.Warn("writing the Peer status failed; retrying with back-off (the Peer stays applied)", "peer", name, "error", err)
			} else {
				w.log.Debug("writing the Peer status failed again", "peer", name, "error", err)
			}
			w.failed[name] = true
			w.queue.AddRateLimited(name)
		case err == nil:
			if w.failed[name] {
				w.log.Info("Peer status written again", "peer", name)
				delete(w.failed, name)
			}
			w.queue.Forget(name)
		}
		w.mu.Unlock()
		w.queue.Done(name)
	}
}

// write writes one Peer's status if it differs, against the cached object
// (its resourceVersion guards against a concurrent writer: a conflict is
// retried once the cache has the newer object).
func (w *PeerStatusWriter) write(ctx context.Context, name string) error {
	w.mu.Lock()
	r := w.report
	w.mu.Unlock()
	if r == nil {
		return nil
	}
	o, exists, err := w.store.GetByKey(name)
	if err != nil || !exists {
		return nil // deleted: nothing to report
	}
	p, ok := o.(*v1alpha1.Peer)
	if !ok {
		return nil
	}
	status, changed := PeerStatusFor(p, *r, w.now())
	if !changed {
		return nil
	}
	if err := w.limit.Wait(ctx); err != nil {
		return err
	}
	p = p.DeepCopy()
	p.Status = status
	wctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	_, err = w.peers.Peers().UpdateStatus(wctx, p, metav1.UpdateOptions{FieldManager: "meshd"})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
