package convert

import (
	"reflect"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// Lean caches: a daemon caches every Node of its cluster, and the link
// controller every Node of every linked cluster, so what is kept per Node
// is multiplied by the cluster's size. The informer transforms below run
// before an object enters a cache and keep only what meshd reads.

// LeanNode is an informer transform (cache.TransformFunc) keeping of a
// Node what NodeFromObject, the publisher and Events read: name, UID,
// resourceVersion, labels, meshd.io/ annotations, the pod CIDRs and the
// addresses. managedFields, images, conditions, capacity, node info,
// taints and every other component's annotations are dropped. Anything
// that is not a *corev1.Node (a tombstone) is returned as is.
func LeanNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
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
		if strings.HasPrefix(k, AnnotationPrefix) {
			if lean.Annotations == nil {
				lean.Annotations = map[string]string{}
			}
			lean.Annotations[k] = v
		}
	}
	return lean, nil
}

// SameLeanNode reports whether two lean Nodes (LeanNode) hold the same
// content, whatever their resourceVersions: an update between them is a
// heartbeat or another component's write, which no reader of the lean
// Node can see.
func SameLeanNode(a, b *corev1.Node) bool {
	return a.Name == b.Name && a.UID == b.UID &&
		reflect.DeepEqual(a.Labels, b.Labels) && reflect.DeepEqual(a.Annotations, b.Annotations) &&
		reflect.DeepEqual(a.Spec, b.Spec) && reflect.DeepEqual(a.Status, b.Status) &&
		a.DeletionTimestamp.Equal(b.DeletionTimestamp)
}

// DropManagedFields is an informer transform removing managedFields
// (often the largest part of a small object) from any object; used for
// Peers, Leases and ClusterLinks. What is not an object (a tombstone) is
// returned as is.
func DropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
