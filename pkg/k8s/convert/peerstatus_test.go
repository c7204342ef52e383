package convert

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/client/clientset/versioned/fake"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func statusPeer(name string) *v1alpha1.Peer {
	return &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 3}}
}

func TestPeerStatusForLeaderEntryAndConditions(t *testing.T) {
	p := statusPeer("laptop")
	r := PeerReport{Node: "n1", Location: "a", Leader: true, Locations: map[string]bool{"a": true, "b": true},
		Peers: map[string]PeerFinding{"laptop": {Accepted: true, Applied: true, LastHandshake: t0.Add(-30 * time.Second)}}}
	st, changed := PeerStatusFor(p, r, t0)
	if !changed {
		t.Fatal("a new entry is a change")
	}
	if len(st.Leaders) != 1 || st.Leaders[0].Node != "n1" || st.Leaders[0].Location != "a" || !st.Leaders[0].Applied || st.Leaders[0].ObservedGeneration != 3 {
		t.Fatalf("leaders = %+v", st.Leaders)
	}
	if hs := st.Leaders[0].LastHandshakeTime; hs == nil || !hs.Time.Equal(t0.Add(-30*time.Second)) {
		t.Fatalf("handshake = %v, want %v", hs, t0.Add(-30*time.Second))
	}
	if st.LastHandshakeTime == nil || !st.LastHandshakeTime.Equal(st.Leaders[0].LastHandshakeTime) {
		t.Fatalf("summary handshake = %v", st.LastHandshakeTime)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.PeerAccepted); c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.PeerReasonValid {
		t.Fatalf("Accepted = %+v", c)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.PeerApplied); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != 3 {
		t.Fatalf("Applied = %+v", c)
	}

	// The same report on the written object: no change, no write.
	p.Status = st
	if _, changed := PeerStatusFor(p, r, t0.Add(time.Minute)); changed {
		t.Fatal("an unchanged report must not change the status")
	}
	// Handshakes every 2 minutes: moved forward only when 3 minutes newer.
	r.Peers["laptop"] = PeerFinding{Accepted: true, Applied: true, LastHandshake: t0.Add(90 * time.Second)}
	if _, changed := PeerStatusFor(p, r, t0.Add(2*time.Minute)); changed {
		t.Fatal("a handshake 2 minutes newer than the written one must not cause a write")
	}
	r.Peers["laptop"] = PeerFinding{Accepted: true, Applied: true, LastHandshake: t0.Add(210 * time.Second)}
	st2, changed := PeerStatusFor(p, r, t0.Add(4*time.Minute))
	if !changed || !st2.LastHandshakeTime.Time.Equal(t0.Add(210*time.Second)) {
		t.Fatalf("a handshake 4 minutes newer must be written: changed=%v %v", changed, st2.LastHandshakeTime)
	}
	// The transition time stays while the status stays.
	if c := meta.FindStatusCondition(st2.Conditions, v1alpha1.PeerApplied); !c.LastTransitionTime.Time.Equal(t0) {
		t.Fatalf("Applied transition time moved to %v", c.LastTransitionTime)
	}
}

func TestPeerStatusForInvalidAndOtherLeaders(t *testing.T) {
	p := statusPeer("gw")
	hs := metav1.NewTime(t0.Add(-10 * time.Minute))
	p.Status.Leaders = []v1alpha1.PeerLeaderStatus{
		{Location: "b", Node: "n3", Accepted: true, Applied: true, LastHandshakeTime: &hs},
		{Location: "gone", Node: "n9", Accepted: true, Applied: true},
		{Location: "a", Node: "n2", Accepted: true, Applied: true}, // n1 took over location a
	}
	r := PeerReport{Node: "n1", Location: "a", Leader: true, Locations: map[string]bool{"a": true, "b": true},
		Peers: map[string]PeerFinding{"gw": {Message: `converting peer "gw": reading the preshared key: not found`}}}
	st, changed := PeerStatusFor(p, r, t0)
	if !changed {
		t.Fatal("want a change")
	}
	if len(st.Leaders) != 2 || st.Leaders[0].Location != "a" || st.Leaders[0].Node != "n1" || st.Leaders[0].Accepted || st.Leaders[1].Node != "n3" {
		t.Fatalf("leaders = %+v (want n1's entry replacing n2's, n3's kept, the gone location dropped)", st.Leaders)
	}
	acc := meta.FindStatusCondition(st.Conditions, v1alpha1.PeerAccepted)
	if acc == nil || acc.Status != metav1.ConditionFalse || acc.Reason != v1alpha1.PeerReasonInvalid || !strings.Contains(acc.Message, "preshared key") {
		t.Fatalf("Accepted = %+v", acc)
	}
	if app := meta.FindStatusCondition(st.Conditions, v1alpha1.PeerApplied); app == nil || app.Status != metav1.ConditionTrue {
		t.Fatalf("Applied = %+v (n3 applied it)", app)
	}
	if st.LastHandshakeTime == nil || !st.LastHandshakeTime.Equal(&hs) {
		t.Fatalf("summary handshake = %v, want n3's", st.LastHandshakeTime)
	}

	// No longer leader: only the own entry goes, others stay untouched.
	p.Status = st
	st, changed = PeerStatusFor(p, PeerReport{Node: "n1", Location: "a"}, t0)
	if !changed || len(st.Leaders) != 1 || st.Leaders[0].Node != "n3" {
		t.Fatalf("after losing leadership: changed=%v leaders=%+v", changed, st.Leaders)
	}
	if acc := meta.FindStatusCondition(st.Conditions, v1alpha1.PeerAccepted); acc.Status != metav1.ConditionTrue {
		t.Fatalf("Accepted = %+v after the invalid report left", acc)
	}
}

func TestPeerStatusForCap(t *testing.T) {
	p := statusPeer("x")
	for i := range MaxPeerStatusLeaders {
		loc := string(rune('A'+i%26)) + string(rune('a'+i/26))
		p.Status.Leaders = append(p.Status.Leaders, v1alpha1.PeerLeaderStatus{Location: loc, Node: loc, Accepted: true})
	}
	r := PeerReport{Node: "late", Location: "late", Leader: true, Peers: map[string]PeerFinding{"x": {Accepted: true}}}
	st, _ := PeerStatusFor(p, r, t0)
	if len(st.Leaders) != MaxPeerStatusLeaders {
		t.Fatalf("%d entries, want the cap %d", len(st.Leaders), MaxPeerStatusLeaders)
	}
}

// TestPeerStatusWriter writes through a fake clientset: one write for a
// change, none for an unchanged report, and a failing write retried (logged
// once) without Report ever blocking.
func TestPeerStatusWriter(t *testing.T) {
	p := statusPeer("laptop")
	p.ResourceVersion = "1"
	client := fake.NewSimpleClientset(p.DeepCopy())
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if err := store.Add(p.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	fail := make(chan struct{}, 1)
	fail <- struct{}{}
	var writes int
	client.PrependReactor("update", "peers", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		writes++
		select {
		case <-fail:
			return true, nil, apierrors.NewServiceUnavailable("down")
		default:
		}
		obj := a.(k8stesting.UpdateAction).GetObject().(*v1alpha1.Peer)
		if err := store.Update(obj.DeepCopy()); err != nil { // what the informer would do
			return true, nil, err
		}
		return false, nil, nil
	})
	var logs bytes.Buffer
	w := NewPeerStatusWriter(PeerStatusOptions{Peers: client.MeshdV1alpha1(), Store: store, Now: func() time.Time { return t0 },
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	r := PeerReport{Node: "n1", Location: "a", Leader: true, Peers: map[string]PeerFinding{"laptop": {Accepted: true, Applied: true}}}
	w.Report(r)
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := client.MeshdV1alpha1().Peers().Get(ctx, "laptop", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Leaders) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never written (writes %d); log:\n%s", writes, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.Report(r) // unchanged: nothing queued
	for w.queue.Len() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if writes != 2 {
		t.Errorf("%d status writes, want 2 (one failed, one retried)", writes)
	}
	if n := strings.Count(logs.String(), "writing the Peer status failed"); n != 1 {
		t.Errorf("failure logged %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "Peer status written again") {
		t.Errorf("recovery not logged:\n%s", logs.String())
	}
}
