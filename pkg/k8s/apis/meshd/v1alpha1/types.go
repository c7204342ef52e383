package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Peer is a WireGuard peer outside the cluster (a laptop, a VM, another
// cluster's gateway) that meshd adds to every location leader's interface.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=mpeer,categories=meshd
// +kubebuilder:printcolumn:name="Allowed IPs",type=string,JSONPath=`.spec.allowedIPs`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint.host`
// +kubebuilder:printcolumn:name="Port",type=integer,JSONPath=`.spec.endpoint.port`,priority=1
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Applied",type=string,JSONPath=`.status.conditions[?(@.type=="Applied")].status`
// +kubebuilder:printcolumn:name="Handshake",type=date,JSONPath=`.status.lastHandshakeTime`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:subresource:status
type Peer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the peer's WireGuard configuration.
	// +required
	Spec PeerSpec `json:"spec"`

	// Status is written by meshd: every location leader reports whether it
	// could use the Peer, whether its WireGuard interface carries it and its
	// latest handshake with it.
	// +optional
	Status PeerStatus `json:"status,omitempty"`
}

// Condition types of a Peer's status.
const (
	// PeerAccepted is True when every reporting leader could use the Peer,
	// False (reason PeerReasonInvalid) when one could not; the message says
	// why (a missing preshared-key Secret, a refused allowed IP, ...).
	PeerAccepted = "Accepted"
	// PeerApplied is True when at least one location leader has the Peer
	// on its WireGuard interface.
	PeerApplied = "Applied"

	// PeerReasonValid and PeerReasonInvalid are the reasons of Accepted.
	PeerReasonValid   = "Valid"
	PeerReasonInvalid = "Invalid"
	// PeerReasonApplied and PeerReasonNotApplied are the reasons of Applied.
	PeerReasonApplied    = "Applied"
	PeerReasonNotApplied = "NotApplied"
)

// PeerStatus is what meshd reports about a Peer. Every location leader
// writes its own entry in Leaders; the conditions and LastHandshakeTime
// summarize the entries (any leader recomputes them when it writes).
type PeerStatus struct {
	// Conditions are Accepted and Applied.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// LastHandshakeTime is the latest handshake any leader reported (the
	// most recent of Leaders[].lastHandshakeTime). It is coarse: a leader
	// moves its own time forward only when it is at least 3 minutes newer
	// than the one it last wrote, so a working peer (WireGuard handshakes
	// every 2 minutes while traffic or keepalives flow) shows an age up to
	// about 5 minutes; a larger age means no recent handshake.
	// +optional
	LastHandshakeTime *metav1.Time `json:"lastHandshakeTime,omitempty"`

	// Leaders holds one entry per location whose leader carries (or tried
	// to carry) the Peer, at most 32: with more locations (a full mesh of
	// many nodes), the leaders of the first 32 locations by name report.
	// +optional
	// +listType=map
	// +listMapKey=location
	// +kubebuilder:validation:MaxItems=64
	Leaders []PeerLeaderStatus `json:"leaders,omitempty"`
}

// PeerLeaderStatus is one location leader's report about a Peer.
type PeerLeaderStatus struct {
	// Location is the leader's location (its node name with
	// --mesh-granularity=full).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Location string `json:"location"`

	// Node is the leader's Node name; only meshd on that node writes this
	// entry.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// Accepted is false when this leader cannot use the Peer (Message says
	// why).
	// +required
	Accepted bool `json:"accepted"`

	// Applied is true when the Peer is on the leader's WireGuard interface.
	// +required
	Applied bool `json:"applied"`

	// Message tells the problems this leader found with the Peer, if any
	// (also when it still uses the Peer, e.g. a refused allowed IP).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// LastHandshakeTime is this leader's latest WireGuard handshake with the
	// Peer, moved forward only when at least 3 minutes newer than the one
	// written (see PeerStatus.LastHandshakeTime).
	// +optional
	LastHandshakeTime *metav1.Time `json:"lastHandshakeTime,omitempty"`

	// ObservedGeneration is the Peer's metadata.generation this entry was
	// computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// PeerSpec is the WireGuard configuration of a Peer.
type PeerSpec struct {
	// PublicKey is the peer's WireGuard public key: 32 bytes in standard
	// base64, i.e. 44 characters ending with '='.
	// +required
	// +kubebuilder:validation:MaxLength=44
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$')",message="spec.publicKey must be a base64-encoded 32-byte WireGuard key (44 characters ending with '=')"
	PublicKey string `json:"publicKey"`

	// AllowedIPs are the CIDRs routed to the peer (its own addresses and the
	// networks behind it). At least one is required.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="spec.allowedIPs entries must be CIDRs such as 10.4.0.1/32 or fd00::/64"
	AllowedIPs []string `json:"allowedIPs"`

	// Endpoint is where the peer's WireGuard listens. Leave it empty for a
	// peer that connects to the cluster (roaming, behind NAT).
	// +optional
	Endpoint *PeerEndpoint `json:"endpoint,omitempty"`

	// PersistentKeepalive is the keepalive interval in seconds (0 or unset
	// disables keepalives).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	PersistentKeepalive *int32 `json:"persistentKeepalive,omitempty"`

	// PresharedKeySecretRef references the Secret key holding the optional
	// preshared key (base64 of 32 bytes, as printed by `wg genpsk`). The
	// preshared key is deliberately never a plain field of the Peer.
	// +optional
	PresharedKeySecretRef *SecretKeyRef `json:"presharedKeySecretRef,omitempty"`
}

// PeerEndpoint is a WireGuard endpoint: a host and a UDP port.
type PeerEndpoint struct {
	// Host is a DNS name (a DNS-1123 subdomain) or a literal IPv4/IPv6
	// address (without brackets).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="isIP(self) || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="spec.endpoint.host must be a DNS-1123 subdomain (lower case) or an IP address"
	Host string `json:"host"`

	// Port is the peer's WireGuard UDP port.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// SecretKeyRef points at one key of a Secret.
type SecretKeyRef struct {
	// Name is the Secret's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="spec.presharedKeySecretRef.name must be a valid Secret name"
	Name string `json:"name"`

	// Namespace is the Secret's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="spec.presharedKeySecretRef.namespace must be a valid namespace name"
	Namespace string `json:"namespace"`

	// Key is the key inside the Secret's data.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-._a-zA-Z0-9]+$')",message="spec.presharedKeySecretRef.key must be a valid Secret data key"
	Key string `json:"key"`
}

// PeerList is a list of Peers.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type PeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []Peer `json:"items"`
}
