package mesh

import "net/netip"

// RouteType is a route's type: "" for an ordinary route, or a type that
// drops what it matches.
type RouteType string

// Route types.
const (
	RouteUnicast RouteType = ""
	// RouteUnreachable drops the packet and answers the sender with ICMP
	// host unreachable, so a connection fails fast instead of hanging.
	RouteUnreachable RouteType = "unreachable"
)

// FailClosedMetric is the metric of the reject routes Options.FailClosed
// adds: above every route meshd otherwise writes (0; 1024 for IPv6), so a
// reject route only ever matches when its tunnelled twin is missing.
const FailClosedMetric = 65535

// failClosedRoutes returns, for every route of routes that carries traffic
// into the mesh (to another location through the WireGuard interface or via
// the location's leader: remote pod, mesh and service ranges, Peer allowed
// IPs, linked clusters' ranges), an unreachable route to the same
// destination in the same table at FailClosedMetric. When the route itself
// is missing (deleted by hand, a device gone with its routes, a half-applied
// change), the lookup ends there instead of falling through the policy rule
// to the main table, where the default route would send the packet out of
// the underlay in clear text.
//
// Routes to the pods and mesh addresses of nodes in the local location are
// left alone: they are ordinary underlay routes within the location.
func (t *Topology) failClosedRoutes(routes []Route) []Route {
	ls := &t.Segments[t.LocalSegment]
	local := map[netip.Prefix]bool{}
	for _, i := range t.order[ls.mlo:ls.mhi] {
		if i == t.local {
			continue
		}
		m := &t.members[i]
		for _, c := range m.n.PodCIDRs {
			if c, ok := normPrefix(c); ok {
				local[c] = true
			}
		}
		for _, a := range m.mesh {
			if a.IsValid() {
				local[hostPrefix(a)] = true
			}
		}
	}
	return failClosed(routes, local)
}

// failClosed returns an unreachable twin at FailClosedMetric for every
// ordinary route whose destination is not in local, once per table and
// destination.
func failClosed(routes []Route, local map[netip.Prefix]bool) []Route {
	type key struct {
		table int
		dst   netip.Prefix
	}
	seen := make(map[key]bool, len(routes))
	var out []Route
	for _, r := range routes {
		k := key{r.Table, r.Dst}
		if r.Type != RouteUnicast || local[r.Dst] || seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, Route{Table: r.Table, Dst: r.Dst, Type: RouteUnreachable, Metric: FailClosedMetric})
	}
	return out
}
