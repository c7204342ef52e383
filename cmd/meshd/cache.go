package main

import (
	"errors"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// The informers' transforms (lean caches) are convert.LeanNode and
// convert.DropManagedFields.

// setTransform installs a transform on an informer that has not started.
func setTransform(i cache.SharedIndexInformer, f cache.TransformFunc) error {
	if err := i.SetTransform(f); err != nil {
		return errors.Join(errors.New("setting an informer transform"), err)
	}
	return nil
}

// nodeFilter decides, before the queue, whether a Node update can change
// the plan: it compares the mesh input parsed from the old and the new
// object (and the problems found, so a newly malformed annotation is still
// reported), not the resourceVersion. Kubelet status heartbeats, other
// components' annotations and informer resyncs change nothing. On this
// node's own Node, what meshd itself publishes is ignored too (its key,
// endpoint, internal and mesh IPs come from the plan and the device, its
// discovered endpoints from its own tracker), so a node's own writes never
// trigger its own reconcile. The periodic resync still reconciles
// everything.
type nodeFilter struct {
	self  string
	parse convert.ParseOptions
}

type parsedNode struct {
	node     mesh.Node
	problems string
	// rotation: on this node's own Node, the key rotation request and the
	// next key it published (rotate.go), which no plan reads.
	rotation [2]string
}

func (f nodeFilter) input(o *corev1.Node) parsedNode {
	if o.Name == f.self {
		o = o.DeepCopy()
		delete(o.Annotations, convert.AnnotationEndpoint)
		delete(o.Annotations, convert.AnnotationInternalIP)
		delete(o.Annotations, convert.AnnotationPublicKey)
		delete(o.Annotations, convert.AnnotationWireGuardIP)
		delete(o.Annotations, convert.AnnotationDiscoveredEndpoints)
	}
	n, errs := convert.NodeFromObject(o, f.parse)
	p := parsedNode{node: n}
	if o.Name == f.self {
		p.rotation = [2]string{o.Annotations[convert.AnnotationRotateKey], o.Annotations[convert.AnnotationNextPublicKey]}
	}
	if err := errors.Join(errs...); err != nil {
		p.problems = err.Error()
	}
	return p
}

// changed reports whether the update from old to cur can change the plan.
func (f nodeFilter) changed(old, cur *corev1.Node) bool {
	if old.Name != cur.Name {
		return true
	}
	return !reflect.DeepEqual(f.input(old), f.input(cur))
}

// keyChanged reports whether the update changes the public key of another
// node (a key rotation's switch), or the next key this node published (the
// rotation's switch is due): both are applied without coalescing delay.
func (f nodeFilter) keyChanged(old, cur *corev1.Node) bool {
	if cur.Name == f.self {
		return old.Annotations[convert.AnnotationNextPublicKey] != cur.Annotations[convert.AnnotationNextPublicKey]
	}
	return old.Annotations[convert.AnnotationPublicKey] != cur.Annotations[convert.AnnotationPublicKey]
}
