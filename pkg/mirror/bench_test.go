package mirror

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
)

const benchServices = 500

// benchRemote is a remote cluster exporting n Services in 10 namespaces.
func benchRemote(n int) *fakeRemote {
	var objs []runtime.Object
	for i := range n {
		ns, name := fmt.Sprintf("ns%d", i%10), fmt.Sprintf("svc%d", i)
		objs = append(objs,
			remoteService(ns, name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80),
			export(ns, name),
			remoteSlice(ns, name, name+"-x", 8080, ep{ip: fmt.Sprintf("10.244.%d.%d", i/250, i%250+1), ready: true}))
	}
	r := newFakeRemote("c1", objs...)
	r.kube = newFastClientset(r.kube.Tracker().List)
	return r
}

// newFastClientset is a fake clientset without the field-managed object
// tracker of fake.NewClientset, which builds a REST mapper on every write
// and would dominate the figures (~3ms a write). objs fills it.
func newFastClientset(list func(schema.GroupVersionResource, schema.GroupVersionKind, string, ...metav1.ListOptions) (runtime.Object, error)) *fake.Clientset {
	var objs []runtime.Object
	for _, gvr := range []struct {
		r schema.GroupVersionResource
		k schema.GroupVersionKind
	}{
		{corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service")},
		{discoveryv1.SchemeGroupVersion.WithResource("endpointslices"), discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice")},
	} {
		if list == nil {
			break
		}
		l, err := list(gvr.r, gvr.k, "")
		if err != nil {
			panic(err)
		}
		items, _ := meta.ExtractList(l)
		objs = append(objs, items...)
	}
	// The fake watchers panic when their buffer (watch.DefaultChanSize) is
	// full, which fast fake writes can do before an informer catches up.
	watch.DefaultChanSize = 100_000
	return fake.NewSimpleClientset(objs...) //nolint:staticcheck // SA1019: deliberately the fast tracker.
}

// localWrites records when the local client last wrote each Service and
// when each EndpointSlice was first created.
type localWrites struct {
	mu       sync.Mutex
	services map[string]time.Time // ns/name of an updated Service → time
	ports    map[string]int32     // its first port then
	slices   int
	allDone  chan struct{}
	want     int
}

func watchLocal(local *fake.Clientset, want int) *localWrites {
	w := &localWrites{services: map[string]time.Time{}, ports: map[string]int32{}, allDone: make(chan struct{}), want: want}
	local.PrependReactor("create", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		w.mu.Lock()
		w.slices++
		if w.slices == w.want {
			close(w.allDone)
		}
		w.mu.Unlock()
		return false, nil, nil
	})
	local.PrependReactor("update", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.UpdateAction).GetObject().(*corev1.Service)
		w.mu.Lock()
		w.services[s.Namespace+"/"+s.Name] = time.Now()
		w.ports[s.Namespace+"/"+s.Name] = s.Spec.Ports[0].Port
		w.mu.Unlock()
		return false, nil, nil
	})
	return w
}

func benchController(b *testing.B, local *fake.Clientset, r *fakeRemote) (*Controller, func()) {
	c := New(testLogger(b), local, record.NewFakeRecorder(1000), NewMetrics(nil), Options{Resync: -1, ProbeInterval: time.Second})
	if err := c.AddRemote(r.remote()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx)
	}()
	return c, func() { cancel(); <-done }
}

// BenchmarkInitialSync mirrors 500 exported Services from scratch.
func BenchmarkInitialSync(b *testing.B) {
	var total time.Duration
	for range b.N {
		b.StopTimer()
		r := benchRemote(benchServices)
		local := newFastClientset(nil)
		w := watchLocal(local, benchServices)
		b.StartTimer()
		t0 := time.Now()
		_, stop := benchController(b, local, r)
		select {
		case <-w.allDone:
		case <-time.After(60 * time.Second):
			b.Fatalf("only %d of %d mirrors after 60s", w.slices, benchServices)
		}
		total += time.Since(t0)
		b.StopTimer()
		stop()
		b.StartTimer()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/sync-500")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPropagation changes the port of one remote Service at a time
// (100 changes per iteration, 500 mirrors in place) and measures from the
// remote write to the local write of the mirror; "burst" makes 100 changes
// at once.
func BenchmarkPropagation(b *testing.B) {
	for _, burst := range []bool{false, true} {
		name := "sequential"
		if burst {
			name = "burst"
		}
		b.Run(name, func(b *testing.B) {
			r := benchRemote(benchServices)
			local := newFastClientset(nil)
			w := watchLocal(local, benchServices)
			_, stop := benchController(b, local, r)
			defer stop()
			<-w.allDone
			var lat []time.Duration
			port := int32(1000)
			b.ResetTimer()
			for range b.N {
				port++
				var keys []string
				starts := map[string]time.Time{}
				for i := range 100 {
					ns, svc := fmt.Sprintf("ns%d", (i*5)%10), fmt.Sprintf("svc%d", i*5)
					key := ns + "/" + svc
					keys = append(keys, key)
					starts[key] = time.Now()
					r.updateService(b, ns, svc, func(s *corev1.Service) { s.Spec.Ports[0].Port = port })
					if !burst {
						lat = append(lat, waitPort(b, w, key, port, starts[key]))
					}
				}
				if burst {
					for _, key := range keys {
						lat = append(lat, waitPort(b, w, key, port, starts[key]))
					}
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(lat[len(lat)/2].Seconds()*1000, "p50-ms")
			b.ReportMetric(lat[len(lat)*99/100].Seconds()*1000, "p99-ms")
			b.ReportMetric(lat[len(lat)-1].Seconds()*1000, "max-ms")
			if p99 := lat[len(lat)*99/100]; p99 > 2*time.Second {
				b.Errorf("p99 change→local update %s, want under 2s", p99)
			}
		})
	}
}

// waitPort waits until the local mirror key was written with port and
// returns the time from start to that write.
func waitPort(b *testing.B, w *localWrites, key string, port int32, start time.Time) time.Duration {
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		t, p := w.services[key], w.ports[key]
		w.mu.Unlock()
		if p == port {
			return t.Sub(start)
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: port %d never reached the mirror", key, port)
		}
		time.Sleep(200 * time.Microsecond)
	}
}
