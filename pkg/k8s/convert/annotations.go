package convert

import (
	"fmt"
	"strconv"
)

// Annotations and labels. The first group is set by users, the second is
// published by meshd on its own Node (see NodeAnnotations and PublishNode).
const (
	// AnnotationPrefix prefixes every meshd annotation.
	AnnotationPrefix = "meshd.io/"

	// AnnotationLocation overrides the node's location (else the topology
	// label is used).
	AnnotationLocation = AnnotationPrefix + "location"
	// AnnotationLeader ("true") asks for the node to be preferred as its
	// location's leader.
	AnnotationLeader = AnnotationPrefix + "leader"
	// AnnotationForceEndpoint overrides the node's WireGuard endpoint:
	// "host:port", "[v6]:port", or a host alone (default port). The host
	// may be a DNS name.
	AnnotationForceEndpoint = AnnotationPrefix + "force-endpoint"
	// AnnotationForceInternalIP overrides the node's internal IPs: a comma
	// separated list of IPs (or CIDRs, whose address is used), at most one
	// per family.
	AnnotationForceInternalIP = AnnotationPrefix + "force-internal-ip"
	// AnnotationPersistentKeepalive is the keepalive, in seconds, other
	// nodes use towards this one.
	AnnotationPersistentKeepalive = AnnotationPrefix + "persistent-keepalive"
	// AnnotationAllowedLocationIPs is a comma separated list of CIDRs
	// reachable through the node's location.
	AnnotationAllowedLocationIPs = AnnotationPrefix + "allowed-location-ips"

	// AnnotationPublicKey is the node's WireGuard public key (set by meshd).
	AnnotationPublicKey = AnnotationPrefix + "public-key"
	// AnnotationEndpoint is the node's resolved endpoint, ip:port (set by
	// meshd).
	AnnotationEndpoint = AnnotationPrefix + "endpoint"
	// AnnotationInternalIP is the comma separated list of the node's
	// discovered internal IPs (set by meshd).
	AnnotationInternalIP = AnnotationPrefix + "internal-ip"
	// AnnotationWireGuardIP is the comma separated list of the node's mesh
	// IPs (set by meshd).
	AnnotationWireGuardIP = AnnotationPrefix + "wireguard-ip"
	// AnnotationDiscoveredEndpoints is a JSON object mapping a remote public
	// key to the "ip:port" learned from its handshakes (set by meshd).
	AnnotationDiscoveredEndpoints = AnnotationPrefix + "discovered-endpoints"

	// AnnotationHandshakes was set by earlier meshd versions (handshake
	// times per peer, rounded to the minute): a Node write per node every
	// few minutes, delivered to every other node. meshd no longer publishes
	// it and removes it from its Node; handshake times are local data (the
	// meshd_wireguard_peer_last_handshake_timestamp_seconds metric, wg show).
	AnnotationHandshakes = AnnotationPrefix + "handshakes"

	// FieldManager is the field manager of meshd's writes.
	FieldManager = "meshd"

	// DefaultTopologyLabel is the node label giving the location when
	// ParseOptions.TopologyLabel is empty.
	DefaultTopologyLabel = "topology.kubernetes.io/region"
)

// PublishedAnnotations returns the annotations meshd itself writes on its
// Node.
func PublishedAnnotations() []string {
	return []string{
		AnnotationPublicKey,
		AnnotationEndpoint,
		AnnotationInternalIP,
		AnnotationWireGuardIP,
		AnnotationDiscoveredEndpoints,
		AnnotationHandshakes,
	}
}

// AnnotationError reports a malformed annotation (or node field, then
// Annotation names the field, e.g. "spec.podCIDRs"). The annotation was
// ignored.
type AnnotationError struct {
	Annotation string
	Value      string
	Err        error
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("ignoring %s=%s: %v", e.Annotation, strconv.Quote(e.Value), e.Err)
}

func (e *AnnotationError) Unwrap() error { return e.Err }
