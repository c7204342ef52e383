package liveness

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"

	"meshd.io/meshd/internal/testlog"
)

// controllerLease is the leader Lease of `meshd link`, as client-go's
// leader election writes it, held by the controller's pod.
func controllerLease(name, holder string, renewed time.Time) *coordinationv1.Lease {
	dur := int32(15)
	mt := metav1.NewMicroTime(renewed)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: DefaultNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &mt, RenewTime: &mt},
	}
}

// A Lease named like node link's heartbeat but held by another component's
// pod (meshd link's leader Lease, meshd-link) is no node's heartbeat: its
// renewals never make a node named link look live.
func TestNodeNameFromLeaseNeedsTheNodeAsHolder(t *testing.T) {
	now := time.Now()
	held := func(h string) *coordinationv1.Lease { return controllerLease("meshd-link", h, now) }
	noHolder := controllerLease("meshd-link", "", now)
	noHolder.Spec.HolderIdentity = nil
	for _, c := range []struct {
		name string
		l    *coordinationv1.Lease
		want bool
	}{
		{"held by the node", held("link"), true},
		{"held by no one named (written without a holder)", noHolder, true},
		{"held by the link controller's pod", held("meshd-link-7d9f8c6b5-x2x4z"), false},
		{"released by leader election", held(""), false},
	} {
		node, ok := NodeNameFromLease(c.l)
		if ok != c.want || (ok && node != "link") {
			t.Errorf("%s: NodeNameFromLease = %q, %v; want link, %v", c.name, node, ok, c.want)
		}
	}
	l := NewLiveness(40*time.Second, time.Now)
	if l.Observe(held("meshd-link-7d9f8c6b5-x2x4z")) {
		t.Error("the controller's leader Lease was observed as node link's heartbeat")
	}
	if _, known := l.Live()["link"]; known {
		t.Error("node link judged from the controller's leader Lease")
	}
}

// A node whose heartbeat Lease name is taken by another component's Lease
// leaves that Lease alone and says why, instead of overwriting the other
// component's leader election every interval.
func TestRunHeartbeatLeavesForeignLease(t *testing.T) {
	renewed := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	c := fake.NewClientset(controllerLease("meshd-link", "meshd-link-7d9f8c6b5-x2x4z", renewed))
	var logs testlog.Buffer
	results := make(chan error, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunHeartbeatWith(ctx, c, HeartbeatOptions{Namespace: DefaultNamespace, Node: "link", Interval: 5 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			Result: func(err error) {
				select {
				case results <- err:
				default:
				}
			}})
	}()
	for range 3 {
		select {
		case err := <-results:
			if err != nil {
				t.Errorf("the API server answered, but the heartbeat reported %v (as if unreachable)", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no renewal attempt")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunHeartbeat returned %v on cancel", err)
	}
	l, err := c.CoordinationV1().Leases(DefaultNamespace).Get(context.Background(), "meshd-link", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *l.Spec.HolderIdentity != "meshd-link-7d9f8c6b5-x2x4z" || !l.Spec.RenewTime.Time.Equal(renewed) || l.Labels[LabelNode] != "" {
		t.Errorf("the controller's Lease was written: holder %q, renewed %v (was %v), labels %v", *l.Spec.HolderIdentity, l.Spec.RenewTime.Time, renewed, l.Labels)
	}
	if !strings.Contains(logs.String(), "taken by another component") || !strings.Contains(logs.String(), "--lease-name") {
		t.Errorf("the clash is not said as such; logs:\n%s", logs.String())
	}
}

// A node name longer than a label value may be (63 characters; node names
// may have up to 253) still gets a heartbeat Lease with valid labels: it
// goes without the meshd.io/node label, which nothing selects by, instead
// of failing every renewal.
func TestHeartbeatLongNodeName(t *testing.T) {
	ctx := context.Background()
	node := "worker-" + strings.Repeat("0123456789", 6) + ".example.com"
	c := fake.NewClientset()
	h := &heartbeat{c: c, namespace: "ns", node: node, interval: 10 * time.Second,
		candidate: func() (bool, bool) { return true, true }}
	if err := h.renew(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	l, err := c.CoordinationV1().Leases("ns").Get(ctx, LeaseName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range l.Labels {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label %s=%q, which the API server refuses: %v", k, v, errs)
		}
	}
	if l.Labels[LabelCandidate] != "true" || l.Labels[LabelManagedBy] != ManagedBy {
		t.Errorf("labels %v", l.Labels)
	}
	if got, ok := NodeNameFromLease(l); !ok || got != node {
		t.Errorf("NodeNameFromLease = %q, %v", got, ok)
	}
	if err := h.renew(ctx, time.Now()); err != nil {
		t.Fatalf("second renewal: %v", err)
	}
	// A short name keeps its label.
	if err := (&heartbeat{c: c, namespace: "ns", node: "n1", interval: time.Second}).renew(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if l, err := c.CoordinationV1().Leases("ns").Get(ctx, "meshd-n1", metav1.GetOptions{}); err != nil || l.Labels[LabelNode] != "n1" {
		t.Errorf("n1's Lease: %v %v", l, err)
	}
}
