package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"meshd.io/meshd/pkg/k8s/liveness"
)

// LeaderElection names the coordination Lease that keeps one replica of the
// mirror active.
type LeaderElection struct {
	Namespace, Name string
	// Identity is this replica's (e.g. the pod name).
	Identity string
	// Durations; zero takes 15s, 10s and 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// ErrHeartbeatClash is returned when the leader Lease's name is a node's
// meshd heartbeat Lease (meshd-<node> in the same namespace: a node named
// link or mirror): leading with it would overwrite that node's heartbeat.
var ErrHeartbeatClash = errors.New("the leader Lease's name is a node's heartbeat Lease")

// heartbeatClash checks the leader Lease is no node's heartbeat. A Lease
// that cannot be read is left to leader election to report.
func heartbeatClash(ctx context.Context, kube kubernetes.Interface, le LeaderElection) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := kube.CoordinationV1().Leases(le.Namespace).Get(rctx, le.Name, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || l.Labels[liveness.LabelManagedBy] != liveness.ManagedBy {
		return nil
	}
	if node, ok := liveness.NodeNameFromLease(l); ok {
		return fmt.Errorf("lease %s/%s is the heartbeat of node %s: %w; give this controller another --lease-name", le.Namespace, le.Name, node, ErrHeartbeatClash)
	}
	return nil
}

// ErrLostLease is returned when this replica stops leading before ctx ends.
var ErrLostLease = errors.New("lost the leader Lease")

// RunLeaderElected runs run while this replica holds the Lease. It returns
// when ctx ends (releasing the Lease) or, with ErrLostLease, when the Lease
// is lost; run's context is cancelled first and run has returned.
func RunLeaderElected(ctx context.Context, log *slog.Logger, kube kubernetes.Interface, le LeaderElection, run func(context.Context) error) error {
	if le.LeaseDuration == 0 {
		le.LeaseDuration = 15 * time.Second
	}
	if le.RenewDeadline == 0 {
		le.RenewDeadline = 10 * time.Second
	}
	if le.RetryPeriod == 0 {
		le.RetryPeriod = 2 * time.Second
	}
	if err := waitForLeaseNamespace(ctx, log, kube, le, le.RetryPeriod); err != nil {
		return nil // ctx ended while waiting
	}
	if err := heartbeatClash(ctx, kube, le); err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		stopped bool
		running bool
		runErr  error
		ended   bool // run returned by itself
		done    = make(chan struct{})
	)
	ectx, ecancel := context.WithCancel(ctx)
	defer ecancel()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, Name: le.Name, ReleaseOnCancel: true,
		LeaseDuration: le.LeaseDuration, RenewDeadline: le.RenewDeadline, RetryPeriod: le.RetryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				mu.Lock()
				if stopped {
					mu.Unlock()
					return
				}
				running = true
				mu.Unlock()
				defer close(done)
				log.Info("leading", "lease", le.Namespace+"/"+le.Name, "identity", le.Identity)
				err := run(lctx)
				mu.Lock()
				runErr, ended = err, lctx.Err() == nil
				mu.Unlock()
				ecancel() // release the Lease

			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if id != le.Identity {
					log.Info("another replica leads; standing by", "lease", le.Namespace+"/"+le.Name, "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("setting up leader election on Lease %s/%s: %w", le.Namespace, le.Name, err)
	}
	elector.Run(ectx)
	mu.Lock()
	stopped = true
	wasRunning := running
	mu.Unlock()
	if wasRunning {
		<-done
	}
	mu.Lock()
	defer mu.Unlock()
	if runErr != nil {
		return runErr
	}
	if ctx.Err() == nil && wasRunning && !ended {
		return fmt.Errorf("lease %s/%s: %w", le.Namespace, le.Name, ErrLostLease)
	}
	return nil
}
