package mirror

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"meshd.io/meshd/pkg/k8s/liveness"
)

// TestEndpointsFollowTheTunnel: the local location leader's heartbeat Lease
// says the tunnel to c2 is down (meshd.io/clusters-down): c2's imported
// endpoints turn not ready and not serving, the slice stays; the tunnel up
// again makes them ready; a down report that goes stale (the Lease not
// renewed) holds for tunnelHold, then is unknown: the endpoints follow the
// source again. Nothing is deleted.
func TestEndpointsFollowTheTunnel(t *testing.T) {
	c2 := newFakeRemote("c2", remoteService("shop", "web", "10.112.0.10", 80), exportAt("shop", "web", t0),
		remoteSlice("shop", "web", "web-c2", 8080, ep{ip: "10.245.0.1", ready: true}))
	lease := reportLease(liveness.Report{ClustersUp: []string{"c2"}})
	e := startMCS(t, Options{NoMirrors: true, LeaseNamespace: "meshd-system", GracePeriod: time.Hour}, append(localObjects(nil), lease), nil, c2)
	state := func(ready, serving bool) func() error {
		return func() error {
			sls := e.importSlices("shop", "web")
			if len(sls) != 1 || len(sls[0].Endpoints) != 1 {
				return fmt.Errorf("%d slices", len(sls))
			}
			c := sls[0].Endpoints[0].Conditions
			if c.Ready == nil || *c.Ready != ready || c.Serving == nil || *c.Serving != serving {
				return fmt.Errorf("ready %v serving %v, want %v %v", c.Ready, c.Serving, ready, serving)
			}
			return nil
		}
	}
	update := func(r liveness.Report, version string) {
		t.Helper()
		updateReport(t, e.local, lease, r, version)
	}
	eventually(t, state(true, true))
	if up, known := e.c.opts.Health.Reachable("c2"); !up || !known {
		t.Fatalf("Reachable(c2) = %v %v, want up", up, known)
	}
	update(liveness.Report{ClustersDown: []string{"c2"}}, "2")
	eventually(t, state(false, false))
	update(liveness.Report{ClustersUp: []string{"c2"}}, "3")
	eventually(t, state(true, true))
	update(liveness.Report{ClustersDown: []string{"c2"}}, "4")
	eventually(t, state(false, false))
	// The leader's Lease is not renewed any more: its word expires, but a
	// down verdict holds for tunnelHold (a leader restarting during an
	// outage has no word yet); then the endpoints follow the source.
	e.clock.Advance(41 * time.Second)
	never(t, 1500*time.Millisecond, state(false, false)) // past a recompute (every second)
	e.clock.Advance(tunnelHold)
	eventually(t, state(true, true))
	if _, known := e.c.opts.Health.Reachable("c2"); known {
		t.Error("a stale report still counts")
	}
}

// TestMirrorsFollowTheTunnel: the Linkerd-style mirrors follow the tunnel
// as the MCS imports do: a location leader reporting the tunnel to c1 down
// turns the mirror's endpoint not ready (the Service and slice stay), the
// tunnel up again ready.
func TestMirrorsFollowTheTunnel(t *testing.T) {
	lease := reportLease(liveness.Report{ClustersDown: []string{"c1"}})
	e := start(t, Options{LeaseNamespace: "meshd-system"}, []runtime.Object{lease}, shopRemote("c1"))
	// Created while the tunnel is down: not ready.
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", false, 80)
	update := func(r liveness.Report, version string) {
		t.Helper()
		updateReport(t, e.local, lease, r, version)
	}
	update(liveness.Report{ClustersUp: []string{"c1"}}, "2")
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
	update(liveness.Report{ClustersDown: []string{"c1"}}, "3")
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", false, 80)
	if s := e.slices("shop", "web")[0]; deref(s.Endpoints[0].Conditions.Serving) {
		t.Error("a mirror endpoint behind a down tunnel still serving")
	}
}

// reportLease is the heartbeat Lease of a local leader publishing r.
func reportLease(r liveness.Report) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: liveness.LeaseName("leader1"), Namespace: "meshd-system", ResourceVersion: "1",
			Labels:      map[string]string{liveness.LabelManagedBy: liveness.ManagedBy},
			Annotations: liveness.ReportAnnotations(r)},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr(int32(40))},
	}
}

// updateReport makes lease publish r at the given resourceVersion.
func updateReport(t *testing.T, local kubernetes.Interface, lease *coordinationv1.Lease, r liveness.Report, version string) {
	t.Helper()
	l := lease.DeepCopy()
	l.ResourceVersion = version
	l.Annotations = liveness.ReportAnnotations(r)
	if _, err := local.CoordinationV1().Leases("meshd-system").Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
