package mesh

import (
	"fmt"
	"net/netip"
	"slices"
)

// A linked cluster (meshctl link) contributes one Peer per location leader
// of its mesh. What those peers may route is policy, decided here from plain
// values: RemotePeers computes the peers and refuses every range that
//   - overlaps a range of this cluster (pod, mesh, service CIDRs),
//   - covers an address that must never go through the tunnel (a WireGuard
//     endpoint, the API server, a node's underlay address: routing it into
//     the tunnel loops or cuts the node off), or
//   - lies outside the ranges agreed when the clusters were linked.
// A refused range is dropped from its peer; everything else is unaffected.

// RemoteLink is a linked cluster as the planner needs it.
type RemoteLink struct {
	// Cluster names the linked cluster (peer names: cluster-<name>-<leader>).
	Cluster string
	// Granularity, MeshCIDRs and Port are the linked cluster's meshd settings.
	Granularity Granularity
	MeshCIDRs   []netip.Prefix
	Port        int
	// ServiceCIDRs are routed through the linked cluster's first live leader
	// (WireGuard routes one prefix to one peer).
	ServiceCIDRs []netip.Prefix
	// Allowed are the ranges the linked cluster may claim, agreed at link
	// time. Nil means none were recorded (a link made before they were):
	// then only the other rules apply.
	Allowed []netip.Prefix
	// Liveness is the linked cluster's own liveness view (Live, Settling,
	// and its leader Candidates) so a dead remote leader is replaced as its
	// own nodes replace it; the zero value counts every node live.
	Liveness Local
}

// RemoteGuard is what every range of a linked cluster is checked against.
type RemoteGuard struct {
	// Local are this cluster's ranges (pod, mesh and service CIDRs).
	Local []netip.Prefix
	// Protected are addresses no remote range may cover.
	Protected []ProtectedAddr
}

// ProtectedAddr is an address that must never be routed into a tunnel;
// What says whose it is (for the report), e.g. "the WireGuard endpoint of
// node n1".
type ProtectedAddr struct {
	Addr netip.Addr
	What string
}

// RefusalReason says why a remote range was refused.
type RefusalReason string

const (
	// RefusedOverlap: the range overlaps a range of this cluster.
	RefusedOverlap RefusalReason = "overlap"
	// RefusedProtected: the range covers a WireGuard endpoint, the API
	// server or a node's underlay address.
	RefusedProtected RefusalReason = "protected"
	// RefusedNotAgreed: the range lies outside the ranges agreed at link
	// time.
	RefusedNotAgreed RefusalReason = "not-agreed"
)

// RefusalReasons lists every reason (for metrics that report zeros too).
var RefusalReasons = []RefusalReason{RefusedOverlap, RefusedProtected, RefusedNotAgreed}

// RangeRefusal is one refused range of a linked cluster.
type RangeRefusal struct {
	Cluster string
	Via     string // the remote leader that claimed it
	Prefix  netip.Prefix
	Reason  RefusalReason
	// Conflict is the local range or the protected address it hits (empty
	// for RefusedNotAgreed).
	Conflict string
}

func (r RangeRefusal) Error() string {
	switch r.Reason {
	case RefusedOverlap:
		return fmt.Sprintf("cluster %s: %s (via %s) overlaps local range %s: not routed", r.Cluster, r.Prefix, r.Via, r.Conflict)
	case RefusedProtected:
		return fmt.Sprintf("cluster %s: %s (via %s) covers %s: not routed", r.Cluster, r.Prefix, r.Via, r.Conflict)
	default:
		return fmt.Sprintf("cluster %s: %s (via %s) is outside the ranges agreed at link time: not routed", r.Cluster, r.Prefix, r.Via)
	}
}

// RemotePeers computes the Peers a linked cluster contributes: one per
// location leader of its mesh (built from its nodes), each routing what that
// leader carries, the service CIDRs on the first. Every range is checked
// (CheckRemoteRange); refused ones are dropped and returned. A leader left
// with nothing to route is no peer. A host prefix of a remote leader's own
// endpoint is dropped silently: it is that leader's underlay route, never a
// claim. It is RemoteLeaders followed by FilterRemote.
func RemotePeers(link RemoteLink, nodes []Node, guard RemoteGuard) (peers []Peer, refused []RangeRefusal, err error) {
	leaders, err := RemoteLeaders(link, nodes)
	if err != nil {
		return nil, nil, err
	}
	peers, refused = FilterRemote(link, leaders, guard)
	return peers, refused, nil
}

// RemoteLeaders elects a linked cluster's location leaders from its nodes
// and its own liveness view (link.Liveness), as its own nodes elect them:
// one Peer per leader, named after the leader node, carrying what that
// leader routes, the service CIDRs on the first live one. Nothing is
// checked here: FilterRemote applies this cluster's policy.
func RemoteLeaders(link RemoteLink, nodes []Node) ([]Peer, error) {
	topo, err := NewTopology(nodes, nil, Local{Live: link.Liveness.Live, Settling: link.Liveness.Settling, Candidates: link.Liveness.Candidates}, Options{Granularity: link.Granularity, MeshCIDRs: link.MeshCIDRs, Port: link.Port})
	if err != nil {
		return nil, fmt.Errorf("computing cluster %s's topology: %w", link.Cluster, err)
	}
	var leaders []Peer
	for _, seg := range topo.Segments {
		if p, ok := topo.SegmentAsPeer(seg.Leader); ok {
			leaders = append(leaders, p)
		}
	}
	if svc := serviceLeader(leaders, link.Liveness.Live); len(leaders) > 0 {
		p := &leaders[svc]
		p.AllowedIPs = append(slices.Clip(p.AllowedIPs), link.ServiceCIDRs...)
	}
	return leaders, nil
}

// FilterRemote turns a linked cluster's leaders (RemoteLeaders) into this
// cluster's peers: each is named cluster-<cluster>-<leader>, and every range
// it claims is checked (CheckRemoteRange against link.Allowed and guard,
// whose protected addresses gain the leaders' own endpoints: a range of one
// leader covering another's endpoint would loop). Refused ranges are dropped
// and returned; a leader left with nothing to route is no peer. leaders is
// not modified.
func FilterRemote(link RemoteLink, leaders []Peer, guard RemoteGuard) (peers []Peer, refused []RangeRefusal) {
	g := RemoteGuard{Local: guard.Local, Protected: slices.Clone(guard.Protected)}
	for _, p := range leaders {
		if a := p.Endpoint.Addr.Addr(); a.IsValid() {
			g.Protected = append(g.Protected, ProtectedAddr{Addr: a.Unmap(), What: fmt.Sprintf("the WireGuard endpoint of cluster %s's leader %s", link.Cluster, p.Name)})
		}
	}
	for _, p := range leaders {
		leader := p.Name
		p.Name = "cluster-" + link.Cluster + "-" + leader
		own := p.Endpoint.Addr.Addr().Unmap()
		kept := make([]netip.Prefix, 0, len(p.AllowedIPs))
		for _, a := range p.AllowedIPs {
			if own.IsValid() && a.IsSingleIP() && a.Addr().Unmap() == own {
				continue
			}
			if r, bad := CheckRemoteRange(a, link.Allowed, g); bad {
				r.Cluster, r.Via = link.Cluster, leader
				refused = append(refused, r)
				continue
			}
			kept = append(kept, a)
		}
		p.AllowedIPs = kept
		if len(p.AllowedIPs) > 0 {
			peers = append(peers, p)
		}
	}
	return peers, refused
}

// serviceLeader is the index of the leader that carries a linked cluster's
// service CIDRs: the first live one when liveness is known, else the first.
func serviceLeader(leaders []Peer, live map[string]bool) int {
	for i, p := range leaders {
		if live == nil || live[p.Name] {
			return i
		}
	}
	return 0
}

// CheckRemoteRange checks one range a linked cluster claims: it is refused
// when it overlaps a local range, covers a protected address, or (allowed
// not nil) is not inside one of the allowed ranges. The returned refusal
// has Prefix, Reason and Conflict set.
func CheckRemoteRange(p netip.Prefix, allowed []netip.Prefix, g RemoteGuard) (RangeRefusal, bool) {
	for _, l := range g.Local {
		if p.Overlaps(l) {
			return RangeRefusal{Prefix: p, Reason: RefusedOverlap, Conflict: l.String()}, true
		}
	}
	if c, bad := CoversProtected(p, g.Protected); bad {
		return RangeRefusal{Prefix: p, Reason: RefusedProtected, Conflict: c.What + " (" + c.Addr.String() + ")"}, true
	}
	if allowed != nil && !within(p, allowed) {
		return RangeRefusal{Prefix: p, Reason: RefusedNotAgreed}, true
	}
	return RangeRefusal{}, false
}

// CoversProtected returns the first protected address p contains.
func CoversProtected(p netip.Prefix, protected []ProtectedAddr) (ProtectedAddr, bool) {
	for _, a := range protected {
		if p.Contains(a.Addr.Unmap()) {
			return a, true
		}
	}
	return ProtectedAddr{}, false
}

// within reports whether p lies inside one of set.
func within(p netip.Prefix, set []netip.Prefix) bool {
	for _, q := range set {
		if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// ClaimableRanges are the ranges a cluster may claim when it is linked, as
// seen now: its mesh and service CIDRs and, from its nodes, every pod CIDR,
// underlay (internal) address and allowed-location-ip. Sorted, merged.
func ClaimableRanges(meshCIDRs, serviceCIDRs []netip.Prefix, nodes []Node) []netip.Prefix {
	out := slices.Concat(meshCIDRs, serviceCIDRs)
	for _, n := range nodes {
		out = append(out, n.PodCIDRs...)
		out = append(out, n.AllowedLocationIPs...)
		for _, a := range n.InternalIPs {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	for i := range out {
		out[i] = out[i].Masked()
	}
	slices.SortFunc(out, comparePrefix)
	merged := out[:0]
	for _, p := range out {
		if len(merged) > 0 && within(p, merged[len(merged)-1:]) {
			continue
		}
		merged = append(merged, p)
	}
	return merged
}
