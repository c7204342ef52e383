// Package mesh is meshd's pure planner: from the cluster's nodes, the Peer
// objects, facts about the local node and the daemon's options it computes the
// desired Plan for one node — its WireGuard configuration, routes, policy rules
// and iptables rules. It performs no I/O: the same inputs always give the same
// Plan, which is what lets every node agree on leaders and mesh addresses.
//
// Out of scope: every input and output. The Kubernetes objects are converted
// by pkg/k8s/convert, and the Plan is applied by the executors pkg/wg, pkg/route and
// pkg/iptables; this package imports only the standard library and wgtypes.
package mesh

import (
	"maps"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Granularity says how nodes are grouped into WireGuard segments.
type Granularity string

const (
	// GranularityLocation groups nodes by location; one leader per location
	// carries the traffic to other locations.
	GranularityLocation Granularity = "location"
	// GranularityFull makes every node its own location: a full mesh.
	GranularityFull Granularity = "full"
)

// Defaults shared by the planner, the executors and the daemon.
const (
	DefaultPort         = 51820
	DefaultInterface    = "meshd0"
	DefaultRouteTable   = 51820 // the routing table meshd owns
	DefaultRouteProto   = 109   // rtnetlink protocol number marking meshd's routes
	DefaultRulePriority = 31000 // priority of the rules steering into the table (before main at 32766)
	ChainPostrouting    = "MESHD-POSTROUTING"
	ChainForward        = "MESHD-FORWARD"
)

// Endpoint is a WireGuard endpoint. Addr is the resolved address; Host keeps
// a DNS name when the user gave one (Addr may then be zero if unresolved).
type Endpoint struct {
	Host string
	Addr netip.AddrPort
}

// IsZero reports whether the endpoint is empty.
func (e Endpoint) IsZero() bool { return e.Host == "" && !e.Addr.IsValid() }

// Node is one cluster node as the planner sees it. Every field may be empty:
// a node that has not published a public key yet is simply not a WireGuard
// member.
type Node struct {
	Name string
	// Location after resolution (meshd.io/location annotation, else the
	// topology label). Empty means the node is a location of its own.
	Location string
	// PreferLeader is the meshd.io/leader=true annotation.
	PreferLeader bool
	// PublicKey is the published meshd.io/public-key; zero = not a member yet.
	PublicKey wgtypes.Key
	// Endpoint is where the node's WireGuard listens (force-endpoint, else
	// ExternalIP, else internal IP, with the port).
	Endpoint Endpoint
	// PublicEndpoint is true when the endpoint came from force-endpoint or an
	// ExternalIP (preferred for leadership).
	PublicEndpoint bool
	// InternalIPs are the node's underlay addresses, at most one per family.
	InternalIPs []netip.Addr
	// WireGuardIPs are the mesh addresses the node published
	// (meshd.io/wireguard-ip), at most one per family.
	WireGuardIPs []netip.Addr
	// PodCIDRs is spec.podCIDRs.
	PodCIDRs []netip.Prefix
	// AllowedLocationIPs is meshd.io/allowed-location-ips.
	AllowedLocationIPs []netip.Prefix
	// PersistentKeepalive is meshd.io/persistent-keepalive (0 = off).
	PersistentKeepalive time.Duration
	// DiscoveredEndpoints are endpoints this node learned from WireGuard
	// handshakes, keyed by the remote public key (NAT traversal).
	DiscoveredEndpoints map[wgtypes.Key]netip.AddrPort
}

// Clone returns a copy of n that shares no slice or map with it.
func (n Node) Clone() Node {
	n.InternalIPs = slices.Clone(n.InternalIPs)
	n.WireGuardIPs = slices.Clone(n.WireGuardIPs)
	n.PodCIDRs = slices.Clone(n.PodCIDRs)
	n.AllowedLocationIPs = slices.Clone(n.AllowedLocationIPs)
	n.DiscoveredEndpoints = maps.Clone(n.DiscoveredEndpoints)
	return n
}

// UsesDiscoveredEndpoint reports whether the plan may reach n at an endpoint
// other nodes discovered from its handshakes rather than at its own: n has
// a key and either no endpoint or a persistent keepalive (the mark of a
// node behind NAT). Those are the nodes whose discovered endpoints every
// node must publish; any other's are for display only.
func UsesDiscoveredEndpoint(n *Node) bool {
	return n.PublicKey != (wgtypes.Key{}) && (n.Endpoint.IsZero() || n.PersistentKeepalive > 0)
}

// DiscoveryKeys are the public keys of the nodes that use discovered
// endpoints (UsesDiscoveredEndpoint).
func DiscoveryKeys(nodes []Node) map[wgtypes.Key]bool {
	out := map[wgtypes.Key]bool{}
	for i := range nodes {
		if UsesDiscoveredEndpoint(&nodes[i]) {
			out[nodes[i].PublicKey] = true
		}
	}
	return out
}

// Peer is a Peer object: an outside WireGuard peer.
type Peer struct {
	Name string
	// Created is when the Peer object was created (the API server's
	// creationTimestamp; zero for peers of linked clusters). Of two Peers
	// whose allowed IPs overlap, or that share a key, the one created
	// first keeps them: a new Peer cannot take an existing one's routes.
	Created             time.Time
	PublicKey           wgtypes.Key
	AllowedIPs          []netip.Prefix
	Endpoint            Endpoint // zero: the peer connects to us
	PersistentKeepalive time.Duration
	PresharedKey        *wgtypes.Key
}

// Options are the daemon-wide settings that shape the plan.
type Options struct {
	Granularity  Granularity
	MeshCIDRs    []netip.Prefix // one IPv4 and optionally one IPv6
	ServiceCIDRs []netip.Prefix
	Port         int
	Interface    string
	LocalRoutes  bool
	RouteTable   int
	RulePriority int
	// FailClosed adds, for every route into the mesh, an unreachable route
	// to the same destination at FailClosedMetric, so traffic for the mesh
	// is dropped rather than sent out of the underlay when its route is
	// missing (see failClosedRoutes). meshd always sets it.
	FailClosed bool
}

// Local holds facts only the local node knows.
type Local struct {
	// NodeName is the name of the node the plan is for.
	NodeName string
	// Live says which nodes this node currently judges alive (from when it
	// observed their leases change). Nil means every node is live.
	Live map[string]bool
	// Settling are live nodes that became live only recently (leader
	// takeover hysteresis): a settling node leads its location only if no
	// live, settled member can. Nil means none.
	Settling map[string]bool
	// Candidates are the nodes that may lead their location (Candidates):
	// where a location has any, its leader and standby are elected among
	// them only, so that every node elects from the liveness of the same
	// few nodes. Nil means every member may lead.
	Candidates map[string]bool
}

// Plan is the desired state of one node. Build makes every Plan afresh,
// sharing nothing with its input or earlier Plans, and nothing modifies a
// Plan once built: the daemon keeps the last one it persisted and compares
// the next with it.
type Plan struct {
	// Location is the local node's location; Leader whether it leads it.
	Location string
	Leader   bool
	// Leaders maps every location to the name of its leader.
	Leaders map[string]string
	// MeshIPs is the mesh address allocation for every member node (stable:
	// a published address is kept). The daemon publishes MeshIPs[NodeName].
	MeshIPs map[string][]netip.Addr
	// WireGuard is the desired configuration of the local interface.
	WireGuard WireGuard
	Routes    []Route
	Rules     []Rule
	IPTables  IPTables
	// Warnings are problems in the input that the planner worked around
	// (overlapping allowed-location-ips, missing gateway family, ...).
	Warnings []string
	// PeerWarnings are the Warnings about each Peer, by name: what the
	// planner dropped of it (an allowed IP, the whole Peer). A Peer's
	// status reports them.
	PeerWarnings map[string][]string `json:",omitempty"`
}

// WireGuard is the interface configuration (the private key is not part of
// the plan: the daemon adds it).
type WireGuard struct {
	Addresses  []netip.Prefix // host prefixes (/32, /128) of the local mesh IPs
	ListenPort int
	Peers      []WireGuardPeer // sorted by public key
}

// WireGuardPeer is one WireGuard peer of the local interface.
type WireGuardPeer struct {
	Name                string // node, location or Peer name, for logs and metrics
	PublicKey           wgtypes.Key
	PresharedKey        *wgtypes.Key
	Endpoint            Endpoint // zero: leave the endpoint to roaming
	PersistentKeepalive time.Duration
	AllowedIPs          []netip.Prefix // sorted, non-overlapping
}

// Route is one route meshd owns. Device is an interface name ("" lets the
// kernel choose by gateway); the protocol number is implied. A Type other
// than RouteUnicast has no Gateway, Device or Src.
type Route struct {
	Table   int
	Dst     netip.Prefix
	Gateway netip.Addr
	Device  string
	Src     netip.Addr
	Metric  int
	Type    RouteType `json:",omitempty"`
}

// Rule is one policy rule steering traffic into meshd's table.
type Rule struct {
	Priority int
	Table    int
	IPv6     bool
}

// IPTables is the desired set of meshd's iptables chains for both families.
type IPTables struct {
	V4, V6 IPTablesFamily
}

// IPTablesFamily is what meshd wants in one family.
type IPTablesFamily struct {
	Chains []Chain
	Jumps  []Jump
}

// Chain is one meshd-owned chain and its rules, in order; each rule is in
// iptables argument form, e.g. {"-s", "10.0.0.0/24", "-j", "MASQUERADE"}.
type Chain struct {
	Table string // "nat", "filter", "mangle"
	Name  string
	Rules [][]string
}

// Jump is a jump from a built-in chain into a meshd chain.
type Jump struct {
	Table  string
	From   string // built-in chain, e.g. "POSTROUTING"
	To     string // meshd chain
	Insert bool   // first position instead of appended
}
