package mcsdns

import (
	"context"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// toServiceImport: the dynamic informer's objects become typed imports; one
// that does not convert keeps its name with an empty spec (NODATA, never a
// crash or a dropped informer event).
func TestToServiceImport(t *testing.T) {
	good := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
		"metadata": map[string]any{"name": "web", "namespace": "shop", "managedFields": []any{map[string]any{"manager": "x"}}},
		"spec":     map[string]any{"type": "ClusterSetIP", "ips": []any{"10.96.0.1"}, "ports": []any{map[string]any{"name": "http", "port": int64(80)}}},
	}}
	obj, err := toServiceImport(good)
	if err != nil {
		t.Fatal(err)
	}
	si, ok := obj.(*mcsv1beta1.ServiceImport)
	if !ok || si.Name != "web" || si.Namespace != "shop" || si.Spec.Type != mcsv1beta1.ClusterSetIP ||
		len(si.Spec.IPs) != 1 || len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 80 || si.ManagedFields != nil {
		t.Fatalf("converted to %#v", obj)
	}
	bad := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "odd", "namespace": "shop"},
		"spec":     map[string]any{"type": "ClusterSetIP", "ips": "10.96.0.1", "ports": "80"},
	}}
	obj, err = toServiceImport(bad)
	if err != nil {
		t.Fatal(err)
	}
	si, ok = obj.(*mcsv1beta1.ServiceImport)
	if !ok || si.Name != "odd" || si.Namespace != "shop" || len(si.Spec.IPs) != 0 {
		t.Fatalf("unconvertible object became %#v", obj)
	}
	// Anything else (a tombstone) passes through.
	if o, _ := toServiceImport("x"); o != "x" {
		t.Fatalf("non-unstructured object changed: %v", o)
	}
}

// The informers over fake clients: imports arrive typed, only slices
// labelled with a service name are cached, and HasSynced turns true.
func TestInformers(t *testing.T) {
	si := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
		"metadata": map[string]any{"name": "db", "namespace": "shop"},
		"spec":     map[string]any{"type": "Headless", "ports": []any{map[string]any{"name": "pg", "port": int64(5432)}}},
	}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ServiceImportGVR: "ServiceImportList"}, si)
	mcs := slice("shop", "db", "east", "db-east", discoveryv1.AddressTypeIPv4, nil, ep{addrs: []string{"10.1.0.1"}})
	local := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "db-local", Namespace: "shop", Labels: map[string]string{"kubernetes.io/service-name": "db"}}, AddressType: discoveryv1.AddressTypeIPv4}
	kube := kubefake.NewClientset(mcs, local)
	inf := NewInformers(dyn, kube)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.Run(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("never synced")
	}
	store := inf.Store()
	got := store.Import("shop", "db")
	if got == nil || got.Spec.Type != mcsv1beta1.Headless || len(got.Spec.Ports) != 1 {
		t.Fatalf("import %#v", got)
	}
	if !store.Namespace("shop") || store.Namespace("other") {
		t.Error("Namespace: want shop only")
	}
	if sl := store.Slices("shop", "db"); len(sl) != 1 || sl[0].Name != "db-east" {
		t.Errorf("slices %v, want db-east only", sl)
	}
	if got := inf.slices.GetStore().ListKeys(); len(got) != 1 {
		t.Errorf("cached slices %v: the local (non-MCS) slice must not be cached", got)
	}
	if inf.Serial() == 0 {
		t.Error("serial 0")
	}
}
