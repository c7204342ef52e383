package liveness

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"meshd.io/meshd/internal/testlog"
)

func TestHeartbeatRenew(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	h := &heartbeat{c: c, namespace: "ns", node: "n1", interval: 10 * time.Second}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	if err := h.renew(ctx, t0); err != nil {
		t.Fatal(err)
	}
	l, err := c.CoordinationV1().Leases("ns").Get(ctx, "meshd-n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *l.Spec.HolderIdentity != "n1" || *l.Spec.LeaseDurationSeconds != 40 || !l.Spec.RenewTime.Time.Equal(t0) || l.Labels[LabelNode] != "n1" {
		t.Fatalf("created lease: %+v", l)
	}
	acquired := l.Spec.AcquireTime.Time

	if err := h.renew(ctx, t0.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	l, _ = c.CoordinationV1().Leases("ns").Get(ctx, "meshd-n1", metav1.GetOptions{})
	if !l.Spec.RenewTime.Time.Equal(t0.Add(10*time.Second)) || !l.Spec.AcquireTime.Time.Equal(acquired) {
		t.Fatalf("renewed lease: %+v", l.Spec)
	}

	// Someone deleted the lease: the cached copy fails once, then the
	// lease is recreated.
	if err := c.CoordinationV1().Leases("ns").Delete(ctx, "meshd-n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.renew(ctx, t0.Add(20*time.Second)); err == nil {
		t.Fatal("renewing a deleted lease succeeded")
	} else if !errors.Is(err, errLeaseDeleted) || errors.Is(err, errNamespaceMissing) {
		t.Fatalf("renewing a deleted lease: %v, want errLeaseDeleted only", err)
	}
	if err := h.renew(ctx, t0.Add(30*time.Second)); err != nil {
		t.Fatalf("recreating: %v", err)
	}
	if _, err := c.CoordinationV1().Leases("ns").Get(ctx, "meshd-n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestRunHeartbeat(t *testing.T) {
	c := fake.NewClientset()
	// The namespace is missing for the first two attempts.
	var mu sync.Mutex
	creates := 0
	c.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		creates++
		if creates <= 2 {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "meshd-system")
		}
		return false, nil, nil
	})
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunHeartbeat(ctx, c, "", "n1", 5*time.Millisecond, log) }()

	var renews []time.Time
	deadline := time.Now().Add(10 * time.Second)
	for len(renews) < 3 && time.Now().Before(deadline) {
		l, err := c.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), "meshd-n1", metav1.GetOptions{})
		if err == nil {
			if rt := l.Spec.RenewTime.Time; len(renews) == 0 || !rt.Equal(renews[len(renews)-1]) {
				renews = append(renews, rt)
			}
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunHeartbeat returned %v on cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RunHeartbeat did not stop")
	}
	if len(renews) < 3 {
		t.Fatalf("saw %d distinct renewals, want 3", len(renews))
	}
	if !strings.Contains(logs.String(), "namespace is missing") {
		t.Errorf("missing namespace not logged clearly; logs:\n%s", logs.String())
	}
	if err := RunHeartbeat(context.Background(), c, "", "", time.Second, nil); err == nil {
		t.Error("empty node name accepted")
	}
}

// A Lease deleted under a running heartbeat (its namespace still there): the
// failed renewal says the Lease was deleted, not that the namespace is
// missing, and the next renewal creates it again.
func TestRunHeartbeatLeaseDeleted(t *testing.T) {
	c := fake.NewClientset()
	var mu sync.Mutex
	deleted := false
	c.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if !deleted { // someone deletes the Lease just before this renewal
			deleted = true
			if err := c.Tracker().Delete(a.GetResource(), a.GetNamespace(), "meshd-n1"); err != nil {
				t.Errorf("deleting the Lease: %v", err)
			}
		}
		return false, nil, nil
	})
	var logs testlog.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunHeartbeat(ctx, c, "ns", "n1", 5*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "renewed again") {
		if time.Now().After(deadline) {
			t.Fatalf("the Lease was not renewed again after its deletion; logs:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunHeartbeat returned %v on cancel", err)
	}
	if strings.Contains(logs.String(), "namespace is missing") {
		t.Errorf("a deleted Lease logged as a missing namespace; logs:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "heartbeat Lease was deleted") {
		t.Errorf("the deletion is not logged as such; logs:\n%s", logs.String())
	}
	if _, err := c.CoordinationV1().Leases("ns").Get(context.Background(), "meshd-n1", metav1.GetOptions{}); err != nil {
		t.Errorf("the Lease was not created again: %v", err)
	}
}
