package mirror

import (
	"context"
	"errors"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// waitForLeaseNamespace returns once the Lease's namespace exists (or ctx
// ends). Without it, leader election retries forever with a client-go line
// every retry period that does not say what to do. It asks the API server
// with a dry-run create of the Lease (the right leader election already
// needs; nothing is stored): "namespace not found" is said once, clearly,
// and its appearance once more. Any other answer (the Lease exists, no
// permission, API unreachable) ends the wait: leader election reports
// those itself.
func waitForLeaseNamespace(ctx context.Context, log *slog.Logger, kube kubernetes.Interface, le LeaderElection, interval time.Duration) error {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name}}
	waited := time.Time{}
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := kube.CoordinationV1().Leases(le.Namespace).Create(rctx, lease, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		cancel()
		if !namespaceMissing(err) {
			if !waited.IsZero() {
				log.Info("the leader Lease's namespace exists now; starting leader election",
					"namespace", le.Namespace, "waited", time.Since(waited).Round(time.Second))
			}
			return nil
		}
		if waited.IsZero() {
			waited = time.Now()
			log.Error("the namespace of the leader Lease does not exist: create it (kubectl create namespace "+le.Namespace+
				") or pass --namespace with an existing one; waiting for it without further messages",
				"namespace", le.Namespace, "lease", le.Name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// namespaceMissing tells the API server's answer to a create in a
// namespace that does not exist: 404 naming the namespace.
func namespaceMissing(err error) bool {
	var se apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &se) {
		return false
	}
	d := se.Status().Details
	return d != nil && d.Kind == "namespaces"
}
