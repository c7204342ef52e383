package mirror

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"meshd.io/meshd/internal/testlog"
)

// TestLeaseNamespaceMissing: started where the Lease's namespace does not
// exist, leader election waits, says so once (not once per retry), and
// when the namespace appears says so and leads.
func TestLeaseNamespaceMissing(t *testing.T) {
	kube := fake.NewClientset()
	var exists atomic.Bool
	var probes atomic.Int32
	// What the API server answers to a create in a missing namespace.
	kube.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		probes.Add(1)
		if !exists.Load() {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, a.GetNamespace())
		}
		return false, nil, nil
	})
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	le := LeaderElection{Namespace: "meshd-missing", Name: "meshd-mirror", Identity: "a",
		LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 20 * time.Millisecond}
	var leading atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- RunLeaderElected(ctx, log, kube, le, func(ctx context.Context) error {
			leading.Store(true)
			<-ctx.Done()
			return nil
		})
	}()
	eventually(t, func() error {
		if probes.Load() < 10 {
			return errors.New("fewer than 10 probes")
		}
		return nil
	})
	if leading.Load() {
		t.Fatal("leading without the Lease's namespace")
	}
	out := logs.String()
	if n := strings.Count(out, "does not exist"); n != 1 {
		t.Fatalf("the missing namespace was reported %d times after %d probes, want once:\n%s", n, probes.Load(), out)
	}
	if !strings.Contains(out, "kubectl create namespace meshd-missing") {
		t.Errorf("the message does not say what to do:\n%s", out)
	}

	exists.Store(true)
	eventually(t, func() error {
		if !leading.Load() {
			return errors.New("not leading")
		}
		return nil
	})
	if !strings.Contains(logs.String(), "exists now") {
		t.Errorf("the namespace's appearance was not reported:\n%s", logs.String())
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestLeaseNamespacePresentSaysNothing: with the namespace there, nothing
// about it is logged.
func TestLeaseNamespacePresentSaysNothing(t *testing.T) {
	var logs testlog.Buffer
	err := waitForLeaseNamespace(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)), fake.NewClientset(),
		LeaderElection{Namespace: "meshd-system", Name: "meshd-mirror"}, time.Millisecond)
	if err != nil || logs.String() != "" {
		t.Fatalf("err %v, logs %q", err, logs.String())
	}
}

// TestLeaseNamespaceOtherErrorsProceed: an answer that is not "namespace
// not found" (no permission, the API server down) ends the wait at once;
// leader election reports those itself.
func TestLeaseNamespaceOtherErrorsProceed(t *testing.T) {
	kube := fake.NewClientset()
	kube.PrependReactor("create", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "meshd-mirror", errors.New("no"))
	})
	var logs testlog.Buffer
	err := waitForLeaseNamespace(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)), kube,
		LeaderElection{Namespace: "meshd-system", Name: "meshd-mirror"}, time.Hour)
	if err != nil || logs.String() != "" {
		t.Fatalf("err %v, logs %q", err, logs.String())
	}
}
