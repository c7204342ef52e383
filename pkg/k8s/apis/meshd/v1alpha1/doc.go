// Package v1alpha1 holds the meshd.io/v1alpha1 API: the cluster-scoped Peer
// resource describing a WireGuard peer outside the cluster. All validation
// lives in the CRD schema (OpenAPI and CEL rules generated from the
// kubebuilder markers below), so the API server refuses bad objects.
//
// +k8s:deepcopy-gen=package
// +kubebuilder:object:generate=true
// +groupName=meshd.io
//
// Out of scope: behaviour. How a Peer becomes a mesh.Peer is pkg/k8s; what
// the mesh does with it is pkg/mesh.
package v1alpha1
