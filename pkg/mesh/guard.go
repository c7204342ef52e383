package mesh

import (
	"net/netip"
	"slices"
)

// LocalRanges are the ranges of the local cluster a linked cluster's ranges
// must not overlap (RemotePeers' local): its mesh and service CIDRs and
// every node's pod CIDRs.
func LocalRanges(opts Options, nodes []Node) []netip.Prefix {
	local := slices.Concat(opts.MeshCIDRs, opts.ServiceCIDRs)
	for _, n := range nodes {
		local = append(local, n.PodCIDRs...)
	}
	return local
}

// LocalGuard is what a linked cluster's ranges are checked against
// (RemoteGuard): LocalRanges, and as protected addresses every local
// node's underlay (internal) addresses and WireGuard endpoint, and
// apiServers (the local API server's addresses, when known).
func LocalGuard(opts Options, nodes []Node, apiServers ...netip.Addr) RemoteGuard {
	g := RemoteGuard{Local: LocalRanges(opts, nodes)}
	for _, n := range nodes {
		for _, a := range n.InternalIPs {
			g.Protected = append(g.Protected, ProtectedAddr{Addr: a.Unmap(), What: "the underlay address of node " + n.Name})
		}
		if a := n.Endpoint.Addr.Addr(); a.IsValid() {
			g.Protected = append(g.Protected, ProtectedAddr{Addr: a.Unmap(), What: "the WireGuard endpoint of node " + n.Name})
		}
	}
	for _, a := range apiServers {
		if a.IsValid() {
			g.Protected = append(g.Protected, ProtectedAddr{Addr: a.Unmap(), What: "the API server"})
		}
	}
	return g
}
