package main

import (
	"errors"
	"reflect"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// Lean caches: every daemon caches every Node of the cluster, so what it
// keeps per Node is multiplied by the cluster size on every node. The
// transforms below run before an object enters an informer's cache and
// keep only what meshd reads.

// leanNode keeps of a Node what the planner, the publisher and Events read:
// name, UID and resourceVersion, labels, meshd.io/ annotations, the pod
// CIDRs and the addresses. managedFields, images, conditions, capacity,
// node info, taints and everyone else's annotations are dropped.
func leanNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone (DeletedFinalStateUnknown): as is
	}
	lean := &corev1.Node{
		TypeMeta: n.TypeMeta,
		Spec:     corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:   corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
	lean.Name, lean.UID, lean.ResourceVersion, lean.Generation = n.Name, n.UID, n.ResourceVersion, n.Generation
	lean.CreationTimestamp, lean.DeletionTimestamp = n.CreationTimestamp, n.DeletionTimestamp
	lean.Labels = n.Labels
	for k, v := range n.Annotations {
		if strings.HasPrefix(k, convert.AnnotationPrefix) {
			if lean.Annotations == nil {
				lean.Annotations = map[string]string{}
			}
			lean.Annotations[k] = v
		}
	}
	return lean, nil
}

// dropManagedFields removes managedFields (often the largest part of a
// small object) from any object; used for Peers and Leases.
func dropManagedFields(obj any) (any, error) {
	if _, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return obj, nil
	}
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

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
