package mirror

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

// fakeRemote is a remote cluster of fake clients that can go down.
type fakeRemote struct {
	name string
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
	down atomic.Bool
}

func (r *fakeRemote) remote() Remote {
	return Remote{Name: r.name, Kube: r.kube, Dynamic: r.dyn, Probe: func(context.Context) error {
		if r.down.Load() {
			return fmt.Errorf("cluster %s: connection refused", r.name)
		}
		return nil
	}}
}

func newFakeRemote(name string, objs ...runtime.Object) *fakeRemote {
	var kube, dyn []runtime.Object
	for _, o := range objs {
		if _, ok := o.(*unstructured.Unstructured); ok {
			dyn = append(dyn, o)
		} else {
			kube = append(kube, o)
		}
	}
	return &fakeRemote{
		name: name,
		kube: fake.NewClientset(kube...),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{ServiceExportGVR: "ServiceExportList"}, dyn...),
	}
}

type env struct {
	t       *testing.T
	local   *fake.Clientset
	rec     *record.FakeRecorder
	clock   *fakeClock
	metrics *Metrics
	c       *Controller
	cancel  context.CancelFunc
	done    chan struct{}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() && os.Getenv("MIRROR_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start runs a Controller over local objects and remotes.
func start(t *testing.T, opts Options, local []runtime.Object, remotes ...*fakeRemote) *env {
	t.Helper()
	return startWith(t, opts, nil, local, remotes...)
}

// startWith is start with prepare run on the local fake client before the
// Controller starts. Reactors must be installed there: the fake's reactor
// chain is not safe to change while the Controller's goroutines call it.
func startWith(t *testing.T, opts Options, prepare func(*fake.Clientset), local []runtime.Object, remotes ...*fakeRemote) *env {
	t.Helper()
	e := &env{t: t, local: fake.NewClientset(local...), rec: record.NewFakeRecorder(100),
		clock: &fakeClock{t: time.Unix(1_700_000_000, 0)}, metrics: NewMetrics(nil), done: make(chan struct{})}
	if prepare != nil {
		prepare(e.local)
	}
	if opts.ProbeInterval == 0 {
		opts.ProbeInterval = 5 * time.Millisecond
	}
	opts.Now = e.clock.Now
	opts.Resync = -1
	e.c = New(testLogger(t), e.local, e.rec, e.metrics, opts)
	for _, r := range remotes {
		if err := e.c.AddRemote(r.remote()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		if err := e.c.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(e.stop)
	for _, r := range remotes {
		e.waitSynced(r.name)
	}
	return e
}

func (e *env) stop() {
	e.cancel()
	<-e.done
}

func (e *env) waitSynced(cluster string) {
	e.t.Helper()
	eventually(e.t, func() error {
		e.c.mu.Lock()
		r := e.c.remotes[cluster]
		e.c.mu.Unlock()
		if r == nil || !r.synced.Load() {
			return fmt.Errorf("cluster %s not synced", cluster)
		}
		return nil
	})
}

func eventually(t testing.TB, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in time: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// never checks f stays nil-error for d.
func never(t testing.TB, d time.Duration, f func() error) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if err := f(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *env) service(ns, name string) (*corev1.Service, error) {
	return e.local.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
}

func (e *env) slices(ns, name string) []discoveryv1.EndpointSlice {
	l, err := e.local.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

// waitGone waits until ns/name and its slices are gone.
func (e *env) waitGone(ns, name string) {
	e.t.Helper()
	eventually(e.t, func() error {
		switch _, err := e.service(ns, name); {
		case err == nil:
			return fmt.Errorf("service %s/%s still there", ns, name)
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("service %s/%s: %w", ns, name, err)
		}
		if n := len(e.slices(ns, name)); n > 0 {
			return fmt.Errorf("%d slices of %s/%s still there", n, ns, name)
		}
		return nil
	})
}

// Remote object builders.

func remoteService(ns, name, ip string, ports ...int32) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": name},
			ClusterIP: ip, ClusterIPs: []string{ip},
		},
	}
	for _, p := range ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: corev1.ProtocolTCP})
	}
	return s
}

func export(ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(ServiceExportGVR.GroupVersion().String())
	u.SetKind("ServiceExport")
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

type ep struct {
	ip       string
	ready    bool
	hostname string
}

func remoteSlice(ns, svc, name string, port int32, eps ...ep) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr(fmt.Sprintf("p%d", port)), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready)},
			NodeName: ptr("remote-node"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "p"}}
		if e.hostname != "" {
			x.Hostname = ptr(e.hostname)
		}
		sl.Endpoints = append(sl.Endpoints, x)
	}
	return sl
}

// Remote object changes.

func (r *fakeRemote) updateService(t testing.TB, ns, name string, f func(*corev1.Service)) {
	t.Helper()
	s, err := r.kube.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f(s)
	if _, err := r.kube.CoreV1().Services(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (r *fakeRemote) createExport(t testing.TB, ns, name string) {
	t.Helper()
	if _, err := r.dyn.Resource(ServiceExportGVR).Namespace(ns).Create(context.Background(), export(ns, name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (r *fakeRemote) deleteExport(t testing.TB, ns, name string) {
	t.Helper()
	if err := r.dyn.Resource(ServiceExportGVR).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// events drains the recorder.
func (e *env) events() []string {
	var out []string
	for {
		select {
		case s := <-e.rec.Events:
			out = append(out, s)
		default:
			return out
		}
	}
}
