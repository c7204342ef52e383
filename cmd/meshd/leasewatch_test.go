package main

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/liveness"
)

// leaseLists lists the field and label selectors of every Lease LIST.
func leaseLists(t *testing.T, cs *fake.Clientset) []string {
	t.Helper()
	var out []string
	for _, a := range cs.Actions() {
		if a.GetResource().Resource != "leases" || a.GetVerb() != "list" {
			continue
		}
		if a.GetNamespace() != "meshd-system" {
			t.Errorf("%s in namespace %q, want meshd-system", a.GetVerb(), a.GetNamespace())
		}
		r := a.(k8stesting.ListAction).GetListRestrictions()
		out = append(out, "fields="+r.Fields.String()+" labels="+r.Labels.String())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestLeaseInformerScope: meshd lists and watches its own Lease and, in
// location mesh, the leader candidates' Leases (meshd.io/candidate), never
// every node's: other nodes' renewals do not reach it. (The fake clientset
// ignores selectors: what reaches the handler is the e2e tests' part.)
func TestLeaseInformerScope(t *testing.T) {
	own := "fields=metadata.name=" + liveness.LeaseName("n1") + " labels="
	for _, tc := range []struct {
		granularity string
		want        []string // the LISTs (field and label selectors)
	}{
		{"full", []string{own}},
		{"location", []string{"fields= labels=meshd.io/candidate", own}},
	} {
		t.Run(tc.granularity, func(t *testing.T) {
			cs := fake.NewClientset()
			for _, l := range []*coordinationv1.Lease{
				{ObjectMeta: metav1.ObjectMeta{Name: liveness.LeaseName("n1"), ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}},
				{ObjectMeta: metav1.ObjectMeta{Name: liveness.LeaseName("n2"), Labels: map[string]string{liveness.LabelCandidate: "true"}}},
				{ObjectMeta: metav1.ObjectMeta{Name: liveness.LeaseName("n3")}},
			} {
				if _, err := cs.CoordinationV1().Leases("meshd-system").Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			c := &config{Hostname: "n1", LeaseNamespace: "meshd-system", Granularity: tc.granularity}
			var mu sync.Mutex
			var seen []*coordinationv1.Lease
			h := cache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, o.(*coordinationv1.Lease))
			}}
			w, err := newLeaseWatch(cs, c, h)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			done := make(chan struct{})
			defer func() { cancel(); <-done }() // no informer goroutine outlives the test
			go func() { defer close(done); w.Run(ctx) }()
			for !w.synced() {
				if ctx.Err() != nil {
					t.Fatal("lease watch did not sync")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if got := leaseLists(t, cs); !slices.Equal(got, tc.want) {
				t.Errorf("Lease LISTs %q, want %q", got, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) == 0 {
				t.Fatal("no Lease reached the handler")
			}
			own := 0
			for _, l := range seen {
				if len(l.ManagedFields) != 0 {
					t.Errorf("managed fields kept in the Lease cache: %s", l.Name)
				}
				if l.Name == liveness.LeaseName("n1") {
					own++
				}
			}
			// The own Lease comes from the own informer only: its leaving
			// the candidates is no news of this node.
			if own != 1 {
				t.Errorf("the own Lease reached the handler %d times, want 1", own)
			}
		})
	}
}
