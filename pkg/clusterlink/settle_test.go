package clusterlink

import (
	"context"
	"log/slog"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	meshdfake "meshd.io/meshd/pkg/k8s/client/clientset/versioned/fake"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// TestSettled: a linked cluster's liveness settles a lease duration after
// its Lease watch began to answer (again); unreachable or never answered
// is not settled; a cluster without a watch is.
func TestSettled(t *testing.T) {
	now := time.Unix(1000, 0)
	w := NewLinkLiveness(slog.New(slog.DiscardHandler), "meshd-system", 40*time.Second, 0, 0, func() {})
	w.now = func() time.Time { return now }
	if ok, _ := w.Settled("link-none"); !ok {
		t.Error("a cluster without a watch counts as settled")
	}
	r := &remoteLeases{}
	w.remotes["link-a"] = r
	if ok, wait := w.Settled("link-a"); ok || wait != 40*time.Second {
		t.Errorf("never answered: settled %v, wait %v", ok, wait)
	}
	r.reach.Store(reachYes)
	r.since.Store(now.UnixNano())
	now = now.Add(15 * time.Second)
	if ok, wait := w.Settled("link-a"); ok || wait != 25*time.Second {
		t.Errorf("15 s after answering: settled %v, wait %v", ok, wait)
	}
	now = now.Add(25 * time.Second)
	if ok, _ := w.Settled("link-a"); !ok {
		t.Error("a lease duration after answering: not settled")
	}
	r.reach.Store(reachNo)
	if ok, _ := w.Settled("link-a"); ok {
		t.Error("unreachable counts as settled")
	}
}

func TestNoneLive(t *testing.T) {
	for _, c := range []struct {
		live map[string]bool
		want bool
	}{
		{nil, false}, // liveness unknown: every node counts as live
		{map[string]bool{}, true},
		{map[string]bool{"a": false, "b": false}, true},
		{map[string]bool{"a": false, "b": true}, false},
	} {
		if got := noneLive(c.live); got != c.want {
			t.Errorf("noneLive(%v) = %v, want %v", c.live, got, c.want)
		}
	}
}

// While a linked cluster's liveness settles, every sync keeps its last
// leaders and asks for a sync when it has settled: one wake-up however many
// syncs asked (a timer reset, not one more timer per sync).
func TestSettlingWakeUpNotStacked(t *testing.T) {
	const leaseDuration = 2 * time.Second // far longer than the syncs below take
	w1 := remoteNode(t, "w1", "a", "198.51.100.101", "10.52.1.0/24")
	sec := linkSecret(LinkSecretPrefix+"west", "west", "https://192.0.2.1:6443")
	ls, _, err := LinkFromSecret(sec)
	if err != nil {
		t.Fatal(err)
	}
	leaders, live, err := Leaders(ls, []*corev1.Node{w1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cur := &v1alpha1.ClusterLink{ObjectMeta: metav1.ObjectMeta{Name: "west"}, Spec: Spec(sec),
		Status: v1alpha1.ClusterLinkStatus{Leaders: LeaderStatus(leaders, live)}}
	c := NewController(fake.NewClientset(), meshdfake.NewSimpleClientset(), ControllerOptions{Namespace: "meshd-system",
		LeaseDuration: leaseDuration, Logger: slog.New(slog.DiscardHandler)}, nil)
	c.wake = make(chan struct{}, 100) // keeps every wake-up

	// The linked cluster's Leases are listed, and w1's stopped an hour ago:
	// not one of its nodes looks live, and its Lease watch has not answered
	// for a lease duration yet.
	lease := testLease("w1", "1", time.Now().Add(-time.Hour))
	leases := syncedLeaseInformer(t, lease)
	l := liveness.NewLiveness(leaseDuration, time.Now)
	l.Observe(lease)
	c.live.remotes[sec.Name] = &remoteLeases{liveness: l, leases: leases}

	rc := RemoteCluster{Settings: ls, Secret: sec, Nodes: []*corev1.Node{w1}, Synced: true}
	for range 20 {
		st, _ := c.status(cur, rc)
		if !sameJSON(st.Leaders, cur.Status.Leaders) {
			t.Fatalf("settling: leaders %+v, want the last ones %+v", st.Leaders, cur.Status.Leaders)
		}
	}
	select {
	case <-c.wake:
	case <-time.After(10 * leaseDuration):
		t.Fatal("no wake-up after the cluster settled")
	}
	time.Sleep(leaseDuration / 2)
	if n := len(c.wake); n != 0 {
		t.Errorf("%d more wake-ups: 20 syncs while settling stacked their timers", n)
	}
}

// While a linked cluster's liveness settles, its last leaders stay if none
// of them was seen dying, even when another node looks live first (after
// an outage the Leases renew in any order, and one stale on first sight is
// dead until renewed); a last leader seen live and then expiring is
// replaced at once (a failover).
func TestSettlingKeepsLeadersNotSeenDying(t *testing.T) {
	const leaseDuration = 40 * time.Second
	w1 := remoteNode(t, "w1", "a", "198.51.100.101", "10.52.1.0/24")
	w1.Annotations[convert.AnnotationLeader] = "true"
	w2 := remoteNode(t, "w2", "a", "198.51.100.102", "10.52.2.0/24")
	nodes := []*corev1.Node{w1, w2}
	sec := linkSecret(LinkSecretPrefix+"west", "west", "https://192.0.2.1:6443")
	ls, _, err := LinkFromSecret(sec)
	if err != nil {
		t.Fatal(err)
	}
	leaders, live, err := Leaders(ls, nodes, nil)
	if err != nil || len(leaders) != 1 || leaders[0].Name != "w1" {
		t.Fatalf("leaders without liveness %+v (%v), want w1", leaders, err)
	}
	cur := &v1alpha1.ClusterLink{ObjectMeta: metav1.ObjectMeta{Name: "west"}, Spec: Spec(sec),
		Status: v1alpha1.ClusterLinkStatus{Leaders: LeaderStatus(leaders, live)}}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }

	// The Lease informer only has to be synced and hold a Lease for the
	// controller to judge; the decisions come from l.
	leases := syncedLeaseInformer(t, testLease("w1", "1", now))
	status := func(l *liveness.Liveness) []v1alpha1.ClusterLinkLeader {
		c := NewController(fake.NewClientset(), meshdfake.NewSimpleClientset(), ControllerOptions{Namespace: "meshd-system",
			LeaseDuration: leaseDuration, Logger: slog.New(slog.DiscardHandler)}, nil)
		c.wake = make(chan struct{}, 100)
		c.live.remotes[sec.Name] = &remoteLeases{liveness: l, leases: leases} // never answered: not settled
		st, _ := c.status(cur, RemoteCluster{Settings: ls, Secret: sec, Nodes: nodes, Synced: true})
		return st.Leaders
	}

	// First sight after a 45 s outage: w1's Lease is stale, w2's fresh.
	l := liveness.NewLiveness(leaseDuration, clock)
	l.Observe(testLease("w1", "1", now.Add(-45*time.Second)))
	l.Observe(testLease("w2", "1", now.Add(-5*time.Second)))
	if got := status(l); len(got) != 1 || got[0].Name != "w1" {
		t.Errorf("w1 stale on first sight, w2 live: leaders %+v, want w1 kept", got)
	}

	// w1 seen live, then expiring: w2 takes over at once.
	l = liveness.NewLiveness(leaseDuration, clock)
	l.Observe(testLease("w1", "1", now))
	l.Observe(testLease("w2", "1", now))
	now = now.Add(leaseDuration + time.Second)
	l.Observe(testLease("w2", "2", now))
	if got := status(l); len(got) != 1 || got[0].Name != "w2" {
		t.Errorf("w1 seen expiring: leaders %+v, want w2", got)
	}
}

// testLease is node's heartbeat Lease in meshd-system, renewed at renew.
func testLease(node, rv string, renew time.Time) *coordinationv1.Lease {
	mt := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: liveness.LeaseName(node), Namespace: "meshd-system", ResourceVersion: rv},
		Spec: coordinationv1.LeaseSpec{RenewTime: &mt}}
}

// syncedLeaseInformer is a synced Lease informer holding leases, running
// until the test ends.
func syncedLeaseInformer(t *testing.T, leases ...*coordinationv1.Lease) cache.SharedIndexInformer {
	t.Helper()
	objs := make([]runtime.Object, len(leases))
	for i, l := range leases {
		objs[i] = l
	}
	inf := informers.NewSharedInformerFactoryWithOptions(fake.NewClientset(objs...), 0, informers.WithNamespace("meshd-system")).
		Coordination().V1().Leases().Informer()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("Lease informer not synced")
	}
	return inf
}
