package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// checkMirror waits until ns/name mirrors a Service with ports and one
// endpoint ip (ready as given).
func (e *env) checkMirror(ns, name, cluster, source, ip string, ready bool, ports ...int32) {
	e.t.Helper()
	eventually(e.t, func() error {
		s, err := e.service(ns, name)
		if err != nil {
			return err
		}
		if s.Spec.Selector != nil {
			return fmt.Errorf("mirror has a selector %v", s.Spec.Selector)
		}
		if s.Labels[LabelMirroredFromCluster] != cluster || s.Labels[liveness.LabelManagedBy] != liveness.ManagedBy || s.Annotations[AnnotationMirroredFrom] != source {
			return fmt.Errorf("mirror labels %v annotations %v", s.Labels, s.Annotations)
		}
		var got []int32
		for _, p := range s.Spec.Ports {
			got = append(got, p.Port)
		}
		if !slices.Equal(got, ports) {
			return fmt.Errorf("mirror ports %v, want %v", got, ports)
		}
		sls := e.slices(ns, name)
		if len(sls) != 1 {
			return fmt.Errorf("%d slices, want 1", len(sls))
		}
		sl := sls[0]
		if sl.Labels[discoveryv1.LabelManagedBy] != ManagedByMirror || sl.AddressType != discoveryv1.AddressTypeIPv4 {
			return fmt.Errorf("slice labels %v type %s", sl.Labels, sl.AddressType)
		}
		if len(sl.Endpoints) != 1 || !slices.Equal(sl.Endpoints[0].Addresses, []string{ip}) {
			return fmt.Errorf("slice endpoints %+v, want %s", sl.Endpoints, ip)
		}
		if r := deref(sl.Endpoints[0].Conditions.Ready); r != ready {
			return fmt.Errorf("endpoint ready %v, want %v", r, ready)
		}
		got = got[:0]
		for _, p := range sl.Ports {
			got = append(got, deref(p.Port))
		}
		if !slices.Equal(got, ports) {
			return fmt.Errorf("slice ports %v, want %v", got, ports)
		}
		return nil
	})
}

func shopRemote(name string) *fakeRemote {
	return newFakeRemote(name,
		remoteService("shop", "web", "10.96.0.10", 80),
		export("shop", "web"),
		remoteSlice("shop", "web", "web-abc", 8080, ep{ip: "10.244.1.5", ready: true}),
		// Not exported: never mirrored.
		remoteService("shop", "db", "10.96.0.11", 5432),
	)
}

func TestCreateMirrorAndNamespace(t *testing.T) {
	r := shopRemote("c1")
	e := start(t, Options{}, nil, r)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
	if _, err := e.local.CoreV1().Namespaces().Get(context.Background(), "shop", metav1.GetOptions{}); err != nil {
		t.Fatalf("namespace not created: %v", err)
	}
	if _, err := e.service("shop", "db"); !apierrors.IsNotFound(err) {
		t.Fatalf("unexported Service mirrored: %v", err)
	}
	s, _ := e.service("shop", "web")
	if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("mirror type %s clusterIP %q", s.Spec.Type, s.Spec.ClusterIP)
	}
	sl := e.slices("shop", "web")[0]
	if len(sl.OwnerReferences) != 1 || sl.OwnerReferences[0].Name != "web" {
		t.Errorf("slice owner %v", sl.OwnerReferences)
	}
	eventually(t, func() error {
		if got := gaugeValue(t, e.metrics.services.WithLabelValues("c1")); got != 1 {
			return fmt.Errorf("mirrored services gauge %v, want 1", got)
		}
		if got := gaugeValue(t, e.metrics.reachable.WithLabelValues("c1")); got != 1 {
			return fmt.Errorf("reachable gauge %v", got)
		}
		return nil
	})
}

func TestChangesPropagate(t *testing.T) {
	r := shopRemote("c1")
	e := start(t, Options{}, nil, r)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)

	r.updateService(t, "shop", "web", func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "p443", Port: 443, Protocol: corev1.ProtocolTCP})
	})
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80, 443)

	r.updateService(t, "shop", "web", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.7.7", []string{"10.96.7.7"}
	})
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.7.7", true, 80, 443)

	// Readiness: the only remote endpoint goes not ready, then ready.
	sl := remoteSlice("shop", "web", "web-abc", 8080, ep{ip: "10.244.1.5", ready: false})
	if _, err := r.kube.DiscoveryV1().EndpointSlices("shop").Update(context.Background(), sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.7.7", false, 80, 443)
	sl = remoteSlice("shop", "web", "web-abc", 8080, ep{ip: "10.244.1.5", ready: true})
	if _, err := r.kube.DiscoveryV1().EndpointSlices("shop").Update(context.Background(), sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.7.7", true, 80, 443)

	// Observed after the write; a change folded into a sync already under
	// way is written without a fresh observation.
	eventually(t, func() error {
		if got := histogramCount(t, e); got < 3 {
			return fmt.Errorf("propagation observed %d times for 4 changes", got)
		}
		return nil
	})

	// A mirror changed by hand is repaired.
	s, _ := e.service("shop", "web")
	s.Spec.Ports = s.Spec.Ports[:1]
	if _, err := e.local.CoreV1().Services("shop").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.7.7", true, 80, 443)
}

func gaugeValue(t testing.TB, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func histogramCount(t *testing.T, e *env) uint64 {
	t.Helper()
	var m dto.Metric
	if err := e.metrics.propagation.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func TestExportOrServiceDeletedRemovesMirror(t *testing.T) {
	t.Run("export deleted", func(t *testing.T) {
		r := shopRemote("c1")
		e := start(t, Options{}, nil, r)
		e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
		r.deleteExport(t, "shop", "web")
		e.waitGone("shop", "web")
		eventually(t, func() error {
			if got := gaugeValue(t, e.metrics.services.WithLabelValues("c1")); got != 0 {
				return fmt.Errorf("mirrored services gauge %v, want 0", got)
			}
			return nil
		})
		// Exported again: mirrored again.
		r.createExport(t, "shop", "web")
		e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
	})
	t.Run("service deleted", func(t *testing.T) {
		r := shopRemote("c1")
		e := start(t, Options{}, nil, r)
		e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
		if err := r.kube.CoreV1().Services("shop").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitGone("shop", "web")
	})
}

func TestClashWithForeignService(t *testing.T) {
	theirs := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Labels: map[string]string{"team": "local"}},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "local-web"}, Ports: []corev1.ServicePort{{Port: 8000}}},
	}
	theirSlice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-xyz", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	r := shopRemote("c1")
	e := start(t, Options{}, []runtime.Object{theirs, theirSlice, ns}, r)
	eventually(t, func() error {
		for _, ev := range e.events() {
			if strings.Contains(ev, EventReasonClash) && strings.Contains(ev, "shop/web from cluster c1") {
				return nil
			}
		}
		return errors.New("no clash Event")
	})
	never(t, 100*time.Millisecond, func() error {
		s, err := e.service("shop", "web")
		if err != nil || s.Spec.Selector["app"] != "local-web" || s.Spec.Ports[0].Port != 8000 || s.Labels[LabelMirroredFromCluster] != "" {
			return fmt.Errorf("foreign Service touched: %+v %v", s, err)
		}
		if sls := e.slices("shop", "web"); len(sls) != 1 || sls[0].Name != "web-xyz" {
			return fmt.Errorf("slices of the foreign Service changed: %v", sls)
		}
		return nil
	})
	if got := gaugeValue(t, e.metrics.clashes.WithLabelValues("c1")); got != 1 {
		t.Errorf("clash gauge %v, want 1", got)
	}
	// Remote changes do not repeat the Event.
	r.updateService(t, "shop", "web", func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 })
	time.Sleep(50 * time.Millisecond)
	if evs := e.events(); len(evs) != 0 {
		t.Errorf("repeated Events: %v", evs)
	}
	// The foreign Service goes away: the mirror takes the name.
	if err := e.local.CoreV1().Services("shop").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.local.DiscoveryV1().EndpointSlices("shop").Delete(context.Background(), "web-xyz", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 81)
	eventually(t, func() error {
		if got := gaugeValue(t, e.metrics.clashes.WithLabelValues("c1")); got != 0 {
			return fmt.Errorf("clash gauge %v, want 0", got)
		}
		return nil
	})
}

func TestHeadless(t *testing.T) {
	svc := remoteService("db", "pg", corev1.ClusterIPNone, 5432)
	r := newFakeRemote("c1", svc, export("db", "pg"),
		remoteSlice("db", "pg", "pg-1", 5432, ep{ip: "10.244.1.7", ready: true, hostname: "pg-0"}, ep{ip: "10.244.2.9", ready: false, hostname: "pg-1"}),
		remoteSlice("db", "pg", "pg-2", 5432, ep{ip: "10.244.3.3", ready: true, hostname: "pg-2"}),
	)
	e := start(t, Options{}, nil, r)
	eventually(t, func() error {
		s, err := e.service("db", "pg")
		if err != nil {
			return err
		}
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			return fmt.Errorf("mirror clusterIP %q, want None", s.Spec.ClusterIP)
		}
		sls := e.slices("db", "pg")
		if len(sls) != 1 {
			return fmt.Errorf("%d slices", len(sls))
		}
		var got []string
		for _, x := range sls[0].Endpoints {
			if x.NodeName != nil || x.TargetRef != nil {
				return fmt.Errorf("remote node/pod reference copied: %+v", x)
			}
			got = append(got, fmt.Sprintf("%s/%s/%v", x.Addresses[0], deref(x.Hostname), deref(x.Conditions.Ready)))
		}
		want := []string{"10.244.1.7/pg-0/true", "10.244.2.9/pg-1/false", "10.244.3.3/pg-2/true"}
		if !slices.Equal(got, want) {
			return fmt.Errorf("endpoints %v, want %v", got, want)
		}
		if p := sls[0].Ports; len(p) != 1 || deref(p[0].Port) != 5432 {
			return fmt.Errorf("slice ports %+v", p)
		}
		return nil
	})
	// A pod goes away remotely.
	if err := r.kube.DiscoveryV1().EndpointSlices("db").Delete(context.Background(), "pg-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() error {
		sls := e.slices("db", "pg")
		if len(sls) != 1 || len(sls[0].Endpoints) != 2 {
			return fmt.Errorf("slices %+v", sls)
		}
		return nil
	})
	// Headless → cluster IP: the mirror is recreated with a cluster IP.
	r.updateService(t, "db", "pg", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.3.3", []string{"10.96.3.3"} })
	e.checkMirror("db", "pg", "c1", "db/pg", "10.96.3.3", true, 5432)
}

func TestSkipMissingNamespace(t *testing.T) {
	r := shopRemote("c1")
	e := start(t, Options{SkipMissingNamespaces: true}, nil, r)
	never(t, 100*time.Millisecond, func() error {
		if _, err := e.service("shop", "web"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("mirror created without its namespace: %v", err)
		}
		if _, err := e.local.CoreV1().Namespaces().Get(context.Background(), "shop", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("namespace created: %v", err)
		}
		return nil
	})
	// The namespace appears: the mirror follows.
	if _, err := e.local.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
}

func TestUnreachableRemote(t *testing.T) {
	r := shopRemote("c1")
	e := start(t, Options{GracePeriod: time.Minute}, nil, r)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)

	r.down.Store(true)
	eventually(t, func() error {
		if got := gaugeValue(t, e.metrics.reachable.WithLabelValues("c1")); got != 0 {
			return fmt.Errorf("reachable gauge %v", got)
		}
		return nil
	})
	// Within the grace period: untouched.
	e.clock.Advance(59 * time.Second)
	never(t, 50*time.Millisecond, func() error {
		sls := e.slices("shop", "web")
		if len(sls) != 1 || !deref(sls[0].Endpoints[0].Conditions.Ready) {
			return fmt.Errorf("mirror changed within the grace period: %+v", sls)
		}
		return nil
	})
	// Past it: not ready, but still there.
	e.clock.Advance(2 * time.Second)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", false, 80)
	// Remote changes are not seen, and nothing is deleted meanwhile.
	never(t, 50*time.Millisecond, func() error {
		_, err := e.service("shop", "web")
		return err
	})
	// Back: ready again.
	r.down.Store(false)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
}

func TestTwoClusters(t *testing.T) {
	t.Run("suffix", func(t *testing.T) {
		c1, c2 := shopRemote("c1"), newFakeRemote("c2", remoteService("shop", "web", "10.112.0.10", 80), export("shop", "web"),
			remoteSlice("shop", "web", "w", 80, ep{ip: "10.245.0.1", ready: true}))
		e := start(t, Options{NameSuffix: true}, nil, c1, c2)
		e.checkMirror("shop", "web-c1", "c1", "shop/web", "10.96.0.10", true, 80)
		e.checkMirror("shop", "web-c2", "c2", "shop/web", "10.112.0.10", true, 80)
		if evs := e.events(); len(evs) != 0 {
			t.Errorf("Events: %v", evs)
		}
	})
	t.Run("same name", func(t *testing.T) {
		c1 := shopRemote("c1")
		e := start(t, Options{}, nil, c1)
		e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
		c2 := newFakeRemote("c2", remoteService("shop", "web", "10.112.0.10", 80), export("shop", "web"),
			remoteSlice("shop", "web", "w", 80, ep{ip: "10.245.0.1", ready: true}))
		if err := e.c.AddRemote(c2.remote()); err != nil {
			t.Fatal(err)
		}
		e.waitSynced("c2")
		// The HA case merges: c2's endpoint joins c1's mirror, no clash.
		eventually(t, func() error {
			var addrs []string
			for _, sl := range e.slices("shop", "web") {
				for _, ep := range sl.Endpoints {
					addrs = append(addrs, ep.Addresses...)
				}
			}
			slices.Sort(addrs)
			if !slices.Equal(addrs, []string{"10.112.0.10", "10.96.0.10"}) {
				return fmt.Errorf("endpoints of shop/web %v, want both clusters' cluster IPs", addrs)
			}
			return nil
		})
		never(t, 50*time.Millisecond, func() error {
			s, err := e.service("shop", "web")
			if err != nil || s.Labels[LabelMirroredFromCluster] != "c1" {
				return fmt.Errorf("c1's mirror taken over: %v %v", s, err)
			}
			if n := len(e.slices("shop", "web")); n != 2 {
				return fmt.Errorf("%d slices for shop/web, want 2", n)
			}
			return nil
		})
		for _, ev := range e.events() {
			if strings.Contains(ev, EventReasonClash) {
				t.Errorf("clash Event for the HA case: %s", ev)
			}
		}
		// c1 stops exporting: c2 gets the name.
		c1.deleteExport(t, "shop", "web")
		e.checkMirror("shop", "web", "c2", "shop/web", "10.112.0.10", true, 80)
	})
}

func TestNeverDeletesWhatItDoesNotOwn(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	// Same name as a mirror, labelled by someone else's tool.
	lookalike := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop",
		Labels: map[string]string{liveness.LabelManagedBy: "helm"}}}
	// A meshd mirror of a cluster this process does not manage.
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop",
		Labels:      map[string]string{liveness.LabelManagedBy: liveness.ManagedBy, LabelMirroredFromCluster: "elsewhere"},
		Annotations: map[string]string{AnnotationMirroredFrom: "shop/api"}}}
	r := shopRemote("c1")
	e := start(t, Options{}, []runtime.Object{ns, lookalike, other}, r)
	eventually(t, func() error {
		if gaugeValue(t, e.metrics.clashes.WithLabelValues("c1")) != 1 {
			return errors.New("clash not reported")
		}
		return nil
	})
	r.deleteExport(t, "shop", "web")
	e.c.RemoveRemote("c1")
	never(t, 100*time.Millisecond, func() error {
		for _, n := range []string{"web", "api"} {
			if _, err := e.service("shop", n); err != nil {
				return fmt.Errorf("Service shop/%s not ours was deleted: %w", n, err)
			}
		}
		return nil
	})
	s, _ := e.service("shop", "web")
	if s.Labels[liveness.LabelManagedBy] != "helm" || s.Labels[LabelMirroredFromCluster] != "" {
		t.Errorf("foreign Service changed: %v", s.Labels)
	}
}

func TestRemoveRemoteDeletesItsMirrors(t *testing.T) {
	r := shopRemote("c1")
	e := start(t, Options{}, nil, r)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
	e.c.RemoveRemote("c1")
	e.waitGone("shop", "web")
}

func TestWatchLinks(t *testing.T) {
	r := shopRemote("c1")
	link := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: clusterlink.LinkSecretPrefix + "c1", Namespace: "meshd-system",
			Labels:      map[string]string{clusterlink.LabelClusterLink: "true"},
			Annotations: map[string]string{clusterlink.AnnotationRemoteCluster: "c1"}},
		Data: map[string][]byte{clusterlink.LinkKubeconfigKey: []byte("kubeconfig-of-c1")},
	}
	// A mirror of a cluster no longer linked: an orphan to delete.
	orphan := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "old", Namespace: "shop",
		Labels:      map[string]string{liveness.LabelManagedBy: liveness.ManagedBy, LabelMirroredFromCluster: "gone"},
		Annotations: map[string]string{AnnotationMirroredFrom: "shop/old"}}}
	e := start(t, Options{}, []runtime.Object{link, orphan})
	var built atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- e.c.watchLinks(ctx, e.local, "meshd-system", func(name string, kc []byte) (Remote, error) {
			if name != "c1" || string(kc) != "kubeconfig-of-c1" {
				return Remote{}, fmt.Errorf("unexpected link %s %q", name, kc)
			}
			built.Add(1)
			return r.remote(), nil
		})
	}()
	defer func() { cancel(); <-done }()
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
	e.waitGone("shop", "old")
	// Unlinked: its mirrors go.
	if err := e.local.CoreV1().Secrets("meshd-system").Delete(context.Background(), link.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitGone("shop", "web")
	if built.Load() != 1 {
		t.Errorf("built %d remotes, want 1", built.Load())
	}
}

func TestStandaloneKeepsOtherClustersMirrors(t *testing.T) {
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop",
		Labels:      map[string]string{liveness.LabelManagedBy: liveness.ManagedBy, LabelMirroredFromCluster: "c9"},
		Annotations: map[string]string{AnnotationMirroredFrom: "shop/api"}}}
	e := start(t, Options{}, []runtime.Object{other}, shopRemote("c1"))
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
	if _, err := e.service("shop", "api"); err != nil {
		t.Fatalf("another mirror's Service deleted: %v", err)
	}
}

func TestLeaderElection(t *testing.T) {
	kube := fake.NewClientset()
	le := LeaderElection{Namespace: "meshd-system", Name: "meshd-mirror",
		LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 50 * time.Millisecond}
	var active atomic.Int32
	var maxActive atomic.Int32
	run := func(ctx context.Context) error {
		n := active.Add(1)
		if n > maxActive.Load() {
			maxActive.Store(n)
		}
		<-ctx.Done()
		active.Add(-1)
		return nil
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	errs := make(chan error, 2)
	a, b := le, le
	a.Identity, b.Identity = "a", "b"
	go func() { errs <- RunLeaderElected(ctx1, testLogger(t), kube, a, run) }()
	eventually(t, func() error {
		if active.Load() != 1 {
			return errors.New("a not leading")
		}
		return nil
	})
	go func() { errs <- RunLeaderElected(ctx2, testLogger(t), kube, b, run) }()
	time.Sleep(200 * time.Millisecond)
	if maxActive.Load() != 1 {
		t.Fatalf("%d replicas active at once", maxActive.Load())
	}
	cancel1() // a releases the Lease; b takes over
	if err := <-errs; err != nil {
		t.Fatalf("a: %v", err)
	}
	eventually(t, func() error {
		if active.Load() != 1 {
			return errors.New("b not leading")
		}
		return nil
	})
	cancel2()
	if err := <-errs; err != nil {
		t.Fatalf("b: %v", err)
	}
	if maxActive.Load() != 1 {
		t.Fatalf("%d replicas active at once", maxActive.Load())
	}
}

func TestDesiredSlicesDualStackAndChunks(t *testing.T) {
	k := Key{Cluster: "c1", Namespace: "ns", Name: "s"}
	src := remoteService("ns", "s", "10.96.0.1", 80)
	src.Spec.ClusterIPs = []string{"10.96.0.1", "fd00::1"}
	got := desiredSlices(k, "s", src, nil)
	if len(got) != 2 || got[0].AddressType != discoveryv1.AddressTypeIPv4 || got[1].AddressType != discoveryv1.AddressTypeIPv6 {
		t.Fatalf("dual-stack slices %+v", got)
	}
	if deref(got[0].Endpoints[0].Conditions.Ready) {
		t.Errorf("ready without remote endpoints")
	}
	var eps []ep
	for i := range 250 {
		eps = append(eps, ep{ip: fmt.Sprintf("10.244.%d.%d", i/200, i%200), ready: true})
	}
	src.Spec.ClusterIP, src.Spec.ClusterIPs = corev1.ClusterIPNone, nil
	got = desiredSlices(k, "s", src, []*discoveryv1.EndpointSlice{remoteSlice("ns", "s", "x", 80, eps...)})
	if len(got) != 3 || len(got[0].Endpoints) != 100 || len(got[2].Endpoints) != 50 {
		t.Fatalf("chunks: %d slices", len(got))
	}
	names := map[string]bool{}
	for _, sl := range got {
		names[sl.Name] = true
		if !strings.HasPrefix(sl.Name, "s-") || len(sl.Name) > 63 {
			t.Errorf("slice name %q", sl.Name)
		}
	}
	if len(names) != 3 {
		t.Errorf("slice names not distinct: %v", names)
	}
	if MirrorName(k, true) != "s-c1" || MirrorName(k, false) != "s" {
		t.Errorf("mirror names")
	}
	if validMirrorName(strings.Repeat("a", 61)+"-c1") == nil {
		t.Errorf("a 63+ character mirror name is valid")
	}
}

// The local cache can lag meshd's own previous write of a slice, so an
// update meets a conflict; the slice is read again and the update retried
// at once, not after a failed sync and a backoff.
func TestSliceUpdateConflictRetried(t *testing.T) {
	r := shopRemote("c1")
	// The reactor is installed before the Controller starts (the fake's
	// reactor chain is not safe to change while it runs) and armed only
	// once the first mirror is written, so the conflict hits the update.
	var armed atomic.Bool
	var conflicts atomic.Int32
	conflict := func(a clienttesting.Action) (bool, runtime.Object, error) {
		if !armed.Load() {
			return false, nil, nil
		}
		if conflicts.Add(1) == 1 {
			sl := a.(clienttesting.UpdateAction).GetObject().(*discoveryv1.EndpointSlice)
			return true, nil, apierrors.NewConflict(discoveryv1.Resource("endpointslices"), sl.Name,
				fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
		}
		return false, nil, nil
	}
	e := startWith(t, Options{}, func(c *fake.Clientset) { c.PrependReactor("update", "endpointslices", conflict) }, nil, r)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)

	armed.Store(true)
	r.updateService(t, "shop", "web", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.7.7", []string{"10.96.7.7"}
	})
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.7.7", true, 80)
	if n := conflicts.Load(); n < 2 {
		t.Fatalf("%d EndpointSlice updates, want the conflicting one and its retry", n)
	}
	if got := testutil.ToFloat64(e.metrics.errors.WithLabelValues("c1")); got != 0 {
		t.Fatalf("%v sync errors counted, want 0 (the conflict is retried inside the sync)", got)
	}
}

// TestCachesKeepNoManagedFields: the mirror's informer caches, local and
// remote, hold no managedFields (the mirror never reads them), and it
// mirrors as before.
func TestCachesKeepNoManagedFields(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate}}
	svc, exp := remoteService("shop", "web", "10.96.0.10", 80), export("shop", "web")
	sl := remoteSlice("shop", "web", "web-abc", 8080, ep{ip: "10.244.1.5", ready: true})
	svc.ManagedFields, sl.ManagedFields = managed, managed
	exp.SetManagedFields(managed)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", ManagedFields: managed}}
	r := newFakeRemote("c1", svc, exp, sl)
	e := start(t, Options{}, []runtime.Object{ns}, r)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)

	e.c.mu.Lock()
	rc := e.c.remotes["c1"]
	e.c.mu.Unlock()
	stores := map[string]cache.Store{
		"local Services": e.c.services.GetStore(), "local Namespaces": e.c.nss.GetStore(), "local EndpointSlices": e.c.slices.GetStore(),
		"remote Services": rc.services.GetStore(), "remote EndpointSlices": rc.slices.GetStore(), "remote ServiceExports": rc.exports.GetStore(),
	}
	eventually(t, func() error { // the caches catch up with the mirror's writes
		for name, s := range stores {
			if len(s.List()) == 0 {
				return fmt.Errorf("%s: empty cache", name)
			}
		}
		return nil
	})
	for name, s := range stores {
		for _, o := range s.List() {
			m, err := meta.Accessor(o)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if m.GetManagedFields() != nil {
				t.Errorf("%s: %s/%s cached with its managedFields", name, m.GetNamespace(), m.GetName())
			}
		}
	}
}
