package clusterlink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/client/clientset/versioned"
	meshdinformers "meshd.io/meshd/pkg/k8s/client/informers/externalversions/meshd/v1alpha1"
)

// ControllerOptions configure NewController.
type ControllerOptions struct {
	// Namespace holds the link Secrets here and the heartbeat Leases in the
	// linked clusters.
	Namespace string
	// LeaseDuration and TakeoverDelay judge the linked clusters' nodes as
	// their own meshd does (their --lease-duration and --takeover-delay).
	LeaseDuration, TakeoverDelay time.Duration
	// Resync is the informers' resync period.
	Resync time.Duration
	Logger *slog.Logger
}

// Controller is the link controller (`meshd link`): the one component of a
// cluster that holds the link credentials. It watches every linked
// cluster's Nodes and Leases once (LinkWatcher, LinkLiveness) and keeps one
// ClusterLink per link Secret, named after the linked cluster: the
// agreement in its spec, the elected leaders in its status. It writes only
// what changed, never removes leaders it cannot replace by a complete
// list (a restart or an unreachable linked cluster keeps the last ones),
// and deletes a ClusterLink only when its link Secret is gone.
type Controller struct {
	log     *slog.Logger
	meshd   versioned.Interface
	links   *LinkWatcher
	live    *LinkLiveness
	objects cache.SharedIndexInformer
	wake    chan struct{}
	// writes counts the ClusterLink writes (create, update, status, delete).
	writes func()

	// settle holds one wake-up per linked cluster whose liveness is
	// settling (by ClusterLink name): every Sync while it settles resets
	// it, none stacks another.
	settleMu sync.Mutex
	settle   map[string]*time.Timer
}

// NewController returns a controller; nothing runs before Run. writes, if
// set, is called for each ClusterLink write.
func NewController(kube kubernetes.Interface, meshd versioned.Interface, o ControllerOptions, writes func()) *Controller {
	c := &Controller{log: o.Logger, meshd: meshd, wake: make(chan struct{}, 1), writes: writes, settle: map[string]*time.Timer{}}
	if c.writes == nil {
		c.writes = func() {}
	}
	c.links = NewLinkWatcher(o.Logger, kube, o.Namespace, o.Resync, c.signal)
	c.live = NewLinkLiveness(o.Logger, o.Namespace, o.LeaseDuration, o.TakeoverDelay, o.Resync, c.signal)
	c.objects = meshdinformers.NewClusterLinkInformer(meshd, o.Resync, cache.Indexers{})
	return c
}

func (c *Controller) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// wakeAfter makes the controller sync again d from now for cluster: it
// resets cluster's timer, the one there is.
func (c *Controller) wakeAfter(cluster string, d time.Duration) {
	c.settleMu.Lock()
	defer c.settleMu.Unlock()
	if t, ok := c.settle[cluster]; ok {
		t.Reset(d)
		return
	}
	c.settle[cluster] = time.AfterFunc(d, c.signal)
}

// forgetWake stops cluster's timer (the cluster is unlinked).
func (c *Controller) forgetWake(cluster string) {
	c.settleMu.Lock()
	defer c.settleMu.Unlock()
	if t, ok := c.settle[cluster]; ok {
		t.Stop()
		delete(c.settle, cluster)
	}
}

// Run keeps the ClusterLinks until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	if _, err := c.objects.AddEventHandler(cache.ResourceEventHandlerFuncs{
		// Someone else changed or deleted a ClusterLink: put it back.
		UpdateFunc: func(_, _ any) { c.signal() },
		DeleteFunc: func(any) { c.signal() },
	}); err != nil {
		return err
	}
	go c.objects.RunWithContext(ctx)
	errc := make(chan error, 2)
	go func() { errc <- c.links.Run(ctx) }()
	c.live.bind(ctx) // before the first Sync
	go func() { errc <- c.live.Run(ctx) }()
	if !cache.WaitForCacheSync(ctx.Done(), c.objects.HasSynced) {
		return ctx.Err()
	}
	tick := time.NewTicker(time.Second) // a linked cluster's liveness changes by the clock too
	defer tick.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return errors.Join(<-errc, <-errc)
		case <-c.wake:
		case <-retry.C:
		case <-tick.C:
			silent := c.live.CheckSilence()
			if !c.live.Changed() && !silent {
				continue
			}
		}
		// Let a burst of events (a resync, many nodes at once) settle.
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			continue
		}
		select {
		case <-c.wake:
		default:
		}
		if err := c.Sync(ctx); err != nil {
			c.log.Warn("writing ClusterLinks; retrying", "error", err)
			retry.Reset(2 * time.Second)
		}
	}
}

// Sync makes the ClusterLinks match the link Secrets and the linked
// clusters as last seen.
func (c *Controller) Sync(ctx context.Context) error {
	if !c.links.Listed() {
		return nil // a ClusterLink is never deleted before the Secrets are known
	}
	remotes := c.links.Snapshot()
	c.live.Sync(remotes)
	want := map[string]bool{}
	var errs []error
	for _, rc := range remotes {
		name := rc.Settings.Name
		if name == "" {
			name = strings.TrimPrefix(rc.Secret.Name, LinkSecretPrefix)
		}
		if validName(name) != nil {
			errs = append(errs, fmt.Errorf("link Secret %s: no usable cluster name", rc.Secret.Name))
			continue
		}
		want[name] = true
		errs = append(errs, c.syncOne(ctx, name, rc))
	}
	for _, o := range c.objects.GetStore().List() {
		if cl, ok := o.(*v1alpha1.ClusterLink); ok && !want[cl.Name] {
			c.writes()
			if err := c.meshd.MeshdV1alpha1().ClusterLinks().Delete(ctx, cl.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting ClusterLink %s: %w", cl.Name, err))
				continue
			}
			c.forgetWake(cl.Name)
			c.log.Info("cluster unlinked: ClusterLink deleted", "cluster", cl.Name)
		}
	}
	return errors.Join(errs...)
}

func (c *Controller) syncOne(ctx context.Context, name string, rc RemoteCluster) error {
	api := c.meshd.MeshdV1alpha1().ClusterLinks()
	spec := Spec(rc.Secret)
	var cur *v1alpha1.ClusterLink
	if o, ok, _ := c.objects.GetStore().GetByKey(name); ok {
		cur, _ = o.(*v1alpha1.ClusterLink)
	}
	var err error
	switch {
	case cur == nil:
		c.writes()
		cur, err = api.Create(ctx, &v1alpha1.ClusterLink{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "meshd-link"}}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating ClusterLink %s: %w", name, err)
		}
		c.log.Info("ClusterLink created", "cluster", name, "secret", rc.Secret.Name)
	case !sameJSON(cur.Spec, spec):
		next := cur.DeepCopy()
		next.Spec = spec
		c.writes()
		if cur, err = api.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating ClusterLink %s: %w", name, err)
		}
	}
	status, ok := c.status(cur, rc)
	if !ok {
		return nil
	}
	next := cur.DeepCopy()
	next.Status = status
	c.writes()
	if _, err := api.UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating ClusterLink %s's status: %w", name, err)
	}
	c.log.Info("ClusterLink status updated", "cluster", name, "leaders", len(status.Leaders), "liveness_known", status.LivenessKnown)
	return nil
}

// status is cur's next status, and whether it differs from cur's. The
// leaders change only from a complete list of the linked cluster's Nodes.
func (c *Controller) status(cur *v1alpha1.ClusterLink, rc RemoteCluster) (v1alpha1.ClusterLinkStatus, bool) {
	st := *cur.Status.DeepCopy()
	cond := metav1.Condition{Type: ConditionSynced, ObservedGeneration: cur.Generation}
	switch {
	case rc.Err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "InvalidLinkSecret", "the link Secret cannot be used; the last known leaders are kept"
	case !rc.Synced:
		// Not listed yet (starting, or the linked cluster unreachable): the
		// leaders stay; only the conditions may change.
		if old := meta.FindStatusCondition(st.Conditions, ConditionSynced); old != nil {
			cond = *old
		} else {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "NotListed", "the linked cluster's Nodes have not been listed yet"
		}
	default:
		judge := c.live.Judge(rc.Secret.Name)
		leaders, live, err := Leaders(rc.Settings, rc.Nodes, judge)
		if err != nil {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "TopologyError", err.Error()
			break
		}
		next := LeaderStatus(leaders, live)
		if settled, wait := c.live.Settled(rc.Secret.Name); !settled && len(st.Leaders) > 0 && !sameJSON(next, st.Leaders) &&
			(noneLive(live) || c.live.notSeenDying(rc.Secret.Name, st.Leaders, live)) {
			// Just started, or the linked cluster just answered again after
			// an outage, and not one of its nodes looks live, or none of the
			// last leaders was seen dying: every node's heartbeat failed
			// during the outage, so their Leases look stale until renewed,
			// in whatever order. Keep the last leaders until liveness rests
			// on a full lease duration (a last leader seen live and then
			// expiring, a failover, goes through at once).
			c.wakeAfter(cur.Name, wait)
			c.log.Debug("linked cluster's liveness settling; keeping its last leaders", "cluster", cur.Name, "for", wait.Round(time.Second))
		} else {
			st.Leaders, st.LivenessKnown = next, judge != nil
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "Listed", "the leaders come from a complete list of the linked cluster's Nodes"
	}
	conds := []metav1.Condition{cond}
	if ok, known := c.live.Reachable(rc.Secret.Name); known && rc.Err == nil {
		reach := metav1.Condition{Type: ConditionReachable, ObservedGeneration: cur.Generation,
			Status: metav1.ConditionTrue, Reason: "LeasesWatched", Message: "the linked cluster's API server answers"}
		if !ok {
			reach.Status, reach.Reason, reach.Message = metav1.ConditionFalse, "Unreachable", "watching the linked cluster's Leases fails; its last known leaders are kept"
		}
		conds = append(conds, reach)
	}
	for _, cd := range conds {
		if old := meta.FindStatusCondition(st.Conditions, cd.Type); old != nil && old.Status == cd.Status {
			cd.LastTransitionTime = old.LastTransitionTime
		}
		meta.SetStatusCondition(&st.Conditions, cd)
	}
	return st, !sameJSON(normalStatus(st), normalStatus(cur.Status))
}

// noneLive: liveness is known (live is not nil) and no node is live.
func noneLive(live map[string]bool) bool {
	if live == nil {
		return false
	}
	for _, l := range live {
		if l {
			return false
		}
	}
	return true
}

// sameJSON compares two API values as the API server stores them (times in
// seconds and UTC, empty lists omitted).
func sameJSON(a, b any) bool {
	ja, erra := json.Marshal(a)
	jb, errb := json.Marshal(b)
	return erra == nil && errb == nil && bytes.Equal(ja, jb)
}

// normalStatus drops the condition times for the comparison.
func normalStatus(s v1alpha1.ClusterLinkStatus) v1alpha1.ClusterLinkStatus {
	s = *s.DeepCopy()
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	return s
}
