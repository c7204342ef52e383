package mcsdns

import (
	"context"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// ServiceImportGVR is the resource read: ServiceImports as upstream stores
// them (v1beta1).
var ServiceImportGVR = schema.GroupVersionResource{Group: mcsv1beta1.GroupName, Version: "v1beta1", Resource: mcsv1beta1.ServiceImportPluralName}

// Informers watch every namespace's ServiceImports and the EndpointSlices
// labelled multicluster.kubernetes.io/service-name (no other slice is
// cached), and give a Store over them.
type Informers struct {
	imports cache.SharedIndexInformer
	slices  cache.SharedIndexInformer
	store   *Store
	changed atomic.Int64 // unix seconds of the last event
}

// NewInformers builds the informers; Run starts them.
func NewInformers(dyn dynamic.Interface, kube kubernetes.Interface) *Informers {
	i := &Informers{}
	i.changed.Store(time.Now().Unix())
	i.imports = dynamicinformer.NewFilteredDynamicInformer(dyn, ServiceImportGVR, metav1.NamespaceAll, 0, ImportIndexers(), nil).Informer()
	_ = i.imports.SetTransform(toServiceImport)
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = mcsv1beta1.LabelServiceName
	}))
	i.slices = f.Discovery().V1().EndpointSlices().Informer()
	_ = i.slices.AddIndexers(SliceIndexers())
	_ = i.slices.SetTransform(stripManagedFields)
	i.store = NewStore(i.imports.GetIndexer(), i.slices.GetIndexer())
	bump := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { i.changed.Store(time.Now().Unix()) },
		UpdateFunc: func(any, any) { i.changed.Store(time.Now().Unix()) },
		DeleteFunc: func(any) { i.changed.Store(time.Now().Unix()) },
	}
	_, _ = i.imports.AddEventHandler(bump)
	_, _ = i.slices.AddEventHandler(bump)
	return i
}

// Store reads the informers' caches.
func (i *Informers) Store() *Store { return i.store }

// Run runs the informers until ctx ends.
func (i *Informers) Run(ctx context.Context) {
	go i.imports.Run(ctx.Done())
	i.slices.Run(ctx.Done())
}

// HasSynced reports whether both caches hold a full list.
func (i *Informers) HasSynced() bool { return i.imports.HasSynced() && i.slices.HasSynced() }

// Serial is the SOA serial: the time of the last change seen.
func (i *Informers) Serial() uint32 { return uint32(i.changed.Load()) }

// toServiceImport turns the dynamic informer's objects into typed
// ServiceImports before they are cached. An object that does not convert
// (a schema the CRD should have refused) is kept with its metadata only,
// so its name exists with no records.
func toServiceImport(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	si := &mcsv1beta1.ServiceImport{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, si); err != nil {
		si = &mcsv1beta1.ServiceImport{}
		si.ObjectMeta = metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace(), UID: u.GetUID(), ResourceVersion: u.GetResourceVersion()}
	}
	si.ManagedFields = nil
	return si, nil
}

// stripManagedFields drops what the answers never read.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
