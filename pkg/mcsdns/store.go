package mcsdns

import (
	"fmt"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// Lookup is what the Handler reads. Store implements it over informer
// caches; every call is a local, in-memory read.
type Lookup interface {
	// Import is the ServiceImport ns/name, or nil.
	Import(ns, name string) *mcsv1beta1.ServiceImport
	// Namespace reports whether any ServiceImport lives in ns.
	Namespace(ns string) bool
	// Slices are the EndpointSlices of ns labelled with service name.
	Slices(ns, name string) []*discoveryv1.EndpointSlice
}

// sliceIndex indexes EndpointSlices by <namespace>/<service-name label>.
const sliceIndex = "mcs-service"

// SliceIndexers are the indexers Store needs on the EndpointSlice cache.
func SliceIndexers() cache.Indexers {
	return cache.Indexers{sliceIndex: func(obj any) ([]string, error) {
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return nil, fmt.Errorf("not an EndpointSlice: %T", obj)
		}
		name := s.Labels[mcsv1beta1.LabelServiceName]
		if name == "" {
			return nil, nil
		}
		return []string{s.Namespace + "/" + name}, nil
	}}
}

// ImportIndexers are the indexers Store needs on the ServiceImport cache.
func ImportIndexers() cache.Indexers {
	return cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
}

// Store is a Lookup over two caches: imports holds *v1beta1.ServiceImport
// (keyed namespace/name, with ImportIndexers), slices
// *discoveryv1.EndpointSlice (with SliceIndexers).
type Store struct {
	imports cache.Indexer
	slices  cache.Indexer
}

// NewStore reads imports and slices.
func NewStore(imports, slices cache.Indexer) *Store {
	return &Store{imports: imports, slices: slices}
}

// Import implements Lookup.
func (s *Store) Import(ns, name string) *mcsv1beta1.ServiceImport {
	obj, ok, err := s.imports.GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil
	}
	si, _ := obj.(*mcsv1beta1.ServiceImport)
	return si
}

// Namespace implements Lookup.
func (s *Store) Namespace(ns string) bool {
	objs, err := s.imports.ByIndex(cache.NamespaceIndex, ns)
	return err == nil && len(objs) > 0
}

// Slices implements Lookup.
func (s *Store) Slices(ns, name string) []*discoveryv1.EndpointSlice {
	objs, err := s.slices.ByIndex(sliceIndex, ns+"/"+name)
	if err != nil {
		return nil
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, es)
		}
	}
	return out
}
