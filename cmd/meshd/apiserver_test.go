package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"meshd.io/meshd/internal/testlog"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
)

func apiServerSlice(addrs ...string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: addrs}},
	}
}

// TestPeerMayNotRouteAPIServerEndpoints: in a Pod meshd dials the
// kubernetes Service's ClusterIP; the API server's own address is an
// endpoint of the EndpointSlice default/kubernetes. A Peer's allowed IP
// covering that address is refused (Event, not in WireGuard) while its
// other allowed IPs stay; when the API server moves, the old address is
// routable again and the new one refused; the address dialled stays
// protected throughout.
func TestPeerMayNotRouteAPIServerEndpoints(t *testing.T) {
	ctx := context.Background()
	f := newFakes(t, "a1", testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}))
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	f.rec.apiServers = []netip.Addr{netip.MustParseAddr("10.96.0.1")} // the ClusterIP in the kubeconfig
	f.rec.apiServerSlices = store
	peerKey := newKey(t)
	f.rec.peerLister = sliceLister{&v1alpha1.Peer{
		ObjectMeta: metav1.ObjectMeta{Name: "office"},
		Spec: v1alpha1.PeerSpec{
			PublicKey:  peerKey.PublicKey().String(),
			AllowedIPs: []string{"10.5.0.1/32", "172.16.9.0/24", "172.16.10.0/24", "10.96.0.0/24"},
		},
	}}
	allowed := func() []string {
		t.Helper()
		p := f.peer(t, peerKey)
		if p == nil {
			t.Fatal("the Peer is not in WireGuard")
		}
		var out []string
		for _, n := range p.AllowedIPs {
			out = append(out, n.String())
		}
		slices.Sort(out)
		return out
	}
	events := f.rec.events.(*record.FakeRecorder).Events
	refused := func(want ...string) { // one Event with every problem of the Peer
		t.Helper()
		select {
		case e := <-events:
			for _, w := range want {
				if !contains(e, "allowed IP "+w+" covers the API server") {
					t.Errorf("Event %q, want it to refuse %s as covering the API server", e, w)
				}
			}
		default:
			t.Errorf("no Event refusing %v", want)
		}
	}

	// Before the slice is known: only the address dialled is protected.
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := allowed(), []string{"10.5.0.1/32", "172.16.10.0/24", "172.16.9.0/24"}; !slices.Equal(got, want) {
		t.Fatalf("allowed IPs %v, want %v", got, want)
	}
	refused("10.96.0.0/24")

	store.Add(apiServerSlice("172.16.9.5"))
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := allowed(), []string{"10.5.0.1/32", "172.16.10.0/24"}; !slices.Equal(got, want) {
		t.Fatalf("API server at 172.16.9.5: allowed IPs %v, want %v", got, want)
	}
	refused("172.16.9.0/24", "10.96.0.0/24")

	store.Update(apiServerSlice("172.16.10.5"))
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := allowed(), []string{"10.5.0.1/32", "172.16.9.0/24"}; !slices.Equal(got, want) {
		t.Fatalf("API server moved to 172.16.10.5: allowed IPs %v, want %v", got, want)
	}
	refused("10.96.0.0/24", "172.16.10.0/24")
	if got, want := f.rec.apiServerAddrs(), []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("172.16.10.5")}; !slices.Equal(got, want) {
		t.Fatalf("API server addresses %v, want %v", got, want)
	}
}

// TestAPIServerSlicesInformer: the informer asks for the one object its
// Role names (a metadata.name field selector in namespace default), and a
// meshd that may not read it (Forbidden: the RBAC of an older release)
// counts the cache as synced, with one warning, so the node is programmed
// all the same; with the right, the addresses arrive.
func TestAPIServerSlicesInformer(t *testing.T) {
	for _, forbidden := range []bool{false, true} {
		t.Run(fmt.Sprintf("forbidden=%v", forbidden), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			kube := fake.NewClientset(apiServerSlice("203.0.113.2"), &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other"}, AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"198.51.100.99"}}},
			})
			var lists atomic.Int32
			kube.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
				lists.Add(1)
				l := a.(k8stesting.ListAction)
				if ns, sel := l.GetNamespace(), l.GetListRestrictions().Fields.String(); ns != "default" || sel != "metadata.name=kubernetes" {
					t.Errorf("list in namespace %q with field selector %q, want default and metadata.name=kubernetes", ns, sel)
				}
				if forbidden {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("RBAC: access denied"))
				}
				return false, nil, nil
			})
			logs := &testlog.Buffer{}
			d := &daemon{log: slog.New(slog.NewTextHandler(logs, nil)), apiServerSlices: newAPIServerSlices(kube)}
			if err := d.apiServerSlices.SetWatchErrorHandlerWithContext(d.apiServerSlicesError); err != nil {
				t.Fatal(err)
			}
			if d.apiServerSlicesSynced() {
				t.Fatal("synced before the first list")
			}
			go d.apiServerSlices.RunWithContext(ctx)
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				return d.apiServerSlicesSynced(), nil
			}); err != nil {
				t.Fatalf("never counted as synced (lists %d): %v", lists.Load(), err)
			}
			rec := &reconciler{sources: sources{apiServerSlices: d.apiServerSlices.GetStore()}}
			got := rec.apiServerAddrs()
			warned := func() int { return strings.Count(logs.String(), "cannot read the EndpointSlice default/kubernetes") }
			if forbidden {
				// The reflector retries with back-off: let it, and count
				// one warning however many times the list was refused.
				if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
					return lists.Load() >= 2, nil
				}); err != nil {
					t.Fatalf("the list was not retried: %v", err)
				}
				if len(got) != 0 || warned() != 1 {
					t.Fatalf("forbidden: addresses %v, %d warnings; want none and 1:\n%s", got, warned(), logs.String())
				}
				return
			}
			if want := []netip.Addr{netip.MustParseAddr("203.0.113.2")}; !slices.Equal(got, want) || warned() != 0 {
				t.Fatalf("addresses %v, %d warnings; want %v and none", got, warned(), want)
			}
		})
	}
}
