//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/e2e/testbed"
)

// TestMirrorLeaseNamespaceMissing: `meshd mirror` started against the real
// API server with a --namespace that does not exist says once, clearly,
// what is missing (no client-go line per leader-election retry); when the
// namespace is created it says so, takes the leader Lease there and mirrors.
func TestMirrorLeaseNamespaceMissing(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	n := s.node(testbed.NodeOptions{Name: "m1", Location: "a"})
	ns := fmt.Sprintf("mirror-missing-%d", time.Now().UnixNano()%1_000_000)
	proc, err := n.Start("mirror", tb.MeshdBinary, "mirror", "--kubeconfig", tb.Kubeconfig, "--namespace", ns,
		"--listen", "127.0.0.1:9478")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("----- meshd mirror log\n%s", testbed.Tail(proc.LogPath, 60))
		}
		_ = tb.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	const said = "the namespace of the leader Lease does not exist"
	s.eventually(30*time.Second, 250*time.Millisecond, "meshd mirror says the namespace is missing", func() error {
		if proc.Exited() {
			return fmt.Errorf("meshd mirror exited: %v\n%s", proc.Err(), testbed.Tail(proc.LogPath, 20))
		}
		if !strings.Contains(testbed.Tail(proc.LogPath, 200), said) {
			return fmt.Errorf("not said yet")
		}
		return nil
	})
	// Leader election retries every 2 s: after 5 of its periods the log
	// still says it once, and nothing else about the Lease.
	time.Sleep(10 * time.Second)
	log := testbed.Tail(proc.LogPath, 500)
	if c := strings.Count(log, said); c != 1 {
		t.Errorf("the missing namespace was said %d times in 10 s, want once:\n%s", c, log)
	}
	for _, noise := range []string{"leader election record", "error retrieving resource lock", "failed to acquire lease"} {
		if strings.Contains(log, noise) {
			t.Errorf("the log repeats leader election errors (%q):\n%s", noise, log)
		}
	}
	if !strings.Contains(log, "kubectl create namespace "+ns) {
		t.Errorf("the message does not say what to create:\n%s", log)
	}

	if _, err := tb.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.eventually(30*time.Second, 250*time.Millisecond, "meshd mirror holds the Lease meshd-mirror in "+ns, func() error {
		l, err := tb.Kube.CoordinationV1().Leases(ns).Get(ctx, "meshd-mirror", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return fmt.Errorf("the Lease has no holder")
		}
		return nil
	})
	if log := testbed.Tail(proc.LogPath, 500); !strings.Contains(log, "exists now") {
		t.Errorf("the namespace's appearance was not said:\n%s", log)
	} else {
		t.Logf("meshd mirror log:\n%s", log)
	}
}
