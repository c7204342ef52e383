package liveness

import (
	"context"
	"crypto/sha256"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"meshd.io/meshd/pkg/mesh"
)

func meshNode(name, loc string) mesh.Node {
	return mesh.Node{Name: name, Location: loc, PublicKey: sha256.Sum256([]byte(name))}
}

// Only the leader candidates vote: a non-candidate's report changes
// nothing, and when a candidate's Lease expires the next node in leader
// order becomes one, and its votes count.
func TestDecideCandidates(t *testing.T) {
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := NewLiveness(40*time.Second, clock.Now)
	nodes := []mesh.Node{meshNode("a1", "a"), meshNode("a2", "a"), meshNode("a3", "a"), meshNode("a4", "a"), meshNode("b1", "b"), meshNode("b2", "b")}
	rv := 0
	obs := func(node string, r Report) {
		rv++
		l.Observe(leaseWith(node, fmt.Sprint(rv), clock.Now(), r))
	}
	obs("a1", Report{Up: []string{"a2"}})
	obs("a2", Report{Up: []string{"a1"}})
	obs("a3", Report{Down: []string{"a1", "a2"}}) // not a candidate: no vote
	obs("b1", Report{})
	d := l.DecideCandidates(nodes, mesh.GranularityLocation, 2)
	cands := d.Candidates
	// b2 has no Lease: walked past, a candidate, not judged.
	if want := map[string]bool{"a1": true, "a2": true, "b1": true, "b2": true}; !reflect.DeepEqual(cands, want) {
		t.Fatalf("candidates %v, want %v", cands, want)
	}
	if want := map[string]bool{"a1": true, "a2": true, "a3": true, "b1": true}; !reflect.DeepEqual(d.Live, want) {
		t.Fatalf("Live %v, want everyone with a Lease live (a3 does not vote)", d.Live)
	}
	// a1 stops renewing: once its Lease expired, a3 is a candidate and its
	// votes count: a2 down, the only live voter on it (a1's vote is dead).
	for range 4 {
		clock.Step(10 * time.Second)
		obs("a2", Report{Up: []string{"a3"}})
		obs("a3", Report{Down: []string{"a2"}})
		obs("b1", Report{})
	}
	if !l.Changed() {
		t.Fatal("a1's expiry is no change")
	}
	d = l.DecideCandidates(nodes, mesh.GranularityLocation, 2)
	cands = d.Candidates
	if want := map[string]bool{"a1": true, "a2": true, "a3": true, "b1": true, "b2": true}; !reflect.DeepEqual(cands, want) {
		t.Fatalf("after a1's expiry: candidates %v, want %v", cands, want)
	}
	if want := map[string]bool{"a1": false, "a2": false, "a3": true, "b1": true}; !reflect.DeepEqual(d.Live, want) {
		t.Fatalf("after a1's expiry: Live %v, want %v", d.Live, want)
	}
	// Full mesh: nothing to elect, no votes.
	if d := l.DecideCandidates(nodes, mesh.GranularityFull, 2); len(d.Candidates) != 0 || !d.Live["a2"] {
		t.Errorf("full mesh: candidates %v, Live %v", d.Candidates, d.Live)
	}
}

// The heartbeat labels the Lease of a candidate, unlabels it when it no
// longer is one, writes at once on a change (a trigger) and never when
// nothing changed, and leaves the label alone while candidacy is unknown.
func TestHeartbeatCandidate(t *testing.T) {
	c := fake.NewClientset()
	old := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "meshd-n1", Namespace: DefaultNamespace, Labels: map[string]string{LabelCandidate: "true"}}}
	if _, err := c.CoordinationV1().Leases(DefaultNamespace).Create(context.Background(), old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	writes := 0
	candidate, known := false, false
	c.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		writes++
		return false, nil, nil
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return writes }
	set := func(c, k bool) { mu.Lock(); defer mu.Unlock(); candidate, known = c, k }
	trigger := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- RunHeartbeatWith(ctx, c, HeartbeatOptions{Node: "n1", Interval: time.Hour, Trigger: trigger, MinGap: time.Millisecond,
			Candidate: func() (bool, bool) { mu.Lock(); defer mu.Unlock(); return candidate, known }})
	}()
	get := func() *coordinationv1.Lease {
		l, err := c.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), "meshd-n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	waitFor := func(what string, f func(l *coordinationv1.Lease) bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !f(get()); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s: %v", what, get().Labels)
			}
		}
	}
	waitFor("the first renewal", func(l *coordinationv1.Lease) bool { return l.Spec.RenewTime != nil })
	if get().Labels[LabelCandidate] != "true" {
		t.Fatal("the label was not left alone while candidacy was unknown")
	}
	set(false, true)
	trigger <- struct{}{}
	waitFor("the label removed", func(l *coordinationv1.Lease) bool { _, ok := l.Labels[LabelCandidate]; return !ok })
	n := count()
	trigger <- struct{}{}
	time.Sleep(100 * time.Millisecond)
	if count() != n {
		t.Errorf("a trigger with nothing new wrote the Lease (%d writes, want %d)", count(), n)
	}
	set(true, true)
	trigger <- struct{}{}
	waitFor("the label back", func(l *coordinationv1.Lease) bool {
		return l.Labels[LabelCandidate] == "true" && l.Labels[LabelNode] == "n1"
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
