package clusterlink

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	meshdfake "meshd.io/meshd/pkg/k8s/client/clientset/versioned/fake"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
)

type ctlEnv struct {
	t      *testing.T
	kube   *fake.Clientset
	meshd  *meshdfake.Clientset
	writes atomic.Int64
	stop   func()
}

// startController runs a link controller over fake local clients.
func startController(t *testing.T, kube *fake.Clientset, md *meshdfake.Clientset) *ctlEnv {
	t.Helper()
	e := &ctlEnv{t: t, kube: kube, meshd: md}
	c := NewController(kube, md, ControllerOptions{Namespace: "meshd-system", LeaseDuration: 4 * time.Second, TakeoverDelay: time.Second,
		Resync: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, func() { e.writes.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.stop = func() { cancel(); <-done }
	t.Cleanup(func() {
		if ctx.Err() == nil {
			e.stop()
		}
	})
	return e
}

func (e *ctlEnv) waitLink(name, what string, ok func(*v1alpha1.ClusterLink) bool) *v1alpha1.ClusterLink {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cl, err := e.meshd.MeshdV1alpha1().ClusterLinks().Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && ok(cl) || err != nil && ok(nil) {
			return cl
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: ClusterLink %s: %+v (%v)", what, name, cl, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The controller turns a link Secret and the linked cluster's Nodes into a
// ClusterLink: the agreement in spec, one leader per location in status.
// Then it is idle (no write without a change), and a node reading the
// ClusterLink gets the peers RemotePeers gives, trust policy included.
func TestControllerWritesClusterLink(t *testing.T) {
	w1 := remoteNode(t, "w1", "a", "198.51.100.101", "10.52.1.0/24")
	w3 := remoteNode(t, "w3", "b", "198.51.100.103", "10.52.3.0/24")
	remote := fakeRemoteAPI(t, *w1, *w3)
	sec := linkSecret(LinkSecretPrefix+"west", "west", remote.URL)
	sec.Annotations[AnnotationRemoteAllowedCIDRs] = "10.52.0.0/16,10.97.0.0/16"
	e := startController(t, fake.NewClientset(sec), meshdfake.NewSimpleClientset())
	cl := e.waitLink("west", "leaders written", func(cl *v1alpha1.ClusterLink) bool { return cl != nil && len(cl.Status.Leaders) == 2 })
	if cl.Spec.SecretName != sec.Name || !cl.Spec.AllowedCIDRsRecorded || !slices.Equal(cl.Spec.AllowedCIDRs, []string{"10.52.0.0/16", "10.97.0.0/16"}) ||
		!slices.Equal(cl.Spec.ServiceCIDRs, []string{"10.97.0.0/16"}) || cl.Spec.Port != 51820 {
		t.Errorf("spec %+v", cl.Spec)
	}
	r := RemoteFromObject(cl)
	if r.Err != nil || !r.Observed {
		t.Fatalf("remote %+v", r)
	}
	if len(cl.Spec.MeshCIDRs) == 0 || len(r.Link.MeshCIDRs) != len(cl.Spec.MeshCIDRs) || r.Link.MeshCIDRs[0].String() != cl.Spec.MeshCIDRs[0] {
		t.Errorf("mesh CIDRs %v from the spec's %v", r.Link.MeshCIDRs, cl.Spec.MeshCIDRs)
	}
	guard := mesh.RemoteGuard{Local: []netip.Prefix{netip.MustParsePrefix("10.52.3.0/24")}} // overlaps w3's pod CIDR
	got, problems := r.Peers(guard)
	ls, _, _ := LinkFromSecret(sec)
	want, wantProblems := RemotePeers(ls, []*corev1.Node{w1, w3}, guard)
	if len(got) != len(want) || len(problems) != len(wantProblems) || len(problems) == 0 {
		t.Fatalf("peers from the ClusterLink %+v (%v), want %+v (%v)", got, problems, want, wantProblems)
	}
	for i := range wantProblems {
		if problems[i].Error() != wantProblems[i].Error() {
			t.Errorf("problem %d: %v, want %v", i, problems[i], wantProblems[i])
		}
	}
	for i := range want {
		if got[i].Name != want[i].Name || got[i].PublicKey != want[i].PublicKey || !slices.Equal(got[i].AllowedIPs, want[i].AllowedIPs) {
			t.Errorf("peer %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// Idle: resyncs and wake-ups write nothing.
	time.Sleep(200 * time.Millisecond)
	before := e.writes.Load()
	upd := sec.DeepCopy()
	upd.ResourceVersion = "7"
	if _, err := e.kube.CoreV1().Secrets("meshd-system").Update(context.Background(), upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if n := e.writes.Load() - before; n != 0 {
		t.Errorf("%d ClusterLink writes without a change", n)
	}
	// Unlinked: the ClusterLink goes.
	if err := e.kube.CoreV1().Secrets("meshd-system").Delete(context.Background(), sec.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLink("west", "deleted", func(cl *v1alpha1.ClusterLink) bool { return cl == nil })
}

// A controller that restarts while the linked cluster's API server does not
// answer keeps the ClusterLink's last known leaders: its only write is the
// Reachable condition.
func TestControllerRestartKeepsLeaders(t *testing.T) {
	w1 := remoteNode(t, "w1", "a", "198.51.100.101", "10.52.1.0/24")
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "etcd unavailable", http.StatusInternalServerError)
	}))
	t.Cleanup(down.Close)
	sec := linkSecret(LinkSecretPrefix+"west", "west", down.URL) // answers every request with an error
	ls, _, _ := LinkFromSecret(sec)
	leaders, live, err := Leaders(ls, []*corev1.Node{w1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := &v1alpha1.ClusterLink{ObjectMeta: metav1.ObjectMeta{Name: "west"}, Spec: Spec(sec),
		Status: v1alpha1.ClusterLinkStatus{Leaders: LeaderStatus(leaders, live),
			Conditions: []metav1.Condition{{Type: ConditionSynced, Status: metav1.ConditionTrue, Reason: "Listed", LastTransitionTime: metav1.Now()}}}}
	e := startController(t, fake.NewClientset(sec), meshdfake.NewSimpleClientset(old))
	e.waitLink("west", "reported unreachable", func(cl *v1alpha1.ClusterLink) bool {
		return cl != nil && RemoteFromObject(cl).Unreachable
	})
	time.Sleep(time.Second) // resyncs and retries
	cl := e.waitLink("west", "kept", func(cl *v1alpha1.ClusterLink) bool { return cl != nil })
	r := RemoteFromObject(cl)
	if len(cl.Status.Leaders) != 1 || cl.Status.Leaders[0].Name != "w1" || !r.Observed || r.Err != nil {
		t.Errorf("after a restart with the linked cluster down: %+v", cl.Status)
	}
	if n := e.writes.Load(); n != 1 {
		t.Errorf("%d writes by a controller that cannot see the linked cluster, want 1 (the Reachable condition)", n)
	}
}

// A linked API server that hangs fails no watch for minutes; Leases silent
// for more than half the lease duration (its nodes renew every quarter)
// mark it unreachable, once, and a Lease event would mark it reachable.
func TestCheckSilence(t *testing.T) {
	now := time.Unix(1000, 0)
	w := NewLinkLiveness(slog.New(slog.NewTextHandler(io.Discard, nil)), "meshd-system", 40*time.Second, 30*time.Second, time.Hour, func() {})
	w.now = func() time.Time { return now }
	r := &remoteLeases{liveness: liveness.NewLiveness(40*time.Second, w.now)}
	w.remotes["meshd-link-west"] = r
	if w.CheckSilence() {
		t.Fatal("a cluster never heard from is not silent")
	}
	r.lastEvent.Store(now.UnixNano())
	r.reach.Store(reachYes)
	now = now.Add(20 * time.Second)
	if w.CheckSilence() {
		t.Fatal("silent for half the lease duration: not yet")
	}
	now = now.Add(time.Second)
	if !w.CheckSilence() {
		t.Fatal("silent for more than half the lease duration: unreachable")
	}
	if ok, known := w.Reachable("meshd-link-west"); ok || !known {
		t.Errorf("Reachable = %v, %v", ok, known)
	}
	if w.CheckSilence() {
		t.Error("reported twice")
	}
}
