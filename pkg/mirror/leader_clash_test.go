package mirror

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"meshd.io/meshd/pkg/k8s/liveness"
)

// A controller whose leader Lease name is a node's heartbeat Lease (a node
// named mirror: meshd-mirror) refuses to lead with it, saying what to
// change, instead of overwriting that node's heartbeat; a Lease of that
// name that is no heartbeat (a previous leader's) is its own to take.
func TestLeaderElectionRefusesHeartbeatLease(t *testing.T) {
	mt := metav1.NewMicroTime(time.Now())
	dur := int32(40)
	heartbeat := func(holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "meshd-mirror", Namespace: "meshd-system",
				Labels: map[string]string{liveness.LabelManagedBy: liveness.ManagedBy, liveness.LabelNode: holder}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, RenewTime: &mt},
		}
	}
	le := LeaderElection{Namespace: "meshd-system", Name: "meshd-mirror", Identity: "meshd-mirror-6c8d9-abcde",
		LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 50 * time.Millisecond}

	kube := fake.NewClientset(heartbeat("mirror"))
	ran := false
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := RunLeaderElected(ctx, testLogger(t), kube, le, func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, ErrHeartbeatClash) || !strings.Contains(err.Error(), "node mirror") || !strings.Contains(err.Error(), "--lease-name") {
		t.Fatalf("RunLeaderElected = %v, want ErrHeartbeatClash naming node mirror and --lease-name", err)
	}
	if ran {
		t.Error("led with a node's heartbeat Lease")
	}
	l, gerr := kube.CoordinationV1().Leases("meshd-system").Get(ctx, "meshd-mirror", metav1.GetOptions{})
	if gerr != nil || *l.Spec.HolderIdentity != "mirror" {
		t.Errorf("the heartbeat was written: %v %v", l, gerr)
	}

	// A previous replica's Lease (held by a pod, no heartbeat labels) is taken.
	prev := heartbeat("meshd-mirror-old-pod")
	prev.Labels = nil
	prev.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Minute)}
	one := int32(1)
	prev.Spec.LeaseDurationSeconds = &one
	kube = fake.NewClientset(prev)
	led := make(chan struct{})
	go func() {
		_ = RunLeaderElected(ctx, testLogger(t), kube, le, func(c context.Context) error { close(led); <-c.Done(); return nil })
	}()
	select {
	case <-led:
	case <-ctx.Done():
		t.Fatal("did not lead with a previous replica's expired Lease")
	}
}
