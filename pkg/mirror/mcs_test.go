package mirror

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"meshd.io/meshd/pkg/k8s/liveness"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// mcsEnv is an env whose Controller writes the MCS objects of cluster
// "local" (a fake dynamic client for ServiceImports and ServiceExports).
type mcsEnv struct {
	*env
	dyn *dynamicfake.FakeDynamicClient
}

const localID = "local"

func newLocalDynamic(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		ServiceExportGVR: "ServiceExportList", ServiceImportGVR: "ServiceImportList", ClusterPropertyGVR: "ClusterPropertyList",
	}, objs...)
}

// mcsDiscovery makes the fake local cluster serve the MCS CRDs.
func mcsDiscovery(f *fake.Clientset) {
	f.Resources = []*metav1.APIResourceList{{
		GroupVersion: ServiceImportGVR.GroupVersion().String(),
		APIResources: []metav1.APIResource{{Name: "serviceimports", Namespaced: true, Kind: "ServiceImport"}, {Name: "serviceexports", Namespaced: true, Kind: "ServiceExport"}},
	}}
	// The API server allocates cluster IPs; the fake does not.
	f.PrependReactor("create", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*corev1.Service)
		if s.Spec.ClusterIP == "" {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.200.1", []string{"10.96.200.1"}
		}
		return false, nil, nil
	})
}

func startMCS(t *testing.T, opts Options, local []runtime.Object, localDyn []runtime.Object, remotes ...*fakeRemote) *mcsEnv {
	t.Helper()
	dyn := newLocalDynamic(localDyn...)
	opts.ClusterID, opts.LocalDynamic, opts.StaticRemotes = localID, dyn, true
	e := startWith(t, opts, mcsDiscovery, local, remotes...)
	return &mcsEnv{env: e, dyn: dyn}
}

func exportAt(ns, name string, created time.Time) *unstructured.Unstructured {
	u := export(ns, name)
	u.SetCreationTimestamp(metav1.NewTime(created))
	return u
}

var t0 = time.Unix(1_700_000_000, 0)

func (e *mcsEnv) serviceImport(ns, name string) (*mcsv1beta1.ServiceImport, error) {
	u, err := e.dyn.Resource(ServiceImportGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var si mcsv1beta1.ServiceImport
	return &si, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si)
}

func (e *mcsEnv) exportConditions(ns, name string) []metav1.Condition {
	u, err := e.dyn.Resource(ServiceExportGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var se mcsv1beta1.ServiceExport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &se); err != nil {
		e.t.Fatal(err)
	}
	return se.Status.Conditions
}

// waitCondition waits for condition t of the local export ns/name.
func (e *mcsEnv) waitCondition(ns, name, typ string, status metav1.ConditionStatus, reason string) {
	e.t.Helper()
	eventually(e.t, func() error {
		c := meta.FindStatusCondition(e.exportConditions(ns, name), typ)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("condition %s of %s/%s: %+v, want %s %s", typ, ns, name, c, status, reason)
		}
		return nil
	})
}

func (e *mcsEnv) importSlices(ns, name string) []discoveryv1.EndpointSlice {
	l, err := e.local.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelServiceName + "=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

func localObjects(svc *corev1.Service, eps ...*discoveryv1.EndpointSlice) []runtime.Object {
	out := []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}}
	if svc != nil {
		out = append(out, svc)
	}
	for _, sl := range eps {
		out = append(out, sl)
	}
	return out
}

func TestServiceImportLifecycle(t *testing.T) {
	c2 := newFakeRemote("c2", remoteService("shop", "web", "10.112.0.10", 80), exportAt("shop", "web", t0),
		remoteSlice("shop", "web", "web-c2", 8080, ep{ip: "10.245.0.1", ready: true}))
	local := remoteService("shop", "web", "10.96.0.10", 80)
	local.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	e := startMCS(t, Options{NoMirrors: true},
		localObjects(local, remoteSlice("shop", "web", "web-local", 8080, ep{ip: "10.244.0.1", ready: true})),
		[]runtime.Object{exportAt("shop", "web", t0.Add(time.Minute))}, c2)
	nn := types.NamespacedName{Namespace: "shop", Name: "web"}
	derived := derivedServiceName(nn)

	var si *mcsv1beta1.ServiceImport
	eventually(t, func() (err error) {
		if si, err = e.serviceImport("shop", "web"); err != nil {
			return err
		}
		if len(si.Status.Clusters) != 2 || len(si.Spec.IPs) != 1 {
			return fmt.Errorf("ServiceImport %+v", si)
		}
		return nil
	})
	if si.Spec.Type != mcsv1beta1.ClusterSetIP || si.Spec.IPs[0] != "10.96.200.1" || si.Annotations[AnnotationDerivedService] != derived ||
		len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 80 || si.Labels[liveness.LabelManagedBy] != liveness.ManagedBy {
		t.Errorf("ServiceImport spec %+v annotations %v", si.Spec, si.Annotations)
	}
	// The oldest export (c2's) wins: no session affinity; the local export,
	// newer, is in conflict.
	if si.Spec.SessionAffinity != corev1.ServiceAffinityNone {
		t.Errorf("session affinity %s, want the oldest export's None", si.Spec.SessionAffinity)
	}
	e.waitCondition("shop", "web", "Valid", metav1.ConditionTrue, "Valid")
	e.waitCondition("shop", "web", "Ready", metav1.ConditionTrue, "Ready")
	e.waitCondition("shop", "web", "Conflict", metav1.ConditionTrue, "SessionAffinityConflict")

	d, err := e.service("shop", derived)
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Selector != nil || len(d.OwnerReferences) != 1 || d.OwnerReferences[0].Kind != "ServiceImport" || d.OwnerReferences[0].UID != si.UID {
		t.Errorf("derived Service %+v", d)
	}
	eventually(t, func() error {
		sls := e.importSlices("shop", "web")
		got := map[string][]string{}
		for _, sl := range sls {
			if sl.Labels[discoveryv1.LabelServiceName] != derived || sl.Labels[discoveryv1.LabelManagedBy] == "endpointslice-controller.k8s.io" ||
				len(sl.OwnerReferences) != 1 || sl.OwnerReferences[0].UID != si.UID {
				return fmt.Errorf("slice %s labels %v owners %v", sl.Name, sl.Labels, sl.OwnerReferences)
			}
			for _, ep := range sl.Endpoints {
				got[sl.Labels[LabelSourceCluster]] = append(got[sl.Labels[LabelSourceCluster]], ep.Addresses...)
			}
		}
		if len(got) != 2 || !slices.Equal(got["c2"], []string{"10.245.0.1"}) || !slices.Equal(got[localID], []string{"10.244.0.1"}) {
			return fmt.Errorf("endpoints by source cluster %v", got)
		}
		return nil
	})

	// Converged: no write follows (meshd's own writes do not loop).
	writes := func() int {
		n := 0
		for _, a := range append(e.local.Actions(), e.dyn.Actions()...) {
			if v := a.GetVerb(); v == "create" || v == "update" || v == "delete" {
				n++
			}
		}
		return n
	}
	eventually(t, func() error {
		before := writes()
		time.Sleep(100 * time.Millisecond)
		if after := writes(); after != before {
			return fmt.Errorf("%d writes in 100ms", after-before)
		}
		return nil
	})
	before := writes()
	time.Sleep(300 * time.Millisecond)
	if after := writes(); after != before {
		t.Errorf("%d writes after convergence: a write loop", after-before)
	}

	// The remote export goes: only the local cluster's slice stays.
	c2.deleteExport(t, "shop", "web")
	eventually(t, func() error {
		si, err := e.serviceImport("shop", "web")
		if err != nil {
			return err
		}
		if len(si.Status.Clusters) != 1 || si.Status.Clusters[0].Cluster != localID || len(e.importSlices("shop", "web")) != 1 {
			return fmt.Errorf("clusters %v, %d slices", si.Status.Clusters, len(e.importSlices("shop", "web")))
		}
		return nil
	})
	e.waitCondition("shop", "web", "Conflict", metav1.ConditionFalse, "NoConflicts")

	// The last export goes: everything is deleted.
	if err := e.dyn.Resource(ServiceExportGVR).Namespace("shop").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() error {
		if _, err := e.serviceImport("shop", "web"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("ServiceImport still there: %v", err)
		}
		if _, err := e.service("shop", derived); !apierrors.IsNotFound(err) {
			return fmt.Errorf("derived Service still there: %v", err)
		}
		if n := len(e.importSlices("shop", "web")); n != 0 {
			return fmt.Errorf("%d slices left", n)
		}
		return nil
	})
	// The exporting Service itself is untouched.
	if _, err := e.service("shop", "web"); err != nil {
		t.Errorf("the local Service: %v", err)
	}
}

func TestExportConditions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		local      func(*corev1.Service) *corev1.Service
		typ        string
		status     metav1.ConditionStatus
		reason     string
		importType mcsv1beta1.ServiceImportType
	}{
		{"no service", func(*corev1.Service) *corev1.Service { return nil }, "Valid", metav1.ConditionFalse, "NoService", mcsv1beta1.ClusterSetIP},
		{"external name", func(s *corev1.Service) *corev1.Service {
			s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.org"}
			return s
		}, "Valid", metav1.ConditionFalse, "InvalidServiceType", mcsv1beta1.ClusterSetIP},
		{"port conflict", func(s *corev1.Service) *corev1.Service {
			s.Spec.Ports[0].Port = 81
			return s
		}, "Conflict", metav1.ConditionTrue, "PortConflict", mcsv1beta1.ClusterSetIP},
		{"type conflict", func(s *corev1.Service) *corev1.Service {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
			return s
		}, "Conflict", metav1.ConditionTrue, "TypeConflict", mcsv1beta1.ClusterSetIP},
		{"traffic policy conflict", func(s *corev1.Service) *corev1.Service {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			return s
		}, "Conflict", metav1.ConditionTrue, "InternalTrafficPolicyConflict", mcsv1beta1.ClusterSetIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c2 := newFakeRemote("c2", remoteService("shop", "web", "10.112.0.10", 80), exportAt("shop", "web", t0),
				remoteSlice("shop", "web", "web-c2", 8080, ep{ip: "10.245.0.1", ready: true}))
			e := startMCS(t, Options{NoMirrors: true}, localObjects(tc.local(remoteService("shop", "web", "10.96.0.10", 80))),
				[]runtime.Object{exportAt("shop", "web", t0.Add(time.Minute))}, c2)
			e.waitCondition("shop", "web", tc.typ, tc.status, tc.reason)
			if tc.typ == "Valid" {
				e.waitCondition("shop", "web", "Ready", metav1.ConditionFalse, "Failed")
			}
			// c2's export is imported whatever the local one does.
			eventually(t, func() error {
				si, err := e.serviceImport("shop", "web")
				if err != nil {
					return err
				}
				if si.Spec.Type != tc.importType || len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 80 {
					return fmt.Errorf("ServiceImport %+v", si.Spec)
				}
				return nil
			})
		})
	}
}

func TestMergeExports(t *testing.T) {
	a := remoteService("shop", "web", "10.96.0.10", 80, 443)
	b := remoteService("shop", "web", "fd00:10::10", 80, 8443)
	b.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	b.Spec.TrafficDistribution = ptr("PreferClose")
	m := mergeExports([]constituent{{cluster: "b", created: t0.Add(time.Second), svc: b}, {cluster: "a", created: t0, svc: a}})
	var ports []string
	for _, p := range m.spec.Ports {
		ports = append(ports, fmt.Sprintf("%s:%d", p.Name, p.Port))
	}
	if !slices.Equal(ports, []string{"p443:443", "p80:80", "p8443:8443"}) {
		t.Errorf("ports %v, want the union by name", ports)
	}
	if !slices.Equal(m.spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}) {
		t.Errorf("families %v", m.spec.IPFamilies)
	}
	if m.winner != "a" || m.spec.TrafficDistribution != nil || !slices.Equal(m.conflicts["b"], []string{"TrafficDistributionConflict"}) || len(m.conflicts["a"]) != 0 {
		t.Errorf("winner %s, traffic distribution %v, conflicts %v", m.winner, m.spec.TrafficDistribution, m.conflicts)
	}
	// exportedLabels: the oldest export's, a different set is a conflict.
	m = mergeExports([]constituent{
		{cluster: "a", created: t0, svc: a, labels: map[string]string{"tier": "web"}},
		{cluster: "b", created: t0.Add(time.Second), svc: a, labels: map[string]string{"tier": "api"}, annotations: map[string]string{"x": "y"}},
	})
	if m.labels["tier"] != "web" || len(m.annotations) != 0 || !slices.Equal(m.conflicts["b"], []string{"LabelsConflict", "AnnotationsConflict"}) {
		t.Errorf("labels %v annotations %v conflicts %v", m.labels, m.annotations, m.conflicts)
	}
	if got := derivedServiceName(types.NamespacedName{Namespace: "shop", Name: "web"}); !strings.HasPrefix(got, "derived-") || len(got) != 18 {
		t.Errorf("derived name %q", got)
	}
}

// startUnsyncedC9 runs the MCS controller of a cluster whose ServiceImport
// shop/web (Headless) lists source c9, with c9's slice kept from before a
// restart (its endpoint ready or not), c9 unreachable and unable to list its
// ServiceExports, so it never syncs; it returns once MCS runs.
func startUnsyncedC9(t *testing.T, opts Options, ready bool, localSvc *corev1.Service, localDyn ...runtime.Object) *mcsEnv {
	t.Helper()
	nn := types.NamespacedName{Namespace: "shop", Name: "web"}
	si := &unstructured.Unstructured{}
	si.SetAPIVersion(ServiceImportGVR.GroupVersion().String())
	si.SetKind("ServiceImport")
	si.SetNamespace("shop")
	si.SetName("web")
	si.SetUID("si-uid")
	si.SetLabels(map[string]string{liveness.LabelManagedBy: liveness.ManagedBy})
	_ = unstructured.SetNestedField(si.Object, "Headless", "spec", "type")
	_ = unstructured.SetNestedSlice(si.Object, []any{map[string]any{"cluster": "c9"}}, "status", "clusters")
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: mcsSliceName(nn, "c9", "x"), Namespace: "shop", Labels: map[string]string{
			liveness.LabelManagedBy: liveness.ManagedBy, LabelServiceName: "web", LabelSourceCluster: "c9", discoveryv1.LabelManagedBy: ManagedByMirror}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.249.0.1"}}},
	}
	if ready {
		slice.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true)}
	}
	c9 := newFakeRemote("c9")
	c9.down.Store(true)
	c9.dyn.PrependReactor("list", "serviceexports", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("connection refused")
	})
	dyn := newLocalDynamic(append([]runtime.Object{si}, localDyn...)...)
	opts.NoMirrors, opts.ClusterID, opts.LocalDynamic, opts.StaticRemotes, opts.ProbeInterval = true, localID, dyn, true, 5*time.Millisecond
	e := &mcsEnv{env: &env{t: t, local: fake.NewClientset(localObjects(localSvc, slice)...), clock: &fakeClock{t: t0}, metrics: NewMetrics(nil), done: make(chan struct{})}, dyn: dyn}
	mcsDiscovery(e.local)
	opts.Now, opts.Resync = e.clock.Now, -1
	e.c = New(testLogger(t), e.local, nil, e.metrics, opts)
	if err := e.c.AddRemote(c9.remote()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { defer close(e.done); _ = e.c.Run(ctx) }()
	t.Cleanup(e.stop)
	eventually(t, func() error {
		if !e.c.mcs.running.Load() {
			return fmt.Errorf("MCS not running")
		}
		return nil
	})
	return e
}

// TestMCSNeverDeletesBeforeResync: a source cluster that has not synced (a
// restart, a new leader, linkerd2#12499) keeps its imported slices and the
// ServiceImport, however long it takes.
func TestMCSNeverDeletesBeforeResync(t *testing.T) {
	// The local cluster exports web as a ClusterIP Service: a partial view
	// would turn the import into ClusterSetIP.
	e := startUnsyncedC9(t, Options{}, false, remoteService("shop", "web", "10.96.0.10", 80), exportAt("shop", "web", t0))
	e.c.mcs.enqueue("shop", "web")
	never(t, 300*time.Millisecond, func() error {
		got, err := e.serviceImport("shop", "web")
		if err != nil {
			return fmt.Errorf("the ServiceImport was deleted before c9 synced: %v", err)
		}
		if got.Spec.Type != mcsv1beta1.Headless || len(got.Status.Clusters) != 1 {
			return fmt.Errorf("the ServiceImport was changed from a partial view: %+v %+v", got.Spec, got.Status)
		}
		if n := len(e.importSlices("shop", "web")); n != 1 {
			return fmt.Errorf("c9's slice deleted before c9 synced (%d slices)", n)
		}
		return nil
	})
}

// TestMCSCRDsMissing: without the MCS CRDs the mirror says so in an Event on
// its namespace (and a log line) and keeps mirroring.
func TestMCSCRDsMissing(t *testing.T) {
	dyn := newLocalDynamic()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "meshd-system"}}
	e := start(t, Options{ClusterID: localID, LocalDynamic: dyn, StaticRemotes: true, EventNamespace: "meshd-system"},
		[]runtime.Object{ns}, shopRemote("c1"))
	eventually(t, func() error {
		for _, ev := range e.events() {
			if strings.Contains(ev, EventReasonMCSCRDsMissing) && strings.Contains(ev, "manifests/components/mcs-crds") {
				return nil
			}
		}
		return fmt.Errorf("no %s Event", EventReasonMCSCRDsMissing)
	})
	// The Linkerd-style mirror is still written.
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
}

// startLeaseFollowing runs MCS with source c2 exporting shop/web, whose one
// endpoint is on a node with a 10 s heartbeat Lease the mirror follows
// (with grace period grace); ready(want) checks that endpoint's import.
func startLeaseFollowing(t *testing.T, grace time.Duration) (e *mcsEnv, c2 *fakeRemote, lease *coordinationv1.Lease, ready func(want bool) func() error) {
	t.Helper()
	lease = &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: liveness.LeaseName("remote-node"), Namespace: "meshd-system", ResourceVersion: "1",
			Labels: map[string]string{liveness.LabelManagedBy: liveness.ManagedBy}},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr(int32(10))},
	}
	c2 = newFakeRemote("c2", remoteService("shop", "web", "10.112.0.10", 80), exportAt("shop", "web", t0),
		remoteSlice("shop", "web", "web-c2", 8080, ep{ip: "10.245.0.1", ready: true}), lease)
	e = startMCS(t, Options{NoMirrors: true, LeaseNamespace: "meshd-system", GracePeriod: grace}, localObjects(nil), nil, c2)
	ready = func(want bool) func() error {
		return func() error {
			sls := e.importSlices("shop", "web")
			if len(sls) != 1 || len(sls[0].Endpoints) != 1 {
				return fmt.Errorf("%d import slices, want 1 with 1 endpoint", len(sls))
			}
			if r := sls[0].Endpoints[0].Conditions.Ready; r == nil || *r != want {
				return fmt.Errorf("imported endpoint ready %v, want %v", r, want)
			}
			return nil
		}
	}
	return e, c2, lease, ready
}

// TestStaleEndpointsFollowSourceLeases: an imported endpoint on a node whose
// meshd heartbeat Lease (in the source cluster) expired turns not ready; a
// renewal makes it ready again.
func TestStaleEndpointsFollowSourceLeases(t *testing.T) {
	e, c2, lease, ready := startLeaseFollowing(t, time.Hour)
	eventually(t, ready(true))
	e.clock.Advance(11 * time.Second)
	eventually(t, ready(false))
	// The node renews its Lease: ready again.
	lease.ResourceVersion = "2"
	if _, err := c2.kube.CoordinationV1().Leases("meshd-system").Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ready(true))
}

// TestUnlinkedClusterSlicesGo: a removed source cluster's imported slices
// are deleted; the local export keeps the import.
func TestUnlinkedClusterSlicesGo(t *testing.T) {
	c2 := newFakeRemote("c2", remoteService("shop", "web", "10.112.0.10", 80), exportAt("shop", "web", t0),
		remoteSlice("shop", "web", "web-c2", 8080, ep{ip: "10.245.0.1", ready: true}))
	e := startMCS(t, Options{NoMirrors: true},
		localObjects(remoteService("shop", "web", "10.96.0.10", 80), remoteSlice("shop", "web", "web-local", 8080, ep{ip: "10.244.0.1", ready: true})),
		[]runtime.Object{exportAt("shop", "web", t0.Add(time.Minute))}, c2)
	clusters := func(want ...string) func() error {
		return func() error {
			var got []string
			for _, sl := range e.importSlices("shop", "web") {
				got = append(got, sl.Labels[LabelSourceCluster])
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("slices of clusters %v, want %v", got, want)
			}
			return nil
		}
	}
	eventually(t, clusters("c2", localID))
	e.c.RemoveRemote("c2")
	eventually(t, clusters(localID))
	if _, err := e.serviceImport("shop", "web"); err != nil {
		t.Errorf("the import of the local export: %v", err)
	}
}
