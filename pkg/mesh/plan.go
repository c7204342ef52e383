package mesh

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Build computes the Plan of the local node. It fails only on unusable
// options or a missing local node; problems in the nodes and peers are worked
// around and reported in Plan.Warnings. The inputs are not modified and the
// result does not depend on their order.
//
// A node leading its location peers with every other location's leader and
// with every Peer and routes their allowed IPs to the WireGuard interface; any
// other node routes them to its leader's internal IP. With Options.LocalRoutes
// the pod CIDRs and mesh IPs of the other nodes of the location are routed to
// their internal IPs.
func Build(nodes []Node, peers []Peer, local Local, opts Options) (*Plan, error) {
	if local.NodeName == "" {
		return nil, fmt.Errorf("%w: no local node name", ErrLocalNodeNotFound)
	}
	t, err := NewTopology(nodes, peers, local, opts)
	if err != nil {
		return nil, fmt.Errorf("building topology: %w", err)
	}
	return t.plan(), nil
}

// plan derives the local node's Plan from the topology in named steps: the
// plan's header and interface, the routes (to other locations and peers,
// then within the location), the rules those routes need, and iptables.
func (t *Topology) plan() *Plan {
	ls := &t.Segments[t.LocalSegment]
	p := t.planHeader(ls)
	rb := t.newRouteBuilder(ls)
	lm := &t.members[t.local]
	if p.Leader {
		p.WireGuard.Peers = t.wireGuardPeers(lm)
		if sp := t.standbyPeers(lm); len(sp) > 0 {
			p.WireGuard.Peers = t.sortPeers(append(p.WireGuard.Peers, sp...))
		}
		t.leaderRoutes(rb)
	} else {
		if ls.standby == t.local {
			p.WireGuard.Peers = t.sortPeers(t.standbyPeers(lm))
		}
		t.memberRoutes(rb, t.members[ls.leader].n)
	}
	if t.opts.LocalRoutes {
		t.locationRoutes(rb, ls)
	}
	p.Routes = rb.finish()
	if t.opts.FailClosed {
		p.Routes = append(p.Routes, t.failClosedRoutes(p.Routes)...)
	}
	p.Warnings = append(p.Warnings, rb.warnings...)
	p.Rules = routeRules(p.Routes, &t.opts)
	t.iptables(p, rb.pods)
	return p
}

// planHeader is the Plan without routes, rules, peers or iptables: the
// location, leadership and the interface's addresses and port.
func (t *Topology) planHeader(ls *Segment) *Plan {
	p := &Plan{
		Location: ls.Location,
		Leader:   ls.leader == t.local,
		Leaders:  make(map[string]string, len(t.Segments)),
		MeshIPs:  t.MeshIPs,
		Warnings: t.Warnings,

		PeerWarnings: t.PeerWarnings,
	}
	for s := range t.Segments {
		p.Leaders[t.Segments[s].Location] = t.Segments[s].Leader
	}
	for _, a := range t.members[t.local].mesh {
		if a.IsValid() {
			p.WireGuard.Addresses = append(p.WireGuard.Addresses, hostPrefix(a))
		}
	}
	p.WireGuard.ListenPort = t.opts.Port
	return p
}

// newRouteBuilder starts the routes of the local node, which must never
// send its own addresses and pods away.
func (t *Topology) newRouteBuilder(ls *Segment) *routeBuilder {
	lm := &t.members[t.local]
	rb := &routeBuilder{t: t, table: t.opts.RouteTable, dev: t.opts.Interface}
	for _, a := range lm.n.InternalIPs {
		if a = normAddr(a); a.IsValid() {
			rb.self = append(rb.self, a)
		}
	}
	for _, a := range lm.mesh {
		if a.IsValid() {
			rb.self = append(rb.self, a)
		}
	}
	for _, c := range lm.n.PodCIDRs {
		if c, ok := normPrefix(c); ok {
			rb.pods = append(rb.pods, c)
		}
	}
	rb.groups = make([]routeGroup, 0, len(t.Segments)+len(t.Peers)+ls.mhi-ls.mlo)
	rb.segGroup = make([]int32, len(t.Segments))
	for s := range rb.segGroup {
		rb.segGroup[s] = -1
	}
	return rb
}

// leaderRoutes routes every other location and every Peer to the interface.
func (t *Topology) leaderRoutes(rb *routeBuilder) {
	for s := range t.Segments {
		if s != t.LocalSegment {
			rb.addSegment(s, true, [2]netip.Addr{})
		}
	}
	for i := range t.Peers {
		rb.addDevice(t.Peers[i].AllowedIPs, "peer", t.Peers[i].Name)
	}
}

// memberRoutes routes every other location and every Peer via the
// location's leader ln.
func (t *Topology) memberRoutes(rb *routeBuilder, ln *Node) {
	gw := gateways(ln)
	for s := range t.Segments {
		if s != t.LocalSegment {
			rb.addSegment(s, false, gw)
		}
	}
	for i := range t.Peers {
		rb.add(t.Peers[i].AllowedIPs, gw, "peer", t.Peers[i].Name)
	}
	for f, m := range rb.missing {
		if m {
			rb.warn(fmt.Sprintf("leader %s has no %s internal IP; %s routes skipped", ln.Name, familyName(f), familyName(f)))
		}
	}
}

// locationRoutes (Options.LocalRoutes) routes the pod CIDRs and mesh IPs of
// the location's other nodes to their internal IPs.
func (t *Topology) locationRoutes(rb *routeBuilder, ls *Segment) {
	for _, i := range t.order[ls.mlo:ls.mhi] {
		if i == t.local {
			continue
		}
		m := &t.members[i]
		var dsts []netip.Prefix
		for _, c := range m.n.PodCIDRs {
			if c, ok := normPrefix(c); ok {
				if a, bad := t.eps.within(c); bad {
					rb.warn(fmt.Sprintf("not routing pod CIDR %v of node %s: it contains WireGuard endpoint %v", c, m.n.Name, a))
					continue
				}
				dsts = append(dsts, c)
			}
		}
		for _, a := range m.mesh {
			if a.IsValid() {
				dsts = append(dsts, hostPrefix(a))
			}
		}
		rb.missing = [2]bool{}
		rb.add(dsts, gateways(m.n), "node", m.n.Name)
		for f, miss := range rb.missing {
			if miss {
				rb.warn(fmt.Sprintf("node %s has no %s internal IP; its local routes skipped", m.n.Name, familyName(f)))
			}
		}
	}
}

// routeRules is one rule to the route table per family that has routes.
func routeRules(routes []Route, o *normalized) []Rule {
	var used [2]bool
	for i := range routes {
		used[family(routes[i].Dst.Addr())] = true
	}
	var rules []Rule
	for f, u := range used {
		if u {
			rules = append(rules, Rule{Priority: o.RulePriority, Table: o.RouteTable, IPv6: f == v6})
		}
	}
	return rules
}

func familyName(f int) string {
	if f == v4 {
		return "IPv4"
	}
	return "IPv6"
}

// wireGuardPeers are a leader's peers: the other segments' leaders and the
// outside peers, sorted by public key.
func (t *Topology) wireGuardPeers(lm *member) []WireGuardPeer {
	ka := lm.n.PersistentKeepalive
	ps := make([]WireGuardPeer, 0, len(t.Segments)+len(t.Peers))
	for s := range t.Segments {
		if s == t.LocalSegment {
			continue
		}
		seg := &t.Segments[s]
		ps = append(ps, WireGuardPeer{
			Name:                seg.Location,
			PublicKey:           seg.PublicKey,
			Endpoint:            seg.Endpoint,
			PersistentKeepalive: max(seg.PersistentKeepalive, ka),
			AllowedIPs:          seg.AllowedIPs,
		})
	}
	for i := range t.Peers {
		pe := &t.Peers[i]
		ps = append(ps, WireGuardPeer{
			Name:                pe.Name,
			PublicKey:           pe.PublicKey,
			PresharedKey:        pe.PresharedKey,
			Endpoint:            pe.Endpoint,
			PersistentKeepalive: max(pe.PersistentKeepalive, ka),
			AllowedIPs:          pe.AllowedIPs,
		})
	}
	return t.sortPeers(ps)
}

// sortPeers sorts WireGuard peers by public key.
func (t *Topology) sortPeers(ps []WireGuardPeer) []WireGuardPeer {
	// Sort by moving the structs once: sort positions, then permute in place.
	// Positions sort as integers keyed by the first 5 key bytes; the (rare)
	// runs sharing them are then ordered by the whole key.
	ks := make([]uint64, len(ps))
	for i := range ps {
		k := &ps[i].PublicKey
		ks[i] = uint64(k[0])<<56 | uint64(k[1])<<48 | uint64(k[2])<<40 | uint64(k[3])<<32 | uint64(k[4])<<24 | uint64(i)
	}
	sortU64(ks)
	idx := make([]int32, len(ps))
	for i, k := range ks {
		idx[i] = int32(k & (1<<24 - 1))
	}
	for i := 0; i < len(ks); {
		j := i + 1
		for j < len(ks) && ks[j]>>24 == ks[i]>>24 {
			j++
		}
		if j-i > 1 {
			slices.SortFunc(idx[i:j], func(a, b int32) int { return bytes.Compare(ps[a].PublicKey[:], ps[b].PublicKey[:]) })
		}
		i = j
	}
	permute(ps, idx)
	return ps
}

// standbyKeepalive keeps the standby sessions (see Topology.Standby) up:
// setting it makes WireGuard handshake at once, and the session stays
// fresh until the takeover moves the allowed IPs onto it.
const standbyKeepalive = 15 * time.Second

// standbyPeers are the peers a node keeps ahead of a leadership takeover:
// a leader peers with the other locations' standbys, without allowed IPs
// (they go to the current leaders); a standby peers with the other
// locations' leaders, with their allowed IPs (no route sends traffic to them
// before the takeover).
func (t *Topology) standbyPeers(lm *member) []WireGuardPeer {
	var zero wgtypes.Key
	ls := &t.Segments[t.LocalSegment]
	var ps []WireGuardPeer
	for s := range t.Segments {
		seg := &t.Segments[s]
		if s == t.LocalSegment {
			continue
		}
		var n *Node
		var ep Endpoint
		var allowed []netip.Prefix
		switch {
		case ls.leader == t.local && seg.standby >= 0:
			n = t.members[seg.standby].n
			ep = normEndpoint(n.Endpoint)
		case ls.standby == t.local && seg.PublicKey != zero:
			// The standby accepts what the other leaders send already (its
			// routes still go through its own leader): a leader that switches
			// before it does loses nothing.
			n = t.members[seg.leader].n
			ep = seg.Endpoint
			allowed = seg.AllowedIPs
		default:
			continue
		}
		if n.PublicKey == zero || n.PublicKey == lm.n.PublicKey {
			continue
		}
		ps = append(ps, WireGuardPeer{
			Name:                seg.Location + "/standby",
			PublicKey:           n.PublicKey,
			Endpoint:            ep,
			PersistentKeepalive: max(standbyKeepalive, n.PersistentKeepalive, lm.n.PersistentKeepalive),
			AllowedIPs:          allowed,
		})
	}
	return ps
}

// gateways are a node's first internal IP per family.
func gateways(n *Node) [2]netip.Addr {
	var gw [2]netip.Addr
	for _, a := range n.InternalIPs {
		if a = normAddr(a); a.IsValid() && !gw[family(a)].IsValid() {
			gw[family(a)] = a
		}
	}
	return gw
}

// routeBuilder collects routes, refusing any that would send the local
// node's own addresses or pods away. Routes are kept as groups of
// destinations sharing a next hop until finish sorts them.
type routeBuilder struct {
	t        *Topology
	table    int
	dev      string
	self     []netip.Addr   // local internal and mesh IPs
	pods     []netip.Prefix // local pod CIDRs
	groups   []routeGroup
	segGroup []int32 // group of each segment, -1 if not routed
	missing  [2]bool // a group lacked a gateway of the family
	warnings []string
}

// routeGroup is destinations sharing a next hop.
type routeGroup struct {
	dsts       []netip.Prefix
	seg        int           // segment index, or -1
	device     bool          // to the interface, else via gw
	gw         [2]netip.Addr // per family
	kind, name string        // owner of dsts, for warnings
}

func (rb *routeBuilder) warn(s string) { rb.warnings = append(rb.warnings, s) }

// addSegment routes segment s's allowed IPs to the interface (device) or
// via gw.
func (rb *routeBuilder) addSegment(s int, device bool, gw [2]netip.Addr) {
	seg := &rb.t.Segments[s]
	n := len(rb.groups)
	if device {
		rb.addDevice(seg.AllowedIPs, "location", seg.Location)
	} else {
		rb.add(seg.AllowedIPs, gw, "location", seg.Location)
	}
	if len(rb.groups) > n {
		rb.groups[n].seg = s
		rb.segGroup[s] = int32(n)
	}
}

// addDevice routes dsts (of kind name) to the interface.
func (rb *routeBuilder) addDevice(dsts []netip.Prefix, kind, name string) {
	rb.groups = append(rb.groups, routeGroup{dsts: dsts, seg: -1, device: true, kind: kind, name: name})
}

// add routes dsts (of kind name) via the gateway of their family.
func (rb *routeBuilder) add(dsts []netip.Prefix, gw [2]netip.Addr, kind, name string) {
	for f := range gw {
		if !gw[f].IsValid() {
			for _, d := range dsts {
				if family(d.Addr()) == f {
					rb.missing[f] = true
					break
				}
			}
		} else if slices.Contains(rb.self, gw[f]) {
			return // never route to the local node itself
		}
	}
	rb.groups = append(rb.groups, routeGroup{dsts: dsts, seg: -1, gw: gw, kind: kind, name: name})
}

// selfish reports whether dst covers something of the local node.
func (rb *routeBuilder) selfish(dst netip.Prefix) bool {
	for _, a := range rb.self {
		if dst.Contains(a) {
			return true
		}
	}
	for _, c := range rb.pods {
		if dst.Overlaps(c) {
			return true
		}
	}
	return false
}

// finish returns the routes sorted by destination; of two routes to the same
// destination the first added wins. Steps: index the local node's IPv4
// ranges, collect and sort the destinations, merge them in order with the
// segments' presorted IPv4 destinations, then the IPv6 ones.
func (rb *routeBuilder) finish() []Route {
	c := rb.collect()
	e := routeEmitter{rb: rb, self4: rb.selfRanges4(), rs: make([]Route, 0, c.nseg+len(c.refs))}
	rb.mergeV4(&e, &c)
	for _, i := range c.others {
		r := c.refs[i]
		grp := &rb.groups[r.g]
		d := grp.dsts[r.i]
		if rb.selfish(d) {
			rb.warn(fmt.Sprintf("not routing %v of %s %s: it covers the local node", d, grp.kind, grp.name))
			continue
		}
		e.emit(d, grp)
	}
	rb.t.scratch = c.keys
	return e.rs
}

// routeRef is a destination: rb.groups[g].dsts[i].
type routeRef struct{ g, i int32 }

// collected are the destinations finish sorts itself (the segments' IPv4
// ones are streamed from Topology.segV4, already sorted): IPv4 as integer
// keys v4key<<24|index into refs, the rest (IPv6) as indexes into refs
// sorted by comparison.
type collected struct {
	refs   []routeRef
	keys   []uint64
	others []int
	nseg   int // segment IPv4 destinations, for the capacity
}

// collect gathers and sorts the destinations that have a next hop.
func (rb *routeBuilder) collect() collected {
	c := collected{refs: make([]routeRef, 0, len(rb.groups)+8), keys: rb.t.scratch[:0]}
	for g := range rb.groups {
		grp := &rb.groups[g]
		for i, d := range grp.dsts {
			is4 := d.Addr().Is4()
			if grp.seg >= 0 && is4 {
				c.nseg++
				continue
			}
			if !grp.device && !grp.gw[family(d.Addr())].IsValid() {
				continue // missing gateway family, reported by add
			}
			if is4 && len(c.refs) < 1<<24 {
				c.keys = append(c.keys, v4key(d)<<24|uint64(len(c.refs)))
			} else {
				c.others = append(c.others, len(c.refs))
			}
			c.refs = append(c.refs, routeRef{int32(g), int32(i)})
		}
	}
	dst := func(r routeRef) netip.Prefix { return rb.groups[r.g].dsts[r.i] }
	sortU64(c.keys)
	slices.SortFunc(c.others, func(a, b int) int {
		return cmp.Or(comparePrefix(dst(c.refs[a]), dst(c.refs[b])), cmp.Compare(a, b))
	})
	return c
}

// mergeV4 emits the IPv4 routes in order: the segments' presorted keys
// merged with the collected ones (segments first on a tie).
func (rb *routeBuilder) mergeV4(e *routeEmitter, c *collected) {
	seg, keys := rb.t.segV4, c.keys
	const low24 = 1<<24 - 1
	last := ^uint64(0)
	for i, j := 0, 0; i < len(seg) || j < len(keys); {
		if i < len(seg) && (j == len(keys) || seg[i]>>24 <= keys[j]>>24) {
			k := seg[i]
			i++
			if k>>24 == last {
				continue // a duplicate the topology dropped
			}
			last = k >> 24
			g := rb.segGroup[k&low24]
			if g < 0 {
				continue
			}
			grp := &rb.groups[g]
			if !grp.device && !grp.gw[v4].IsValid() {
				continue
			}
			e.emit4(k>>24, grp)
			continue
		}
		r := c.refs[keys[j]&low24]
		j++
		e.emit4(keys[j-1]>>24, &rb.groups[r.g])
	}
}

// selfRanges4 are the local node's IPv4 addresses and pod CIDRs as integer
// ranges, for a cheap test of IPv4 destinations.
func (rb *routeBuilder) selfRanges4() self4 {
	var s self4
	for _, a := range rb.self {
		if a.Is4() {
			s.addrs = append(s.addrs, v4u32(a))
		}
	}
	for _, c := range rb.pods {
		if c.Addr().Is4() {
			lo := v4u32(c.Addr())
			s.pods = append(s.pods, [2]uint32{lo, lo | hostMask4(c.Bits())})
		}
	}
	return s
}

// self4 is routeBuilder.selfish for IPv4 ranges.
type self4 struct {
	addrs []uint32
	pods  [][2]uint32
}

func (s *self4) covered(lo, hi uint32) bool {
	for _, a := range s.addrs {
		if lo <= a && a <= hi {
			return true
		}
	}
	for _, r := range s.pods {
		if r[0] <= hi && lo <= r[1] {
			return true
		}
	}
	return false
}

// routeEmitter appends routes in destination order, dropping duplicates
// and routes that cover the local node.
type routeEmitter struct {
	rb    *routeBuilder
	self4 self4
	rs    []Route
}

func (e *routeEmitter) emit(d netip.Prefix, grp *routeGroup) {
	if k := len(e.rs); k > 0 && e.rs[k-1].Dst == d {
		e.rb.warn(fmt.Sprintf("duplicate route to %v of %s %s ignored", d, grp.kind, grp.name))
		return
	}
	e.rs = e.rs[:len(e.rs)+1]
	r := &e.rs[len(e.rs)-1]
	r.Table, r.Dst = e.rb.table, d
	if grp.device {
		r.Device = e.rb.dev
	} else {
		r.Gateway = grp.gw[family(d.Addr())]
	}
}

// emit4 emits the IPv4 destination with v4key k.
func (e *routeEmitter) emit4(k uint64, grp *routeGroup) {
	lo := uint32(k >> 8)
	hi := lo | hostMask4(int(k&0xff))
	d := fromV4key(k)
	if e.self4.covered(lo, hi) {
		e.rb.warn(fmt.Sprintf("not routing %v of %s %s: it covers the local node", d, grp.kind, grp.name))
		return
	}
	e.emit(d, grp)
}

// v4u32 is an IPv4 address as an integer.
func v4u32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// hostMask4 is the host part mask of an IPv4 prefix length.
func hostMask4(bits int) uint32 { return uint32(uint64(1)<<(32-bits) - 1) }

// iptables fills the NAT and filter chains for the families in use.
func (t *Topology) iptables(p *Plan, pods []netip.Prefix) {
	o := &t.opts
	for f := range 2 {
		var local []netip.Prefix
		for _, c := range pods {
			if family(c.Addr()) == f {
				local = append(local, c)
			}
		}
		if !o.mesh[f].IsValid() && len(local) == 0 {
			continue
		}
		fam := &p.IPTables.V4
		if f == v6 {
			fam = &p.IPTables.V6
		}
		nat := Chain{Table: "nat", Name: ChainPostrouting}
		if len(local) > 0 {
			dsts := t.noMasquerade(f)
			strs := make([]string, len(dsts))
			for i, d := range dsts {
				strs[i] = d.String()
			}
			nat.Rules = make([][]string, 0, len(local)*(len(dsts)+1))
			for _, c := range local {
				src := c.String()
				for _, d := range strs {
					nat.Rules = append(nat.Rules, []string{"-s", src, "-d", d, "-j", "RETURN"})
				}
				nat.Rules = append(nat.Rules, []string{"-s", src, "-j", "MASQUERADE"})
			}
		}
		fwd := Chain{Table: "filter", Name: ChainForward, Rules: [][]string{
			{"-i", o.Interface, "-j", "ACCEPT"},
			{"-o", o.Interface, "-j", "ACCEPT"},
		}}
		for _, c := range local {
			s := c.String()
			fwd.Rules = append(fwd.Rules, []string{"-s", s, "-j", "ACCEPT"}, []string{"-d", s, "-j", "ACCEPT"})
		}
		fam.Chains = []Chain{nat, fwd}
		fam.Jumps = []Jump{
			{Table: "nat", From: "POSTROUTING", To: ChainPostrouting},
			{Table: "filter", From: "FORWARD", To: ChainForward, Insert: true},
		}
	}
}

// noMasquerade are the destinations of family f that pod traffic reaches
// without NAT, aggregated.
func (t *Topology) noMasquerade(f int) []netip.Prefix {
	n := 1 + len(t.opts.svc) + len(t.alis)
	for i := range t.nodes {
		n += len(t.nodes[i].PodCIDRs)
	}
	for i := range t.Peers {
		n += len(t.Peers[i].AllowedIPs)
	}
	var keys []uint64 // IPv4 as v4keys: sorting and merging integers is cheap
	var ds []netip.Prefix
	if f == v4 {
		keys = make([]uint64, 0, n)
	} else {
		ds = make([]netip.Prefix, 0, n)
	}
	add := func(p netip.Prefix) {
		if p, ok := normPrefix(p); ok && family(p.Addr()) == f {
			if f == v4 {
				keys = append(keys, v4key(p))
			} else {
				ds = append(ds, p)
			}
		}
	}
	add(t.opts.mesh[f])
	for _, p := range t.opts.svc {
		add(p)
	}
	for i := range t.nodes {
		for _, p := range t.nodes[i].PodCIDRs {
			add(p)
		}
	}
	for i := range t.Peers {
		for _, p := range t.Peers[i].AllowedIPs {
			add(p)
		}
	}
	for _, p := range t.alis {
		add(p)
	}
	if f == v6 {
		return aggregatePrefixes(ds, nil)
	}
	keys = aggregateKeys(keys)
	ds = make([]netip.Prefix, len(keys))
	for i, k := range keys {
		ds[i] = fromV4key(k)
	}
	return ds
}

// aggregateKeys is aggregatePrefixes for IPv4 prefixes as v4keys, in place.
func aggregateKeys(keys []uint64) []uint64 {
	sortU64(keys)
	out := keys[:0]
	for _, k := range keys {
		if n := len(out); n > 0 && containsKey(out[n-1], k) {
			continue
		}
		out = append(out, k)
		for len(out) >= 2 {
			a, b := out[len(out)-2], out[len(out)-1]
			bits := int(a & 0xff)
			if bits != int(b&0xff) || bits == 0 {
				break
			}
			aa, ba := uint32(a>>8), uint32(b>>8)
			step := uint32(1) << (32 - bits)
			if aa&step != 0 || ba != aa|step {
				break // not the two halves of one parent
			}
			out = append(out[:len(out)-2], uint64(aa)<<8|uint64(bits-1))
		}
	}
	return out
}

// permute reorders s so that s[i] becomes the old s[idx[i]], moving each
// element once; idx is consumed.
func permute[T any](s []T, idx []int32) {
	for i := range s {
		if idx[i] < 0 {
			continue
		}
		tmp := s[i]
		j := i
		for {
			k := int(idx[j])
			idx[j] = -1
			if k == i {
				s[j] = tmp
				break
			}
			s[j] = s[k]
			j = k
		}
	}
}
