package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterLink is a cluster linked to this one with `meshctl link`, as the
// link controller (`meshd link`) sees it: the agreement recorded at link
// time (spec) and the linked cluster's location leaders (status). The
// controller holds the link's credentials, which no meshd node does, and
// is the only writer of ClusterLinks; every meshd node reads them and peers
// with the leaders, after checking their ranges against the local cluster
// (pkg/mesh's trust policy). It is named after the linked cluster.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=mlink,categories=meshd
// +kubebuilder:printcolumn:name="Synced",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].status`
// +kubebuilder:printcolumn:name="Reachable",type=string,JSONPath=`.status.conditions[?(@.type=="Reachable")].status`
// +kubebuilder:printcolumn:name="Leaders",type=string,JSONPath=`.status.leaders[*].name`
// +kubebuilder:printcolumn:name="Token expires",type=date,JSONPath=`.spec.tokenExpires`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterLink struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the link as `meshctl link` recorded it in the link Secret.
	// +required
	Spec ClusterLinkSpec `json:"spec"`
	// Status is the linked cluster as the link controller last saw it.
	// +optional
	Status ClusterLinkStatus `json:"status,omitempty"`
}

// ClusterLinkSpec is the linked cluster's mesh settings and the ranges it
// may claim, copied by the link controller from the link Secret.
type ClusterLinkSpec struct {
	// SecretName is the link Secret (in the controller's namespace) this
	// link was made from; only the controller reads it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName"`
	// Granularity is the linked cluster's mesh granularity (location, full
	// or a custom topology).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Granularity string `json:"granularity,omitempty"`
	// MeshCIDRs are the linked cluster's mesh CIDRs.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=43
	MeshCIDRs []string `json:"meshCIDRs,omitempty"`
	// ServiceCIDRs are the linked cluster's service CIDRs (routed through
	// its first live leader).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=43
	ServiceCIDRs []string `json:"serviceCIDRs,omitempty"`
	// Port is the linked cluster's WireGuard port.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
	// AllowedCIDRsRecorded says whether the ranges the linked cluster may
	// claim were recorded at link time: if not (a link made by an older
	// meshctl), only the overlap and protected-address rules apply.
	// +optional
	AllowedCIDRsRecorded bool `json:"allowedCIDRsRecorded,omitempty"`
	// AllowedCIDRs are the ranges the linked cluster may claim, agreed at
	// link time; a claim outside them is refused by every node.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=43
	AllowedCIDRs []string `json:"allowedCIDRs,omitempty"`
	// TokenExpires is when the link's token expires (`meshctl link
	// --refresh` renews it).
	// +optional
	TokenExpires *metav1.Time `json:"tokenExpires,omitempty"`
	// Problem says why the link Secret cannot be used (then nodes keep the
	// linked cluster's last known peers).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Problem string `json:"problem,omitempty"`
}

// ClusterLinkStatus is what the link controller last observed of the linked
// cluster. It is written only when it changes, and kept as it was while the
// linked cluster cannot be read: its last known leaders stay.
type ClusterLinkStatus struct {
	// Leaders are the linked cluster's location leaders, elected as its own
	// nodes elect them (from its Nodes, heartbeat Leases and probe
	// reports); each becomes one WireGuard peer of this cluster's leaders.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4096
	Leaders []ClusterLinkLeader `json:"leaders,omitempty"`
	// LivenessKnown says whether the leaders were elected from the linked
	// cluster's Leases (false: they could not be read, every node counts as
	// live).
	// +optional
	LivenessKnown bool `json:"livenessKnown,omitempty"`
	// Conditions: Synced is True once the leaders come from a complete list
	// of the linked cluster's Nodes, and False while the link Secret cannot
	// be used (the last known leaders stay); Reachable is False while the
	// linked cluster's API server does not answer (the leaders are its last
	// known ones).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ClusterLinkLeader is one location leader of a linked cluster.
type ClusterLinkLeader struct {
	// Name is the leader's node name in the linked cluster (the peer is
	// named cluster-<link>-<name>).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// PublicKey is the leader's WireGuard public key (base64).
	// +required
	// +kubebuilder:validation:MaxLength=44
	PublicKey string `json:"publicKey"`
	// Endpoint is the leader's WireGuard endpoint, ip:port or host:port.
	// +optional
	// +kubebuilder:validation:MaxLength=260
	Endpoint string `json:"endpoint,omitempty"`
	// AllowedIPs are the ranges the leader carries (its location's pod
	// CIDRs, mesh IPs and allowed location IPs; the service CIDRs on the
	// first live leader), before this cluster's checks.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4096
	// +kubebuilder:validation:items:MaxLength=43
	AllowedIPs []string `json:"allowedIPs,omitempty"`
	// PersistentKeepalive is the keepalive interval in seconds (0: none).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	PersistentKeepalive int32 `json:"persistentKeepalive,omitempty"`
	// Live is the linked cluster's liveness judgement of this leader.
	// +optional
	Live bool `json:"live,omitempty"`
}

// ClusterLinkList is a list of ClusterLinks.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type ClusterLinkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []ClusterLink `json:"items"`
}
