package liveness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"meshd.io/meshd/pkg/k8s/convert"
)

// Heartbeat Lease naming and labels.
const (
	// DefaultNamespace is where the heartbeat Leases live by default.
	DefaultNamespace = "meshd-system"
	// LeasePrefix prefixes a node's Lease name: meshd-<node>.
	LeasePrefix = "meshd-"
	// LabelNode labels a heartbeat Lease with its node's name.
	LabelNode = convert.AnnotationPrefix + "node"
	// LabelCandidate ("true") marks the heartbeat Lease of a leader
	// candidate (mesh.Candidates). Nodes watch the Leases so labelled (and
	// their own), not every node's; the label only narrows the watch: who
	// is a candidate every node computes from the Nodes itself.
	LabelCandidate = convert.AnnotationPrefix + "candidate"
	// LabelManagedBy/ManagedBy mark the objects meshd creates.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "meshd"
	// DefaultHeartbeatInterval is used when RunHeartbeat gets interval <= 0.
	DefaultHeartbeatInterval = 10 * time.Second
)

// LeaseName is the name of node's heartbeat Lease.
func LeaseName(node string) string { return LeasePrefix + node }

// NodeNameFromLease returns the node a heartbeat Lease belongs to, from its
// name; ok is false for a Lease that is not a meshd heartbeat. A heartbeat
// is held by its node (holderIdentity, set by every renewal): another Lease
// that happens to be named meshd-<something> in the namespace, such as the
// leader Lease of `meshd link` (meshd-link) or `meshd mirror`
// (meshd-mirror), held by a pod or released (""), is no node's heartbeat,
// so its renewals never make a node of that name look live.
func NodeNameFromLease(l *coordinationv1.Lease) (node string, ok bool) {
	if l == nil || !strings.HasPrefix(l.Name, LeasePrefix) || len(l.Name) == len(LeasePrefix) {
		return "", false
	}
	node = strings.TrimPrefix(l.Name, LeasePrefix)
	if !heldBy(l, node) {
		return "", false
	}
	return node, true
}

// heldBy reports whether l may be node's heartbeat: held by node, or by
// no one named at all.
func heldBy(l *coordinationv1.Lease, node string) bool {
	return l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == node
}

// IsHeartbeat reports whether l is a node's heartbeat Lease (NodeNameFromLease),
// for components whose own Lease might carry a heartbeat's name.
func IsHeartbeat(l *coordinationv1.Lease) bool {
	_, ok := NodeNameFromLease(l)
	return ok
}

// RunHeartbeat keeps node's Lease meshd-<node> in namespace (default
// meshd-system) renewed every interval until ctx ends, then returns nil. The
// Lease is created when missing; holderIdentity is the node and
// leaseDurationSeconds four intervals. Failures are logged and retried at
// the next interval; a missing namespace is reported as such (creating it is
// the manifests' job), and a Lease deleted by someone else is created again
// at the next interval. Other nodes judge liveness from when they observe
// the Lease change (see Liveness), so the renew times need not agree with
// their clocks.
func RunHeartbeat(ctx context.Context, c kubernetes.Interface, namespace, nodeName string, interval time.Duration, log *slog.Logger) error {
	return RunHeartbeatWith(ctx, c, HeartbeatOptions{Namespace: namespace, Node: nodeName, Interval: interval, Logger: log})
}

// HeartbeatOptions configure RunHeartbeatWith.
type HeartbeatOptions struct {
	Namespace, Node string
	Interval        time.Duration
	Logger          *slog.Logger
	// Report, when set, is this node's data-plane probe report, published
	// on the Lease (AnnotationProbeUp/Down) with every renewal.
	Report func() Report
	// Candidate, when set, says whether this node is one of its location's
	// leader candidates (mesh.Candidates), published as LabelCandidate with
	// every renewal; while known is false the Lease keeps what it has.
	Candidate func() (candidate, known bool)
	// Trigger asks for a write now (the report or the candidacy changed);
	// writes it causes are at least MinGap apart (default 200 ms), and
	// only happen when the Lease would change. A renewal due at the
	// interval is written as always: at idle the write rate stays one per
	// interval.
	Trigger <-chan struct{}
	MinGap  time.Duration
	// Result, when set, is called after every write attempt with its error
	// (nil: the API server took it). Liveness.SetAPIReachable uses it.
	Result func(error)
}

// RunHeartbeatWith is RunHeartbeat with a probe report and write triggers.
// Every write is bounded by the interval, so a hung API server shows as a
// failed renewal, not as a stuck heartbeat.
func RunHeartbeatWith(ctx context.Context, c kubernetes.Interface, o HeartbeatOptions) error {
	if o.Node == "" {
		return errors.New("running the heartbeat: empty node name")
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.Interval <= 0 {
		o.Interval = DefaultHeartbeatInterval
	}
	if o.MinGap <= 0 {
		o.MinGap = 200 * time.Millisecond
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	namespace := o.Namespace
	log = log.With("lease", namespace+"/"+LeaseName(o.Node))
	h := &heartbeat{c: c, namespace: namespace, node: o.Node, interval: o.Interval, report: o.Report, candidate: o.Candidate}
	t := time.NewTimer(o.Interval)
	defer t.Stop()
	failing := false
	var last time.Time
	for {
		wctx, cancel := context.WithTimeout(ctx, o.Interval)
		err := h.renew(wctx, time.Now())
		cancel()
		last = time.Now()
		if ctx.Err() != nil {
			return nil
		}
		if o.Result != nil {
			if errors.Is(err, errLeaseNotOurs) {
				o.Result(nil) // the API server answered
			} else {
				o.Result(err)
			}
		}
		if err != nil {
			failing = true
			logRenewalFailure(log, err, namespace, o.Interval)
		} else if failing {
			failing = false
			log.Info("heartbeat Lease renewed again")
		}
		if !h.waitNext(ctx, t, last, o) {
			return nil
		}
	}
}

// logRenewalFailure says what a failed renewal means for this node.
func logRenewalFailure(log *slog.Logger, err error, namespace string, interval time.Duration) {
	switch {
	case errors.Is(err, errNamespaceMissing):
		log.Error("cannot create the heartbeat Lease: its namespace is missing (it is created by the meshd manifests); other nodes will judge this node dead; retrying",
			"namespace", namespace, "retry", interval, "error", err)
	case errors.Is(err, errLeaseNotOurs):
		log.Error("this node's heartbeat Lease name is taken by another component's Lease, left alone; other nodes will judge this node dead: "+
			"give that component another Lease name (meshd link and meshd mirror: --lease-name); retrying",
			"retry", interval, "error", err)
	case errors.Is(err, errLeaseDeleted):
		log.Warn("the heartbeat Lease was deleted (not by this meshd); creating it again at the next renewal",
			"retry", interval, "error", err)
	default:
		log.Error("renewing the heartbeat Lease failed; retrying", "retry", interval, "error", err)
	}
}

// waitNext waits until the next write is due: the interval after last, or
// a trigger with something new to publish (at least MinGap after last). It
// returns false when ctx ends.
func (h *heartbeat) waitNext(ctx context.Context, t *time.Timer, last time.Time, o HeartbeatOptions) bool {
	for {
		t.Reset(time.Until(last.Add(o.Interval)))
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-o.Trigger:
			t.Stop()
			if gap := time.Until(last.Add(o.MinGap)); gap > 0 {
				select {
				case <-ctx.Done():
					return false
				case <-time.After(gap):
				}
			}
			if h.lease == nil || !h.published() {
				return true
			}
			// Nothing new to say: keep the interval.
		}
	}
}

// published reports whether the last written Lease already carries what
// this node publishes now (its labels and annotations).
func (h *heartbeat) published() bool {
	b := h.build(h.lease.DeepCopy(), time.Time{})
	return maps.Equal(b.Labels, h.lease.Labels) && maps.Equal(b.Annotations, h.lease.Annotations)
}

type heartbeat struct {
	c         kubernetes.Interface
	namespace string
	node      string
	interval  time.Duration
	report    func() Report         // nil: no probe report
	candidate func() (bool, bool)   // nil: no candidacy label
	lease     *coordinationv1.Lease // last written, nil when unknown
}

func (h *heartbeat) durationSeconds() int32 {
	s := math.Ceil((4 * h.interval).Seconds())
	return int32(min(max(s, 1), math.MaxInt32))
}

// What a failed renewal found missing: only a NotFound from the Create
// (after a NotFound from the Get) means the namespace is missing; one from
// the Update means the Lease was deleted since the last write.
var (
	errNamespaceMissing = errors.New("namespace missing")
	errLeaseDeleted     = errors.New("deleted since the last renewal")
	// errLeaseNotOurs: a Lease of this name exists and is held by someone
	// else (another component's Lease of the same name); it is left alone.
	errLeaseNotOurs = errors.New("held by another component")
)

// renew writes a fresh renewTime, creating the Lease if needed. A failure
// wraps errNamespaceMissing or errLeaseDeleted when it is one of those.
func (h *heartbeat) renew(ctx context.Context, now time.Time) error {
	leases := h.c.CoordinationV1().Leases(h.namespace)
	name := LeaseName(h.node)
	if h.lease == nil {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created, err := leases.Create(ctx, h.build(&coordinationv1.Lease{}, now), metav1.CreateOptions{FieldManager: convert.FieldManager})
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("creating Lease %s/%s: %w: %w", h.namespace, name, errNamespaceMissing, err)
			}
			if err != nil {
				return fmt.Errorf("creating Lease %s/%s: %w", h.namespace, name, err)
			}
			h.lease = created
			return nil
		case err != nil:
			return fmt.Errorf("reading Lease %s/%s: %w", h.namespace, name, err)
		}
		if !heldBy(l, h.node) {
			return fmt.Errorf("lease %s/%s is held by %q, not by node %s: %w", h.namespace, name, *l.Spec.HolderIdentity, h.node, errLeaseNotOurs)
		}
		h.lease = l
	}
	updated, err := leases.Update(ctx, h.build(h.lease.DeepCopy(), now), metav1.UpdateOptions{FieldManager: convert.FieldManager})
	if err != nil {
		h.lease = nil // re-read next time (conflict, deleted, ...)
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("renewing Lease %s/%s: %w: %w", h.namespace, name, errLeaseDeleted, err)
		}
		return fmt.Errorf("renewing Lease %s/%s: %w", h.namespace, name, err)
	}
	h.lease = updated
	return nil
}

// build fills l with this node's heartbeat.
func (h *heartbeat) build(l *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	l.Name = LeaseName(h.node)
	l.Namespace = h.namespace
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	// A label value has at most 63 characters, a node name up to 253:
	// the label only helps people find the Lease (nothing selects by it),
	// so a longer name goes without it rather than fail every renewal.
	if len(validation.IsValidLabelValue(h.node)) == 0 {
		l.Labels[LabelNode] = h.node
	} else {
		delete(l.Labels, LabelNode)
	}
	l.Labels[LabelManagedBy] = ManagedBy
	holder := h.node
	dur := h.durationSeconds()
	mt := metav1.NewMicroTime(now)
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != holder {
		l.Spec.AcquireTime = &mt
	}
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = &dur
	l.Spec.RenewTime = &mt
	if h.report != nil {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		for k, v := range ReportAnnotations(h.report()) {
			if v == "" {
				delete(l.Annotations, k)
			} else {
				l.Annotations[k] = v
			}
		}
	}
	if h.candidate != nil {
		if c, known := h.candidate(); known && c {
			l.Labels[LabelCandidate] = "true"
		} else if known {
			delete(l.Labels, LabelCandidate)
		}
	}
	return l
}
