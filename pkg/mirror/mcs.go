package mirror

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// ServiceImportGVR is the MCS API's ServiceImport, in the stored version.
var ServiceImportGVR = schema.GroupVersionResource{Group: mcsv1beta1.GroupName, Version: "v1beta1", Resource: "serviceimports"}

// EventReasonMCSCRDsMissing is the reason of the Warning Event (on the
// --namespace Namespace) saying the MCS CRDs are not installed.
const (
	EventReasonMCSCRDsMissing = "MCSCRDsMissing"
	// EventReasonImportNotOwned: a ServiceImport meshd would write exists
	// and another controller wrote it.
	EventReasonImportNotOwned = "ServiceImportNotOwned"
	indexImport               = "import" // local slices and derived Services by namespace/service-name
	crdRecheck                = 30 * time.Second
)

// ClusterHealth tells whether the data plane (the WireGuard tunnel) reaches
// a source cluster. Reachable's known is false when there is no data on the
// cluster; its endpoints then follow the remote API alone. LeaseHealth reads
// it from the meshd node heartbeat Leases; a per-cluster link CRD can
// implement it too.
type ClusterHealth interface {
	Reachable(cluster string) (up, known bool)
}

// mcsController writes the MCS API objects of the local cluster:
// ServiceImports, their derived Services and EndpointSlices, and the status
// of the local ServiceExports.
type mcsController struct {
	c         *Controller
	dyn       dynamic.Interface
	clusterID string
	queue     workqueue.TypedRateLimitingInterface[types.NamespacedName]
	self      *remote
	imports   cache.SharedIndexInformer
	running   atomic.Bool

	mu          sync.Mutex
	notOwned    map[types.NamespacedName]types.UID
	exportConds map[types.NamespacedName][]metav1.Condition
	endpoints   map[types.NamespacedName]map[string]int
	importSet   map[types.NamespacedName]bool
}

func newMCS(c *Controller) *mcsController {
	m := &mcsController{
		c: c, dyn: c.opts.LocalDynamic, clusterID: c.opts.ClusterID,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "mcs"}),
		notOwned:    map[types.NamespacedName]types.UID{},
		exportConds: map[types.NamespacedName][]metav1.Condition{},
		endpoints:   map[types.NamespacedName]map[string]int{},
		importSet:   map[types.NamespacedName]bool{},
	}
	m.self = &remote{Remote: Remote{Name: c.opts.ClusterID, Kube: c.local, Dynamic: c.opts.LocalDynamic}, self: true, clusterID: c.opts.ClusterID}
	return m
}

func (m *mcsController) enqueue(ns, name string) {
	if m != nil && name != "" && m.running.Load() {
		m.queue.Add(types.NamespacedName{Namespace: ns, Name: name})
	}
}

// enqueueAll queues every export of every source and every local import
// (namespace "" for all).
func (m *mcsController) enqueueAll(namespace string) {
	if m == nil || !m.running.Load() {
		return
	}
	for _, r := range m.allSources() {
		if r.exports == nil {
			continue
		}
		for _, key := range r.exports.GetStore().ListKeys() {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			if namespace == "" || ns == namespace {
				m.enqueue(ns, name)
			}
		}
	}
	for _, key := range m.imports.GetStore().ListKeys() {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		if namespace == "" || ns == namespace {
			m.enqueue(ns, name)
		}
	}
}

// enqueueSource queues the exports of one source cluster (by link name).
func (m *mcsController) enqueueSource(r *remote) {
	if m == nil || !m.running.Load() || r.exports == nil {
		return
	}
	if !r.synced.Load() {
		// What it exports is not known yet: the local imports may list it.
		for _, key := range m.imports.GetStore().ListKeys() {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			m.enqueue(ns, name)
		}
		return
	}
	for _, key := range r.exports.GetStore().ListKeys() {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		m.enqueue(ns, name)
	}
}

// enqueueOwned queues the import a local derived Service or slice belongs to.
func (m *mcsController) enqueueOwned(o any) {
	if m == nil {
		return
	}
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if mo, ok := o.(metav1.Object); ok {
		if name := mo.GetLabels()[LabelServiceName]; name != "" && mo.GetLabels()[liveness.LabelManagedBy] == liveness.ManagedBy {
			m.enqueue(mo.GetNamespace(), name)
		}
	}
}

func (m *mcsController) allSources() []*remote {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	out := []*remote{m.self}
	for _, n := range slices.Sorted(maps.Keys(m.c.remotes)) {
		out = append(out, m.c.remotes[n])
	}
	return out
}

// run waits for the MCS CRDs (saying so, in a log line and an Event, while
// they are missing), then starts the local export and import informers and
// the workers.
func (m *mcsController) run(ctx context.Context) {
	c := m.c
	warned := false
	for !served(c.local, ServiceImportGVR) || !served(c.local, ServiceExportGVR) {
		if !warned {
			msg := "the Multi-Cluster Services CRDs (serviceexports and serviceimports.multicluster.x-k8s.io, v1beta1) are not installed in this cluster: " +
				"no ServiceImports or ServiceExport status until they are; install manifests/components/mcs-crds if no other MCS implementation provides them (docs/mcs.md)"
			c.log.Error(msg, "recheck", crdRecheck)
			if c.recorder != nil && c.opts.EventNamespace != "" {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.opts.EventNamespace}}
				if got, err := c.local.CoreV1().Namespaces().Get(ctx, c.opts.EventNamespace, metav1.GetOptions{}); err == nil {
					ns = got
				}
				c.recorder.Event(ns, corev1.EventTypeWarning, EventReasonMCSCRDsMissing, msg)
			}
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(crdRecheck):
		}
	}
	if warned {
		c.log.Info("the Multi-Cluster Services CRDs are installed now")
	}
	defer m.queue.ShutDown()
	m.imports = dynamicinformer.NewFilteredDynamicInformer(m.dyn, ServiceImportGVR, "", c.opts.Resync, cache.Indexers{}, nil).Informer()
	_ = m.imports.SetTransform(convert.DropManagedFields) // not started: cannot fail
	byImport := func(o any) {
		ns, name := namespaceName(o)
		m.enqueue(ns, name)
	}
	_, _ = m.imports.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: byImport, UpdateFunc: func(_, o any) { byImport(o) }, DeleteFunc: byImport,
	})
	go m.imports.RunWithContext(ctx)
	c.startRemote(ctx, m.self)
	if !cache.WaitForCacheSync(ctx.Done(), m.imports.HasSynced, m.self.synced.Load) {
		return
	}
	m.running.Store(true)
	c.log.Info("writing Multi-Cluster Services objects", "clusterID", m.clusterID)
	m.enqueueAll("")
	var wg sync.WaitGroup
	for range c.opts.Workers {
		wg.Go(func() {
			for m.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	m.queue.ShutDown()
	wg.Wait()
}

func (m *mcsController) processNext(ctx context.Context) bool {
	nn, quit := m.queue.Get()
	if quit {
		return false
	}
	defer m.queue.Done(nn)
	if err := m.sync(ctx, nn); err != nil {
		m.c.metrics.errors.WithLabelValues(m.clusterID).Inc()
		m.c.log.Warn("MCS sync failed; retrying", "service", nn.String(), "retries", m.queue.NumRequeues(nn), "error", err)
		m.queue.AddRateLimited(nn)
		return true
	}
	m.queue.Forget(nn)
	return true
}

// complete: every source cluster is known and synced, so what is missing
// from them is really gone and may be deleted. Until then (a restart, a
// new leader, a link not synced yet) meshd only creates and updates.
func (m *mcsController) complete(sources []*remote) bool {
	if !m.c.opts.StaticRemotes && !m.c.allKnown.Load() {
		return false
	}
	for _, r := range sources {
		if !r.started || !r.synced.Load() {
			return false
		}
	}
	return true
}

func (m *mcsController) sync(ctx context.Context, nn types.NamespacedName) error {
	c := m.c
	sources := m.allSources()
	complete := m.complete(sources)
	var cs []constituent
	seen := map[string]bool{}
	var selfExport *unstructured.Unstructured
	var selfSvc *corev1.Service
	for _, r := range sources {
		if !r.started || !r.synced.Load() {
			continue
		}
		seen[r.clusterID] = true
		ex := r.export(nn.Namespace, nn.Name)
		if ex == nil {
			continue
		}
		svc := r.service(nn.Namespace, nn.Name)
		if r.self {
			selfExport, selfSvc = ex, svc
		}
		if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		labels, _, _ := unstructured.NestedStringMap(ex.Object, "spec", "exportedLabels")
		annotations, _, _ := unstructured.NestedStringMap(ex.Object, "spec", "exportedAnnotations")
		cs = append(cs, constituent{
			cluster: r.clusterID, created: ex.GetCreationTimestamp().Time, svc: svc,
			labels: labels, annotations: annotations,
			slices: r.endpointSlices(nn.Namespace, nn.Name), notReady: !r.self && m.notReady(r),
			deadNode: r.nodeDead,
		})
	}
	if !complete {
		// The import lists a cluster not synced yet (a restart, a new
		// leader): a partial view would change its ports, type or slices.
		// Wait for the resync, which queues every key again.
		if si, err := m.localImport(nn); err == nil && si != nil && ownsImport(si) {
			for _, cl := range si.Status.Clusters {
				if !seen[cl.Cluster] {
					return m.markUnsyncedNotReady(ctx, nn, sources, seen)
				}
			}
		}
	}
	mg := mergeExports(cs)
	_, nsExists, _ := c.nss.GetIndexer().GetByKey(nn.Namespace)
	var importErr error
	switch {
	case len(cs) == 0 && !complete:
		// Maybe exported by a cluster not synced yet: keep what is there.
	case len(cs) == 0 || !nsExists:
		importErr = m.deleteImport(ctx, nn, complete)
	default:
		importErr = m.applyImport(ctx, nn, mg, cs, seen, complete)
	}
	statusErr := m.writeExportStatus(ctx, nn, selfExport, selfSvc, mg, importErr)
	if errors.Is(importErr, errImportNotOwned) {
		importErr = nil // said in an Event and the export's status; retried when the import changes
	}
	return errors.Join(importErr, statusErr)
}

// errImportNotOwned: the ServiceImport exists and another controller wrote
// it; meshd imports nothing of it in this cluster.
var errImportNotOwned = errors.New("the ServiceImport in this cluster exists and is not meshd's (it lacks the label " +
	liveness.LabelManagedBy + "=" + liveness.ManagedBy + "; another MCS controller?): meshd imports nothing of it here")

// markUnsyncedNotReady sets not ready the endpoints of the import nn that
// came from source clusters not synced since this process started, once
// every such cluster has been unreachable for longer than the grace period
// (a restart during a source's outage: its slices are kept, and would
// otherwise stay ready until it answers again). Their cluster IDs are not
// known before they sync, so their slices are the ones of no synced source;
// while one unsynced cluster is still inside the grace period, or a link is
// not known yet, nothing is touched.
func (m *mcsController) markUnsyncedNotReady(ctx context.Context, nn types.NamespacedName, sources []*remote, seen map[string]bool) error {
	if !m.c.opts.StaticRemotes && !m.c.allKnown.Load() {
		return nil
	}
	for _, r := range sources {
		if !r.self && (!r.started || !r.synced.Load()) && !r.isExpired() {
			return nil
		}
	}
	var errs []error
	for _, sl := range m.importSlices(nn) {
		if seen[sl.Labels[LabelSourceCluster]] {
			continue
		}
		if _, err := m.c.setSliceNotReady(ctx, sl); err != nil {
			errs = append(errs, fmt.Errorf("%w (cluster %s unreachable past the grace period)", err, sl.Labels[LabelSourceCluster]))
		}
	}
	return errors.Join(errs...)
}

// notReady: the data plane says the cluster is unreachable, or its API has
// not answered for longer than the grace period.
func (m *mcsController) notReady(r *remote) bool {
	return r.isExpired() || m.c.tunnelDown(r)
}

func (m *mcsController) localImport(nn types.NamespacedName) (*mcsv1beta1.ServiceImport, error) {
	o, ok, _ := m.imports.GetIndexer().GetByKey(nn.String())
	if !ok {
		return nil, nil
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	var si mcsv1beta1.ServiceImport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
		return nil, fmt.Errorf("reading ServiceImport %s: %w", nn, err)
	}
	return &si, nil
}

func ownsImport(si *mcsv1beta1.ServiceImport) bool {
	return si.Labels[liveness.LabelManagedBy] == liveness.ManagedBy
}

// importSlices are the local slices meshd wrote for the import nn.
func (m *mcsController) importSlices(nn types.NamespacedName) []*discoveryv1.EndpointSlice {
	objs, _ := m.c.slices.GetIndexer().ByIndex(indexImport, nn.String())
	var out []*discoveryv1.EndpointSlice
	for _, o := range objs {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok && sl.Labels[liveness.LabelManagedBy] == liveness.ManagedBy && sl.Labels[LabelSourceCluster] != "" {
			out = append(out, sl)
		}
	}
	return out
}

func importIndex(o any) ([]string, error) {
	mo, ok := o.(metav1.Object)
	if !ok {
		return nil, nil
	}
	if name := mo.GetLabels()[LabelServiceName]; name != "" {
		return []string{mo.GetNamespace() + "/" + name}, nil
	}
	return nil, nil
}

func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: u}, nil
}

// applyImport writes the ServiceImport nn, its derived Service (ClusterSetIP)
// and its EndpointSlices.
func (m *mcsController) applyImport(ctx context.Context, nn types.NamespacedName, mg merged, cs []constituent, seen map[string]bool, complete bool) error {
	c := m.c
	api := m.dyn.Resource(ServiceImportGVR).Namespace(nn.Namespace)
	si, err := m.localImport(nn)
	if err != nil {
		return err
	}
	if si != nil && !ownsImport(si) {
		m.reportNotOwned(nn, si)
		return errImportNotOwned
	}
	derived := ""
	if mg.spec.Type == mcsv1beta1.ClusterSetIP {
		derived = derivedServiceName(nn)
	}
	want := mcsv1beta1.ServiceImport{
		TypeMeta:   metav1.TypeMeta{APIVersion: ServiceImportGVR.GroupVersion().String(), Kind: mcsv1beta1.ServiceImportKindName},
		ObjectMeta: metav1.ObjectMeta{Name: nn.Name, Namespace: nn.Namespace, Labels: map[string]string{liveness.LabelManagedBy: liveness.ManagedBy}},
		Spec:       mg.spec,
	}
	// The oldest export's exportedLabels and exportedAnnotations; meshd's
	// own keys win.
	want.Labels = maps.Clone(mg.labels)
	if want.Labels == nil {
		want.Labels = map[string]string{}
	}
	want.Labels[liveness.LabelManagedBy] = liveness.ManagedBy
	want.Annotations = maps.Clone(mg.annotations)
	if derived != "" {
		if want.Annotations == nil {
			want.Annotations = map[string]string{}
		}
		want.Annotations[AnnotationDerivedService] = derived
		if si != nil && si.Spec.Type == mcsv1beta1.ClusterSetIP {
			want.Spec.IPs = si.Spec.IPs // filled in from the derived Service below
		}
	}
	if si == nil {
		u, err := toUnstructured(&want)
		if err != nil {
			return err
		}
		created, err := api.Create(ctx, u, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating ServiceImport %s: %w", nn, err)
		}
		si = &mcsv1beta1.ServiceImport{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(created.Object, si); err != nil {
			return err
		}
		c.log.Info("created ServiceImport", "service", nn.String(), "type", want.Spec.Type, "clusters", len(cs))
	}
	owner := metav1.OwnerReference{APIVersion: ServiceImportGVR.GroupVersion().String(), Kind: mcsv1beta1.ServiceImportKindName, Name: si.Name, UID: si.UID, Controller: ptr(true)}

	// The derived Service: created for ClusterSetIP, deleted otherwise.
	var ips []string
	dname := derivedServiceName(nn)
	existing := c.localService(nn.Namespace, dname)
	if existing != nil && existing.Labels[liveness.LabelManagedBy] != liveness.ManagedBy {
		return fmt.Errorf("service %s/%s (the derived Service of ServiceImport %s) exists and is not meshd's: left untouched", nn.Namespace, dname, nn)
	}
	if derived == "" {
		if existing != nil {
			if err := m.deleteService(ctx, existing); err != nil {
				return err
			}
		}
	} else {
		svc, err := m.applyDerived(ctx, nn, existing, owner, &mg.spec)
		if err != nil {
			return err
		}
		ips = svc.Spec.ClusterIPs
		if len(ips) == 0 && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone {
			ips = []string{svc.Spec.ClusterIP}
		}
		// Only the families some cluster serves: a derived Service stays
		// dual-stack when the last dual-stack export goes.
		ips = slices.DeleteFunc(slices.Clone(ips), func(ip string) bool {
			at, ok := addressType(ip)
			return ok && !slices.Contains(mg.spec.IPFamilies, familyOf(at))
		})
	}
	want.Spec.IPs = ips

	// The spec and metadata.
	if !equality.Semantic.DeepEqual(si.Spec, want.Spec) || !maps.Equal(si.Labels, want.Labels) || !maps.Equal(si.Annotations, want.Annotations) {
		upd := si.DeepCopy()
		upd.Spec = want.Spec
		upd.Labels, upd.Annotations = want.Labels, want.Annotations
		upd.TypeMeta = want.TypeMeta
		u, err := toUnstructured(upd)
		if err != nil {
			return err
		}
		got, err := api.Update(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("updating ServiceImport %s: %w", nn, err)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, si); err != nil {
			return err
		}
	}

	// The slices.
	if err := m.applySlices(ctx, nn, owner, desiredImportSlices(nn, m.clusterID, derived, cs), seen, complete); err != nil {
		return err
	}

	// The status: the exporting clusters.
	var clusters []mcsv1beta1.ClusterStatus
	for _, cst := range cs {
		clusters = append(clusters, mcsv1beta1.ClusterStatus{Cluster: cst.cluster})
	}
	if !complete {
		// Clusters not synced yet keep their place until they are.
		for _, cl := range si.Status.Clusters {
			if !seen[cl.Cluster] {
				clusters = append(clusters, cl)
			}
		}
	}
	sort.Slice(clusters, func(i, j int) bool { return clusters[i].Cluster < clusters[j].Cluster })
	status := si.Status.DeepCopy()
	status.Clusters = clusters
	status.EndpointSliceObjects = mcsv1beta1.EndpointSliceObjectsPresent
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: string(mcsv1beta1.ServiceImportConditionReady), Status: metav1.ConditionTrue,
		Reason: string(mcsv1beta1.ServiceImportReasonReady), Message: fmt.Sprintf("imported from %d cluster(s)", len(cs)),
		ObservedGeneration: si.Generation,
	})
	if !equality.Semantic.DeepEqual(&si.Status, status) {
		upd := si.DeepCopy()
		upd.Status = *status
		upd.TypeMeta = want.TypeMeta
		u, err := toUnstructured(upd)
		if err != nil {
			return err
		}
		if _, err := api.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating the status of ServiceImport %s: %w", nn, err)
		}
	}
	m.mu.Lock()
	m.importSet[nn] = true
	m.mu.Unlock()
	m.updateMetrics()
	return nil
}

func (m *mcsController) reportNotOwned(nn types.NamespacedName, si *mcsv1beta1.ServiceImport) {
	m.mu.Lock()
	reported := m.notOwned[nn] == si.UID
	m.notOwned[nn] = si.UID
	m.mu.Unlock()
	if reported {
		return
	}
	m.c.log.Warn("not writing ServiceImport: it exists and meshd did not create it (another MCS controller?); left untouched", "service", nn.String())
	if m.c.recorder != nil {
		u, err := toUnstructured(si)
		if err == nil {
			u.SetAPIVersion(ServiceImportGVR.GroupVersion().String())
			u.SetKind(mcsv1beta1.ServiceImportKindName)
			m.c.recorder.Event(u, corev1.EventTypeWarning, EventReasonImportNotOwned,
				"meshd does not write this ServiceImport: it lacks the label "+liveness.LabelManagedBy+"="+liveness.ManagedBy+" (another MCS controller wrote it)")
		}
	}
}

func (m *mcsController) applyDerived(ctx context.Context, nn types.NamespacedName, existing *corev1.Service, owner metav1.OwnerReference, spec *mcsv1beta1.ServiceImportSpec) (*corev1.Service, error) {
	c := m.c
	want := desiredDerivedService(nn, spec)
	want.OwnerReferences = []metav1.OwnerReference{owner}
	api := c.local.CoreV1().Services(nn.Namespace)
	if existing == nil {
		created, err := api.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			existing, err = api.Get(ctx, want.Name, metav1.GetOptions{})
			if err == nil && existing.Labels[liveness.LabelManagedBy] != liveness.ManagedBy {
				return nil, fmt.Errorf("service %s/%s exists and is not meshd's", nn.Namespace, want.Name)
			}
		} else if err == nil {
			c.log.Info("created derived Service", "service", nn.String(), "derived", want.Name, "clusterIPs", created.Spec.ClusterIPs)
			return created, nil
		}
		if err != nil {
			return nil, fmt.Errorf("creating derived Service %s/%s: %w", nn.Namespace, want.Name, err)
		}
	}
	if derivedUpToDate(existing, want) && !growsDualStack(existing, spec.IPFamilies) && len(existing.OwnerReferences) == 1 && existing.OwnerReferences[0].UID == owner.UID {
		return existing, nil
	}
	u := existing.DeepCopy()
	mergeMeta(&u.ObjectMeta, &want.ObjectMeta)
	u.OwnerReferences = want.OwnerReferences
	u.Spec.Selector = nil
	u.Spec.Ports = want.Spec.Ports
	u.Spec.SessionAffinity = want.Spec.SessionAffinity
	u.Spec.SessionAffinityConfig = want.Spec.SessionAffinityConfig
	if want.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		u.Spec.SessionAffinityConfig = nil
	}
	u.Spec.InternalTrafficPolicy = want.Spec.InternalTrafficPolicy
	u.Spec.TrafficDistribution = want.Spec.TrafficDistribution
	if growsDualStack(existing, spec.IPFamilies) {
		u.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicyPreferDualStack)
	}
	updated, err := api.Update(ctx, u, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("updating derived Service %s/%s: %w", nn.Namespace, want.Name, err)
	}
	return updated, nil
}

func (m *mcsController) deleteService(ctx context.Context, s *corev1.Service) error {
	uid := s.UID
	err := m.c.local.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting derived Service %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}

// applySlices makes the import's slices equal to want. Slices of a source
// cluster that is not synced (or not known) are kept until complete.
func (m *mcsController) applySlices(ctx context.Context, nn types.NamespacedName, owner metav1.OwnerReference, want []*discoveryv1.EndpointSlice, seen map[string]bool, complete bool) error {
	c := m.c
	api := c.local.DiscoveryV1().EndpointSlices(nn.Namespace)
	have := map[string]*discoveryv1.EndpointSlice{}
	for _, sl := range m.importSlices(nn) {
		have[sl.Name] = sl
	}
	var errs []error
	counts := map[string]int{}
	for _, w := range want {
		w.OwnerReferences = []metav1.OwnerReference{owner}
		counts[w.Labels[LabelSourceCluster]] += len(w.Endpoints)
		h := have[w.Name]
		delete(have, w.Name)
		if h != nil && h.AddressType != w.AddressType {
			if err := c.deleteSlice(ctx, h); err != nil {
				errs = append(errs, err)
				continue
			}
			h = nil
		}
		if h == nil {
			if _, err := api.Create(ctx, w, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				errs = append(errs, fmt.Errorf("creating EndpointSlice %s/%s: %w", w.Namespace, w.Name, err))
			} else if apierrors.IsAlreadyExists(err) {
				errs = append(errs, fmt.Errorf("creating EndpointSlice %s/%s: the cache is behind; retrying", w.Namespace, w.Name))
			}
			continue
		}
		if importSliceUpToDate(h, w) && len(h.OwnerReferences) == 1 && h.OwnerReferences[0].UID == owner.UID {
			continue
		}
		u := h.DeepCopy()
		mergeMeta(&u.ObjectMeta, &w.ObjectMeta)
		if _, ok := w.Labels[discoveryv1.LabelServiceName]; !ok {
			delete(u.Labels, discoveryv1.LabelServiceName)
		}
		u.OwnerReferences, u.Ports, u.Endpoints = w.OwnerReferences, w.Ports, w.Endpoints
		if _, err := api.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("updating EndpointSlice %s/%s: %w", u.Namespace, u.Name, err))
		}
	}
	for _, h := range have {
		if !complete && !seen[h.Labels[LabelSourceCluster]] {
			continue // a source not synced yet: never delete before the resync
		}
		if err := c.deleteSlice(ctx, h); err != nil {
			errs = append(errs, err)
		}
	}
	m.mu.Lock()
	m.endpoints[nn] = counts
	m.mu.Unlock()
	return errors.Join(errs...)
}

// deleteImport deletes meshd's ServiceImport nn, its derived Service and its
// slices (explicitly: without a garbage collector they would stay).
func (m *mcsController) deleteImport(ctx context.Context, nn types.NamespacedName, complete bool) error {
	c := m.c
	var errs []error
	si, err := m.localImport(nn)
	if err != nil {
		return err
	}
	if si != nil && !ownsImport(si) {
		return nil
	}
	for _, sl := range m.importSlices(nn) {
		if err := c.deleteSlice(ctx, sl); err != nil {
			errs = append(errs, err)
		}
	}
	if s := c.localService(nn.Namespace, derivedServiceName(nn)); s != nil && s.Labels[liveness.LabelManagedBy] == liveness.ManagedBy {
		if err := m.deleteService(ctx, s); err != nil {
			errs = append(errs, err)
		}
	}
	if si != nil && complete {
		uid := si.UID
		err := m.dyn.Resource(ServiceImportGVR).Namespace(nn.Namespace).Delete(ctx, nn.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting ServiceImport %s: %w", nn, err))
		} else {
			c.log.Info("deleted ServiceImport (no cluster exports it)", "service", nn.String())
		}
	}
	m.mu.Lock()
	delete(m.endpoints, nn)
	delete(m.importSet, nn)
	m.mu.Unlock()
	m.updateMetrics()
	return errors.Join(errs...)
}

// writeExportStatus sets the Valid, Ready and Conflict conditions of the
// local ServiceExport nn.
func (m *mcsController) writeExportStatus(ctx context.Context, nn types.NamespacedName, ex *unstructured.Unstructured, svc *corev1.Service, mg merged, importErr error) error {
	if ex == nil {
		m.mu.Lock()
		delete(m.exportConds, nn)
		m.mu.Unlock()
		m.updateMetrics()
		return nil
	}
	var se mcsv1beta1.ServiceExport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(ex.Object, &se); err != nil {
		return fmt.Errorf("reading ServiceExport %s: %w", nn, err)
	}
	conds := slices.Clone(se.Status.Conditions)
	set := func(t mcsv1beta1.ServiceExportConditionType, s metav1.ConditionStatus, r mcsv1beta1.ServiceExportConditionReason, msg string) {
		meta.SetStatusCondition(&conds, metav1.Condition{Type: string(t), Status: s, Reason: string(r), Message: msg, ObservedGeneration: se.Generation})
	}
	valid := false
	switch {
	case svc == nil:
		set(mcsv1beta1.ServiceExportConditionValid, metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonNoService, "Service "+nn.String()+" does not exist")
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		set(mcsv1beta1.ServiceExportConditionValid, metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonInvalidServiceType, "Service "+nn.String()+" is of type ExternalName, which cannot be exported")
	default:
		valid = true
		set(mcsv1beta1.ServiceExportConditionValid, metav1.ConditionTrue, mcsv1beta1.ServiceExportReasonValid, "Service "+nn.String()+" is exported")
	}
	switch {
	case !valid:
		set(mcsv1beta1.ServiceExportConditionReady, metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonFailed, "the export is not valid")
		meta.RemoveStatusCondition(&conds, string(mcsv1beta1.ServiceExportConditionConflict))
	case errors.Is(importErr, errImportNotOwned):
		set(mcsv1beta1.ServiceExportConditionReady, metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonFailed, importErr.Error())
	case importErr != nil:
		set(mcsv1beta1.ServiceExportConditionReady, metav1.ConditionUnknown, mcsv1beta1.ServiceExportReasonPending, "importing: "+importErr.Error())
	default:
		set(mcsv1beta1.ServiceExportConditionReady, metav1.ConditionTrue, mcsv1beta1.ServiceExportReasonReady, "exported and imported in this cluster")
	}
	if valid {
		if reasons := mg.conflicts[m.clusterID]; len(reasons) > 0 {
			set(mcsv1beta1.ServiceExportConditionConflict, metav1.ConditionTrue, mcsv1beta1.ServiceExportConditionReason(strings.Join(reasons, ",")),
				fmt.Sprintf("Conflicting %s. Using the oldest export's, in cluster %q.", strings.Join(mg.messages[m.clusterID], "; "), mg.winner))
		} else {
			set(mcsv1beta1.ServiceExportConditionConflict, metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonNoConflicts, "no conflicts with the other exports")
		}
	}
	m.mu.Lock()
	m.exportConds[nn] = conds
	m.mu.Unlock()
	m.updateMetrics()
	if conditionsEqual(se.Status.Conditions, conds) {
		return nil
	}
	u := ex.DeepCopy()
	cl := make([]any, 0, len(conds))
	for _, cd := range conds {
		x, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&cd)
		if err != nil {
			return err
		}
		cl = append(cl, x)
	}
	if err := unstructured.SetNestedSlice(u.Object, cl, "status", "conditions"); err != nil {
		return err
	}
	gvr := ServiceExportGVR
	if gv, err := schema.ParseGroupVersion(u.GetAPIVersion()); err == nil && gv.Group == gvr.Group {
		gvr.Version = gv.Version
	}
	if _, err := m.dyn.Resource(gvr).Namespace(nn.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating the status of ServiceExport %s: %w", nn, err)
	}
	return nil
}

func conditionsEqual(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		y := meta.FindStatusCondition(b, x.Type)
		if y == nil || y.Status != x.Status || y.Reason != x.Reason || y.Message != x.Message || y.ObservedGeneration != x.ObservedGeneration {
			return false
		}
	}
	return true
}

func (m *mcsController) updateMetrics() {
	mt := m.c.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	mt.imports.Set(float64(len(m.importSet)))
	counts := map[[2]string]int{}
	for _, conds := range m.exportConds {
		for _, t := range []mcsv1beta1.ServiceExportConditionType{mcsv1beta1.ServiceExportConditionValid, mcsv1beta1.ServiceExportConditionReady, mcsv1beta1.ServiceExportConditionConflict} {
			if cd := meta.FindStatusCondition(conds, string(t)); cd != nil {
				counts[[2]string{cd.Type, string(cd.Status)}]++
			}
		}
	}
	mt.exports.Reset()
	for _, t := range []string{"Valid", "Ready", "Conflict"} {
		for _, s := range []string{"True", "False", "Unknown"} {
			mt.exports.WithLabelValues(t, s).Set(float64(counts[[2]string{t, s}]))
		}
	}
	eps := map[string]int{}
	for _, byCluster := range m.endpoints {
		for cl, n := range byCluster {
			eps[cl] += n
		}
	}
	mt.endpoints.Reset()
	for cl, n := range eps {
		mt.endpoints.WithLabelValues(cl).Set(float64(n))
	}
}
