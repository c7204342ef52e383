package main

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/liveness"
)

// TestLeaseInformerScope: in location mesh meshd lists and watches every
// heartbeat Lease; in full mesh only its own (no other node's liveness
// changes a full-mesh plan), so other nodes' renewals never reach it.
func TestLeaseInformerScope(t *testing.T) {
	for _, tc := range []struct {
		granularity string
		want        string // field selector of the LIST and WATCH
	}{
		{"location", ""},
		{"full", "metadata.name=" + liveness.LeaseName("n1")},
	} {
		t.Run(tc.granularity, func(t *testing.T) {
			cs := fake.NewClientset()
			c := &config{Hostname: "n1", LeaseNamespace: "meshd-system", Granularity: tc.granularity}
			inf := informers.NewSharedInformerFactoryWithOptions(cs, 0, leaseInformerOptions(c)...).Coordination().V1().Leases().Informer()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			done := make(chan struct{})
			defer func() { cancel(); <-done }() // no informer goroutine outlives the test
			go func() { defer close(done); inf.RunWithContext(ctx) }()
			if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
				t.Fatal("lease informer did not sync")
			}
			seen := map[string]bool{}
			for _, a := range cs.Actions() {
				if a.GetResource().Resource != "leases" || (a.GetVerb() != "list" && a.GetVerb() != "watch") {
					continue
				}
				if a.GetNamespace() != "meshd-system" {
					t.Errorf("%s in namespace %q, want meshd-system", a.GetVerb(), a.GetNamespace())
				}
				var fs string
				switch r := a.(type) {
				case k8stesting.ListAction:
					fs = r.GetListRestrictions().Fields.String()
				case k8stesting.WatchAction:
					fs = r.GetWatchRestrictions().Fields.String()
				}
				if fs != tc.want {
					t.Errorf("%s with field selector %q, want %q", a.GetVerb(), fs, tc.want)
				}
				seen[a.GetVerb()] = true
			}
			if !seen["list"] {
				t.Errorf("no lease list seen in %v", cs.Actions())
			}
			// The transform still drops managed fields.
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: liveness.LeaseName("n1"), Namespace: "meshd-system", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}}
			if _, err := cs.CoordinationV1().Leases("meshd-system").Create(ctx, l, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			for ctx.Err() == nil {
				if o, ok, _ := inf.GetStore().GetByKey("meshd-system/" + l.Name); ok {
					if len(o.(*coordinationv1.Lease).ManagedFields) != 0 {
						t.Error("managed fields kept in the Lease cache")
					}
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatal("own Lease never reached the cache")
		})
	}
}
