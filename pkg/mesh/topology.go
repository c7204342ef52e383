package mesh

import (
	"bytes"
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Segment is one location of the mesh: the nodes that share a leader, which
// carries all WireGuard traffic between the location and the rest of the
// mesh.
type Segment struct {
	Location string
	// Leader is the name of the leading node; PublicKey, Endpoint and
	// PersistentKeepalive are the leader's (Endpoint may be a discovered
	// one, see Build).
	Leader              string
	PublicKey           wgtypes.Key
	Endpoint            Endpoint
	PersistentKeepalive time.Duration
	// AllowedIPs is everything reachable through the leader: the members'
	// pod CIDRs, internal IPs, mesh IPs and allowed-location-ips, sorted and
	// non-overlapping, without any WireGuard endpoint address.
	AllowedIPs []netip.Prefix
	// Nodes are the member names in name order; MeshIPs their mesh
	// addresses in the same order (IPv4 before IPv6 per node).
	Nodes   []string
	MeshIPs []netip.Addr

	leader   int // index of the leader in Topology.members
	mlo, mhi int // members are Topology.order[mlo:mhi]
	// standby is the settling member that will lead once settled (-1:
	// none); see Standby.
	standby int
}

// Topology is the mesh as seen from one node: segments with their leaders,
// the outside peers and the mesh address allocation. Build derives a Plan
// from it; meshctl uses it to show the mesh and to generate configurations.
type Topology struct {
	// Options are the options with defaults applied.
	Options Options
	// LocalNode is Local.NodeName; LocalSegment is the index of its segment
	// in Segments, -1 without a local node.
	LocalNode    string
	LocalSegment int
	// Segments are sorted by location.
	Segments []Segment
	// Peers are the usable Peer objects sorted by creation, then name,
	// normalized: allowed IPs masked, merged and without those that overlap
	// the segments or an earlier peer.
	Peers []Peer
	// MeshIPs is the mesh address allocation of every member node.
	MeshIPs map[string][]netip.Addr
	// Warnings are the input problems worked around, in a stable order.
	Warnings []string
	// PeerWarnings are the Warnings about each Peer, by name.
	PeerWarnings map[string][]string

	opts    normalized
	members []member // WireGuard members sorted by name
	order   []int    // member indices grouped by segment, name order inside
	local   int      // index of the local member, -1 if none
	alis    []netip.Prefix
	nodes   []Node   // the input, for facts about non-members (read only)
	scratch []uint64 // sort buffer
	segV4   []uint64 // segments' IPv4 prefixes as sorted v4key<<24|segment
	eps     endpointSet
}

// member is one WireGuard member node.
type member struct {
	n    *Node
	seg  int
	mesh [2]netip.Addr
	live bool
	// settling: live, but only recently (Local.Settling).
	settling bool
	// eligible: it may lead (Local.Candidates).
	eligible bool
}

// OutsideConfig is the WireGuard configuration an outside Peer needs to join
// the mesh: its interface addresses and one peer per segment.
type OutsideConfig struct {
	Addresses []netip.Prefix
	Peers     []WireGuardPeer // in location order
}

// NewTopology computes the topology as seen from local. local.NodeName may be
// empty for a cluster-wide view (meshctl); otherwise the node must exist.
// The inputs are not modified.
func NewTopology(nodes []Node, peers []Peer, local Local, opts Options) (*Topology, error) {
	o, err := normalize(opts)
	if err != nil {
		return nil, err
	}
	t := &Topology{
		Options:      o.Options,
		LocalNode:    local.NodeName,
		LocalSegment: -1,
		opts:         o,
		local:        -1,
		nodes:        nodes,
	}
	if err := t.collectMembers(nodes, local); err != nil {
		return nil, err
	}
	ps := t.dedupeKeys(t.collectPeers(peers))
	t.group()
	allocateMeshIPs(t.members, o.mesh, t.warn)
	t.publishMeshIPs()
	t.electLeaders(nodes)
	t.eps = t.endpoints(ps)
	t.allowedIPs(t.eps)
	t.Peers = t.filterPeers(ps, &t.eps)
	return t, nil
}

func (t *Topology) warn(s string) { t.Warnings = append(t.Warnings, s) }

// warnPeer is warn about Peer name (also in PeerWarnings).
func (t *Topology) warnPeer(name, s string) {
	t.warn(s)
	if t.PeerWarnings == nil {
		t.PeerWarnings = map[string][]string{}
	}
	t.PeerWarnings[name] = append(t.PeerWarnings[name], s)
}

// collectMembers selects the WireGuard members (a published key, or the local
// node) and sorts them by name.
func (t *Topology) collectMembers(nodes []Node, local Local) error {
	var zero wgtypes.Key
	idx := make([]int32, 0, len(nodes))
	foundLocal := false
	for i := range nodes {
		n := &nodes[i]
		isLocal := local.NodeName != "" && n.Name == local.NodeName
		foundLocal = foundLocal || isLocal
		if n.Name == "" {
			t.warn("ignoring a node without a name")
			continue
		}
		if n.PublicKey == zero && !isLocal {
			continue
		}
		idx = append(idx, int32(i))
	}
	if local.NodeName != "" && !foundLocal {
		return fmt.Errorf("%w: %q", ErrLocalNodeNotFound, local.NodeName)
	}
	// Sorting indices moves no pointers (no write barriers).
	slices.SortFunc(idx, func(a, b int32) int { return compareNodes(&nodes[a], &nodes[b]) })
	// Drop duplicate names: the first wins.
	t.members = make([]member, 0, len(idx))
	for _, i := range idx {
		n := &nodes[i]
		if k := len(t.members); k > 0 && t.members[k-1].n.Name == n.Name {
			t.warn(fmt.Sprintf("duplicate node %s ignored", n.Name))
			continue
		}
		if n.Name == local.NodeName {
			t.local = len(t.members)
		}
		t.members = append(t.members, member{n: n, live: local.Live == nil || local.Live[n.Name], settling: local.Settling[n.Name],
			eligible: local.Candidates == nil || local.Candidates[n.Name]})
	}
	return nil
}

// dedupeKeys drops members and peers whose public key is already used: the
// local node keeps its key, then the first member in name order, then the
// first peer in creation, then name order. It sorts integer keys (the first five key bytes
// and the entry's rank) rather than filling a map.
func (t *Topology) dedupeKeys(ps []Peer) []Peer {
	kr := keyRanks{t: t, ps: ps, nm: len(t.members)}
	dropped, owners := kr.duplicates(kr.sortedKeys())
	if len(dropped) == 0 {
		return ps
	}
	order := make([]int, len(dropped))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(dropped[a], dropped[b]) })
	gone := make(map[int]bool, len(dropped)) // rare path
	for _, i := range order {
		w := fmt.Sprintf("%s has the same public key as %s; ignored", kr.name(dropped[i]), kr.name(owners[i]))
		if r := dropped[i]; r > kr.nm {
			t.warnPeer(kr.ps[r-kr.nm-1].Name, w)
		} else {
			t.warn(w)
		}
		gone[dropped[i]] = true
	}
	return t.dropRanks(ps, gone)
}

// keyRanks numbers the public keys dedupeKeys compares: rank 0 is the local
// node, 1..nm the members in name order (the local one excluded), nm+1.. the
// peers.
type keyRanks struct {
	t  *Topology
	ps []Peer
	nm int
}

func (kr *keyRanks) key(r int) *wgtypes.Key {
	switch {
	case r == 0:
		return &kr.t.members[kr.t.local].n.PublicKey
	case r <= kr.nm:
		return &kr.t.members[r-1].n.PublicKey
	}
	return &kr.ps[r-kr.nm-1].PublicKey
}

func (kr *keyRanks) name(r int) string {
	switch {
	case r == 0:
		return "node " + kr.t.members[kr.t.local].n.Name
	case r <= kr.nm:
		return "node " + kr.t.members[r-1].n.Name
	}
	return "peer " + kr.ps[r-kr.nm-1].Name
}

// sortedKeys are the non-zero keys as integers (first five key bytes<<24 |
// rank), sorted.
func (kr *keyRanks) sortedKeys() []uint64 {
	var zero wgtypes.Key
	t, nm := kr.t, kr.nm
	ks := make([]uint64, 0, nm+len(kr.ps)+1)
	for r := 0; r <= nm+len(kr.ps); r++ {
		if r == 0 && t.local < 0 || r > 0 && r <= nm && r-1 == t.local {
			continue
		}
		k := kr.key(r)
		if *k == zero || r >= 1<<24 {
			continue
		}
		ks = append(ks, uint64(k[0])<<56|uint64(k[1])<<48|uint64(k[2])<<40|uint64(k[3])<<32|uint64(k[4])<<24|uint64(r))
	}
	sortU64(ks)
	return ks
}

// duplicates finds, among sorted keys, every rank whose whole key equals an
// earlier one's: dropped[i] has the key of owners[i].
func (kr *keyRanks) duplicates(ks []uint64) (dropped, owners []int) {
	for i := 0; i < len(ks); {
		j := i + 1
		for j < len(ks) && ks[j]>>24 == ks[i]>>24 {
			j++
		}
		if j-i > 1 { // rare: same first five bytes
			run := ks[i:j]
			slices.SortFunc(run, func(a, b uint64) int {
				return cmp.Or(bytes.Compare(kr.key(int(a & (1<<24 - 1)))[:], kr.key(int(b & (1<<24 - 1)))[:]), cmp.Compare(a, b))
			})
			rank := func(x int) int { return int(run[x] & (1<<24 - 1)) }
			for x := 1; x < len(run); x++ {
				o := x
				for o > 0 && *kr.key(rank(o - 1)) == *kr.key(rank(x)) {
					o--
				}
				if o != x {
					dropped, owners = append(dropped, rank(x)), append(owners, rank(o))
				}
			}
		}
		i = j
	}
	return dropped, owners
}

// dropRanks removes the members and peers whose rank is gone (never the
// local node) and returns the remaining peers.
func (t *Topology) dropRanks(ps []Peer, gone map[int]bool) []Peer {
	nm := len(t.members)
	members := t.members[:0]
	localName := ""
	if t.local >= 0 {
		localName = t.members[t.local].n.Name
	}
	for i, m := range t.members {
		if !gone[i+1] || i == t.local {
			members = append(members, m)
		}
	}
	t.members = members
	t.local = slices.IndexFunc(t.members, func(m member) bool { return localName != "" && m.n.Name == localName })
	out := ps[:0]
	for i, p := range ps {
		if !gone[nm+1+i] {
			out = append(out, p)
		}
	}
	return out
}

// compareNodes orders nodes by name and, for the duplicate names that should
// never occur, by every field the planner reads, so that the choice among
// duplicates does not depend on the input order.
func compareNodes(a, b *Node) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	boolCmp := func(x, y bool) int {
		if x == y {
			return 0
		}
		if x {
			return 1
		}
		return -1
	}
	return cmp.Or(
		bytes.Compare(a.PublicKey[:], b.PublicKey[:]),
		strings.Compare(a.Location, b.Location),
		strings.Compare(a.Endpoint.Host, b.Endpoint.Host),
		a.Endpoint.Addr.Compare(b.Endpoint.Addr),
		slices.CompareFunc(a.InternalIPs, b.InternalIPs, netip.Addr.Compare),
		slices.CompareFunc(a.WireGuardIPs, b.WireGuardIPs, netip.Addr.Compare),
		slices.CompareFunc(a.PodCIDRs, b.PodCIDRs, comparePrefix),
		slices.CompareFunc(a.AllowedLocationIPs, b.AllowedLocationIPs, comparePrefix),
		boolCmp(a.PreferLeader, b.PreferLeader),
		boolCmp(a.PublicEndpoint, b.PublicEndpoint),
		cmp.Compare(a.PersistentKeepalive, b.PersistentKeepalive),
	)
}

// locationOf is the location of a node under the granularity.
func (t *Topology) locationOf(n *Node) string {
	if t.opts.Granularity == GranularityFull || n.Location == "" {
		return n.Name
	}
	return n.Location
}

// group builds the segments (sorted by location) and their member lists.
func (t *Topology) group() {
	ms := t.members
	locs := t.locations()
	// Counting sort of members by segment keeps name order inside.
	t.Segments = make([]Segment, len(locs))
	for i := range ms {
		t.Segments[ms[i].seg].mhi++
	}
	off := 0
	for s := range t.Segments {
		seg := &t.Segments[s]
		seg.Location = locs[s]
		n := seg.mhi
		seg.mlo, seg.mhi = off, off
		off += n
	}
	t.order = make([]int, len(ms))
	names := make([]string, len(ms))
	for i := range ms {
		seg := &t.Segments[ms[i].seg]
		t.order[seg.mhi] = i
		names[seg.mhi] = ms[i].n.Name
		seg.mhi++
	}
	for s := range t.Segments {
		seg := &t.Segments[s]
		seg.Nodes = names[seg.mlo:seg.mhi:seg.mhi]
	}
	if t.local >= 0 {
		t.LocalSegment = ms[t.local].seg
	}
}

// locations returns the sorted segment names (locations, or node names with
// full granularity) and sets every member's segment index.
func (t *Topology) locations() []string {
	ms := t.members
	if t.opts.Granularity == GranularityFull {
		locs := make([]string, len(ms))
		for i := range ms {
			locs[i] = ms[i].n.Name
			ms[i].seg = i
		}
		return locs
	}
	var locs []string
	idx := make(map[string]int)
	for i := range ms {
		l := t.locationOf(ms[i].n)
		s, ok := idx[l]
		if !ok {
			s = len(locs)
			idx[l] = s
			locs = append(locs, l)
		}
		ms[i].seg = s
	}
	if slices.IsSorted(locs) {
		return locs
	}
	perm := make([]int, len(locs))
	for i := range perm {
		perm[i] = i
	}
	slices.SortFunc(perm, func(a, b int) int { return strings.Compare(locs[a], locs[b]) })
	rank := make([]int, len(locs))
	sorted := make([]string, len(locs))
	for r, old := range perm {
		rank[old] = r
		sorted[r] = locs[old]
	}
	for i := range ms {
		ms[i].seg = rank[ms[i].seg]
	}
	return sorted
}

// publishMeshIPs fills Topology.MeshIPs and the segments' MeshIPs.
func (t *Topology) publishMeshIPs() {
	n := 0
	for i := range t.members {
		for _, a := range t.members[i].mesh {
			if a.IsValid() {
				n++
			}
		}
	}
	backing := make([]netip.Addr, 0, n)
	t.MeshIPs = make(map[string][]netip.Addr, len(t.members))
	for s := range t.Segments {
		seg := &t.Segments[s]
		start := len(backing)
		for _, i := range t.order[seg.mlo:seg.mhi] {
			m := &t.members[i]
			ms := len(backing)
			for _, a := range m.mesh {
				if a.IsValid() {
					backing = append(backing, a)
				}
			}
			t.MeshIPs[m.n.Name] = backing[ms:len(backing):len(backing)]
		}
		seg.MeshIPs = backing[start:len(backing):len(backing)]
	}
}

// electLeaders picks every segment's leader: among its candidates
// (Local.Candidates; every member where none is one), live members (all of
// them if none is live), settled ones before settling ones, one with a
// published key, then the preferred leader, then a public endpoint, then the
// first name.
func (t *Topology) electLeaders(nodes []Node) {
	better := func(a, b *member) bool { // is a better than b
		if a.eligible != b.eligible {
			return a.eligible
		}
		if a.live != b.live {
			return a.live
		}
		if a.settling != b.settling {
			return !a.settling
		}
		return leaderOrder(a.n, b.n) < 0 // equal: name order, the earlier one stays
	}
	for s := range t.Segments {
		seg := &t.Segments[s]
		t.everyoneEligibleWithoutCandidates(seg)
		best := t.order[seg.mlo]
		for _, i := range t.order[seg.mlo+1 : seg.mhi] {
			if better(&t.members[i], &t.members[best]) {
				best = i
			}
		}
		seg.leader = best
		seg.standby = t.standbyOf(seg, better)
		ln := t.members[best].n
		seg.Leader = ln.Name
		seg.PublicKey = ln.PublicKey
		seg.PersistentKeepalive = ln.PersistentKeepalive
		seg.Endpoint = normEndpoint(ln.Endpoint)
		if UsesDiscoveredEndpoint(ln) {
			if d, ok := discovered(nodes, ln.PublicKey); ok {
				seg.Endpoint = Endpoint{Addr: d}
			}
		}
	}
}

// everyoneEligibleWithoutCandidates makes every member of seg eligible when
// none of them is a candidate (a location Local.Candidates does not cover).
func (t *Topology) everyoneEligibleWithoutCandidates(seg *Segment) {
	for _, i := range t.order[seg.mlo:seg.mhi] {
		if t.members[i].eligible {
			return
		}
	}
	for _, i := range t.order[seg.mlo:seg.mhi] {
		t.members[i].eligible = true
	}
}

// standbyOf returns the member that leads seg once the settling ones have
// settled, if that is not its leader now: a live, settling member with a
// key. -1 if none.
func (t *Topology) standbyOf(seg *Segment, better func(a, b *member) bool) int {
	var zero wgtypes.Key
	best := -1
	for _, i := range t.order[seg.mlo:seg.mhi] {
		m := t.members[i]
		m.settling = false
		if best < 0 {
			best = i
			continue
		}
		b := t.members[best]
		b.settling = false
		if better(&m, &b) {
			best = i
		}
	}
	if best < 0 || best == seg.leader {
		return -1
	}
	if m := &t.members[best]; !m.live || !m.settling || m.n.PublicKey == zero {
		return -1
	}
	return best
}

// Standby returns the node of a location that will take its leadership over
// once it has settled (Local.Settling), if any. Leaders peer with it ahead
// of time, without allowed IPs, so the takeover moves allowed IPs only and
// needs no new handshake.
func (t *Topology) Standby(location string) (string, bool) {
	for s := range t.Segments {
		if seg := &t.Segments[s]; seg.Location == location && seg.standby >= 0 {
			return t.members[seg.standby].n.Name, true
		}
	}
	return "", false
}

func normEndpoint(e Endpoint) Endpoint {
	if e.Addr.IsValid() {
		e.Addr = netip.AddrPortFrom(normAddr(e.Addr.Addr()), e.Addr.Port())
	}
	return e
}

// discovered chooses among the endpoints that nodes discovered for key: the
// one reported most often, the lowest on a tie.
func discovered(nodes []Node, key wgtypes.Key) (netip.AddrPort, bool) {
	type count struct {
		ap netip.AddrPort
		n  int
	}
	var cs []count
	for i := range nodes {
		ap, ok := nodes[i].DiscoveredEndpoints[key]
		if !ok || !ap.IsValid() || ap.Port() == 0 {
			continue
		}
		ap = netip.AddrPortFrom(normAddr(ap.Addr()), ap.Port())
		j := slices.IndexFunc(cs, func(c count) bool { return c.ap == ap })
		if j < 0 {
			cs = append(cs, count{ap: ap})
			j = len(cs) - 1
		}
		cs[j].n++
	}
	if len(cs) == 0 {
		return netip.AddrPort{}, false
	}
	best := cs[0]
	for _, c := range cs[1:] {
		if c.n > best.n || (c.n == best.n && c.ap.Compare(best.ap) < 0) {
			best = c
		}
	}
	return best.ap, true
}

// collectPeers returns the usable peers sorted by creation, then name
// (comparePeers), with normalized, merged allowed IPs.
func (t *Topology) collectPeers(peers []Peer) []Peer {
	var zero wgtypes.Key
	idx := make([]int, len(peers))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return comparePeers(&peers[a], &peers[b]) })
	n := 0
	for i := range peers {
		n += len(peers[i].AllowedIPs)
	}
	backing := make([]netip.Prefix, 0, n)
	out := make([]Peer, 0, len(peers))
	for _, i := range idx {
		p := peers[i]
		if p.PublicKey == zero {
			t.warnPeer(p.Name, fmt.Sprintf("peer %s has no public key; ignored", p.Name))
			continue
		}
		start := len(backing)
		for _, a := range p.AllowedIPs {
			if a, ok := normPrefix(a); ok {
				backing = append(backing, a)
			}
		}
		ips := mergePrefixes(backing[start:])
		backing = backing[:start+len(ips)]
		p.AllowedIPs = backing[start:len(backing):len(backing)]
		p.Endpoint = normEndpoint(p.Endpoint)
		if p.PresharedKey != nil {
			psk := *p.PresharedKey
			p.PresharedKey = &psk
		}
		out = append(out, p)
	}
	return out
}

// comparePeers orders peers by creation (the oldest first: it keeps what
// a newer Peer overlaps), then name and key and, for the duplicates that
// should never occur, by every other field, so that the choice among
// duplicates does not depend on the input order.
func comparePeers(a, b *Peer) int {
	psk := func(k *wgtypes.Key) []byte {
		if k == nil {
			return nil
		}
		return k[:]
	}
	return cmp.Or(
		a.Created.Compare(b.Created),
		strings.Compare(a.Name, b.Name),
		bytes.Compare(a.PublicKey[:], b.PublicKey[:]),
		strings.Compare(a.Endpoint.Host, b.Endpoint.Host),
		a.Endpoint.Addr.Compare(b.Endpoint.Addr),
		cmp.Compare(a.PersistentKeepalive, b.PersistentKeepalive),
		bytes.Compare(psk(a.PresharedKey), psk(b.PresharedKey)),
		slices.CompareFunc(a.AllowedIPs, b.AllowedIPs, comparePrefix),
	)
}

// endpointSet is the set of WireGuard endpoint addresses in use, sorted:
// IPv4 as v4keys of host prefixes, the others as addresses.
type endpointSet struct {
	v4 []uint64
	v6 []netip.Addr
}

// endpoints collects the endpoint addresses of the leaders and the peers.
func (t *Topology) endpoints(ps []Peer) endpointSet {
	var e endpointSet
	e.v4 = make([]uint64, 0, len(t.Segments)+len(ps))
	add := func(ap netip.AddrPort) {
		if !ap.IsValid() {
			return
		}
		if a := ap.Addr(); a.Is4() {
			e.v4 = append(e.v4, v4key(hostPrefix(a)))
		} else {
			e.v6 = append(e.v6, a)
		}
	}
	for s := range t.Segments {
		add(t.Segments[s].Endpoint.Addr)
		if sb := t.Segments[s].standby; sb >= 0 {
			add(normEndpoint(t.members[sb].n.Endpoint).Addr)
		}
	}
	for i := range ps {
		add(ps[i].Endpoint.Addr)
	}
	slices.Sort(e.v4)
	e.v4 = slices.Compact(e.v4)
	slices.SortFunc(e.v6, netip.Addr.Compare)
	e.v6 = slices.Compact(e.v6)
	return e
}

// within returns an endpoint address inside the normalized prefix p, if any.
func (e *endpointSet) within(p netip.Prefix) (netip.Addr, bool) {
	if p.Addr().Is4() {
		lo := v4u32(p.Addr())
		i, _ := slices.BinarySearch(e.v4, uint64(lo)<<8)
		if i < len(e.v4) && uint32(e.v4[i]>>8) <= lo|hostMask4(p.Bits()) {
			return fromV4key(e.v4[i]).Addr(), true
		}
		return netip.Addr{}, false
	}
	i, _ := slices.BinarySearchFunc(e.v6, p.Addr(), netip.Addr.Compare)
	if i < len(e.v6) && p.Contains(e.v6[i]) {
		return e.v6[i], true
	}
	return netip.Addr{}, false
}

// ownerEndpoint marks an endpoint address in the conflict index.
const ownerEndpoint = -1

// allowedIPs computes every segment's allowed IPs.
func (t *Topology) allowedIPs(endpoints endpointSet) {
	n, nali := 0, 0
	for i := range t.members {
		nd := t.members[i].n
		n += len(nd.PodCIDRs) + len(nd.InternalIPs) + 2
		nali += len(nd.AllowedLocationIPs)
	}
	core := make([]netip.Prefix, 0, n)
	ranges := make([][2]int, len(t.Segments))
	host := func(a netip.Addr) {
		if a = normAddr(a); a.IsValid() {
			core = append(core, hostPrefix(a)) // endpoints go in sortSegments
		}
	}
	for s := range t.Segments {
		seg := &t.Segments[s]
		start := len(core)
		for _, i := range t.order[seg.mlo:seg.mhi] {
			m := &t.members[i]
			for _, p := range m.n.PodCIDRs {
				if p, ok := normPrefix(p); ok {
					core = append(core, p)
				}
			}
			for _, a := range m.n.InternalIPs {
				host(a)
			}
			for _, a := range m.mesh {
				host(a)
			}
		}
		ranges[s] = [2]int{start, len(core)}
	}
	var kept [][]netip.Prefix // per segment, when there are ALIs at all
	if nali > 0 {
		kept = t.checkALIs(core, ranges, endpoints)
	}
	if len(kept) > 0 {
		// Rebuild with the allowed-location-ips appended per segment.
		all := make([]netip.Prefix, 0, len(core)+nali)
		for s, r := range ranges {
			start := len(all)
			all = append(all, core[r[0]:r[1]]...)
			all = append(all, kept[s]...)
			ranges[s] = [2]int{start, len(all)}
		}
		core = all
	}
	t.sortSegments(core, ranges, &endpoints)
}

// sortSegments sorts and merges every segment's prefixes (core[ranges[s]]) in
// place, excludes WireGuard endpoints (routing them through the tunnel would
// loop: an endpoint's host prefix silently, a wider prefix with a warning)
// and drops a prefix an earlier segment
// already has (a
// misconfiguration such as two nodes with the same pod CIDR: the same allowed
// IP on two WireGuard peers would never converge). It sets the segments'
// AllowedIPs and t.segV4, the kept IPv4 prefixes of all segments as sorted
// v4key<<24|segment keys, which later stages reuse instead of sorting again.
func (t *Topology) sortSegments(core []netip.Prefix, ranges [][2]int, endpoints *endpointSet) {
	ss := segSorter{core: core, ranges: ranges, endpoints: endpoints, w: make([]int, len(ranges))}
	keys, v6s := ss.split()
	t.segV4 = ss.mergeV4(keys)
	ss.mergeV6(v6s)
	for s, r := range ranges {
		t.Segments[s].AllowedIPs = core[r[0]:ss.w[s]:ss.w[s]]
	}
	slices.SortFunc(ss.drops, func(a, b segDrop) int { return cmp.Or(cmp.Compare(a.seg, b.seg), comparePrefix(a.p, b.p)) })
	for _, d := range ss.drops {
		loc := t.Segments[d.seg].Location
		if d.owner < 0 {
			t.warn(fmt.Sprintf("%v of location %s contains WireGuard endpoint %v; dropped from %s", d.p, loc, d.ep, loc))
			continue
		}
		t.warn(fmt.Sprintf("%v of location %s is also in location %s; dropped from %s", d.p, loc, t.Segments[d.owner].Location, loc))
	}
}

// segSorter is sortSegments' state: every segment's prefixes are rewritten
// in place into core[ranges[s][0]:w[s]].
type segSorter struct {
	core      []netip.Prefix
	ranges    [][2]int
	endpoints *endpointSet
	w         []int // next write position per segment
	drops     []segDrop
}

// segDrop is prefix p of segment seg, dropped as already in segment owner,
// or (owner -1) because it contains WireGuard endpoint ep.
type segDrop struct {
	seg, owner int
	p          netip.Prefix
	ep         netip.Addr
}

// segEntry is a prefix (IPv6, or of a segment past the key's 24 bits) of
// segment seg.
type segEntry struct {
	seg int
	p   netip.Prefix
}

const low24 = 1<<24 - 1

// split returns the IPv4 prefixes as keys (v4key<<24|segment), sorted by
// one global sort, and the others as entries.
func (ss *segSorter) split() (keys []uint64, others []segEntry) {
	keys = make([]uint64, 0, len(ss.core))
	for s, r := range ss.ranges {
		ss.w[s] = r[0]
		for _, p := range ss.core[r[0]:r[1]] {
			if p.Addr().Is4() && s <= low24 {
				keys = append(keys, v4key(p)<<24|uint64(s))
			} else {
				others = append(others, segEntry{s, p})
			}
		}
	}
	sortU64(keys)
	return keys, others
}

// mergeV4 distributes the sorted keys to their segments in order, dropping
// endpoints' host prefixes, prefixes another segment has (first owner wins)
// and prefixes a segment's previous one contains; it returns the kept keys.
func (ss *segSorter) mergeV4(keys []uint64) []uint64 {
	last := make([]uint64, len(ss.ranges)) // last kept v4key per segment
	const none = ^uint64(0)                // not a v4key: its length would be 255
	for s := range last {
		last[s] = none
	}
	kept := keys[:0]
	owner := -1
	for i, k := range keys {
		p, s := k>>24, int(k&low24)
		// An endpoint's own host prefix is left out silently; a wider
		// prefix containing an endpoint is dropped and reported.
		if a, ok := ss.endpoints.within(fromV4key(p)); ok {
			if p&0xff != 32 && (i == 0 || keys[i-1] != k) {
				ss.drops = append(ss.drops, segDrop{seg: s, owner: -1, p: fromV4key(p), ep: a})
			}
			continue
		}
		if i > 0 && keys[i-1]>>24 == p {
			if s != owner {
				ss.drops = append(ss.drops, segDrop{seg: s, owner: owner, p: fromV4key(p)})
			}
			continue
		}
		owner = s
		if l := last[s]; l != none && containsKey(l, p) {
			continue
		}
		last[s] = p
		ss.core[ss.w[s]] = fromV4key(p)
		ss.w[s]++
		kept = append(kept, k)
	}
	return kept
}

// mergeV6 does the same for the other prefixes, sorted by comparison.
func (ss *segSorter) mergeV6(v6s []segEntry) {
	if len(v6s) == 0 {
		return
	}
	slices.SortFunc(v6s, func(a, b segEntry) int { return cmp.Or(cmp.Compare(a.seg, b.seg), comparePrefix(a.p, b.p)) })
	owners := make(map[netip.Prefix]int)
	for i, e := range v6s {
		if i > 0 && v6s[i-1] == e {
			continue
		}
		if a, ok := ss.endpoints.within(e.p); ok {
			if !e.p.IsSingleIP() {
				ss.drops = append(ss.drops, segDrop{seg: e.seg, owner: -1, p: e.p, ep: a})
			}
			continue
		}
		if o, dup := owners[e.p]; dup {
			ss.drops = append(ss.drops, segDrop{seg: e.seg, owner: o, p: e.p})
			continue
		}
		owners[e.p] = e.seg
		if r := ss.ranges[e.seg]; ss.w[e.seg] > r[0] {
			if l := ss.core[ss.w[e.seg]-1]; l.Addr().Is6() && l.Overlaps(e.p) {
				continue // sorted: l contains e.p
			}
		}
		ss.core[ss.w[e.seg]] = e.p
		ss.w[e.seg]++
	}
}

// containsKey reports whether v4key a contains v4key b.
func containsKey(a, b uint64) bool {
	ab, bb := int(a&0xff), int(b&0xff)
	return ab <= bb && uint32(b>>8)&^hostMask4(ab) == uint32(a>>8)
}

// checkALIs decides which allowed-location-ips survive: one overlapping
// another location's pod CIDRs, internal or mesh IPs, any WireGuard endpoint,
// or the allowed-location-ips of an earlier location (name order) is dropped.
func (t *Topology) checkALIs(core []netip.Prefix, ranges [][2]int, endpoints endpointSet) [][]netip.Prefix {
	x := coreIndex(core, ranges, endpoints)
	var earlier []ownedPrefix
	kept := make([][]netip.Prefix, len(t.Segments))
	for s := range t.Segments {
		seg := &t.Segments[s]
		var alis []netip.Prefix
		for _, i := range t.order[seg.mlo:seg.mhi] {
			for _, p := range t.members[i].n.AllowedLocationIPs {
				if p, ok := normPrefix(p); ok {
					alis = append(alis, p)
				}
			}
		}
		alis = mergePrefixes(alis)
		for _, p := range alis {
			if conflict := t.aliConflict(&x, earlier, p, s); conflict != "" {
				t.warn(fmt.Sprintf("allowed-location-ip %v of location %s %s; dropped from %s", p, seg.Location, conflict, seg.Location))
				continue
			}
			kept[s] = append(kept[s], p)
			t.alis = append(t.alis, p)
		}
		for _, p := range kept[s] {
			earlier = append(earlier, ownedPrefix{p, s})
		}
	}
	return kept
}

// ownedPrefix is a prefix of segment s.
type ownedPrefix struct {
	p netip.Prefix
	s int
}

// coreIndex indexes the segments' core prefixes (core[ranges[s]] belongs to
// segment s) and the WireGuard endpoints (ownerEndpoint).
func coreIndex(core []netip.Prefix, ranges [][2]int, endpoints endpointSet) spanIndex {
	var x spanIndex
	for s, r := range ranges {
		for _, p := range core[r[0]:r[1]] {
			x.add(p, s)
		}
	}
	for _, k := range endpoints.v4 {
		x.add(fromV4key(k), ownerEndpoint)
	}
	for _, a := range endpoints.v6 {
		x.add(hostPrefix(a), ownerEndpoint)
	}
	x.build()
	return x
}

// aliConflict says why allowed-location-ip p of segment s must be dropped
// ("" if it may stay): it overlaps another segment's core prefixes, contains
// an endpoint, or overlaps an allowed-location-ip kept earlier.
func (t *Topology) aliConflict(x *spanIndex, earlier []ownedPrefix, p netip.Prefix, s int) string {
	var conflict string
	x.each(p, func(i int) bool {
		switch o := int(x.s[i].owner); {
		case o == ownerEndpoint:
			conflict = fmt.Sprintf("contains WireGuard endpoint %v", x.s[i].prefix().Addr())
		case o != s:
			conflict = fmt.Sprintf("overlaps %v of location %s", x.s[i].prefix(), t.Segments[o].Location)
		default:
			return true
		}
		return false
	})
	if conflict != "" {
		return conflict
	}
	for _, e := range earlier {
		if e.s != s && e.p.Overlaps(p) {
			return fmt.Sprintf("overlaps allowed-location-ip %v of location %s", e.p, t.Segments[e.s].Location)
		}
	}
	return ""
}

// filterPeers drops peer allowed IPs that contain a WireGuard endpoint (routing
// them through the tunnel would loop) or overlap a segment's allowed IPs or
// those of an earlier peer (created first, then name order).
func (t *Topology) filterPeers(ps []Peer, endpoints *endpointSet) []Peer {
	var x spanIndex
	var has [2]bool
	for i := range ps {
		for _, p := range ps[i].AllowedIPs {
			x.add(p, i)
			has[family(p.Addr())] = true
		}
	}
	if len(x.s) == 0 {
		return ps
	}
	x.build()
	maxHi, segV6 := t.segmentIndexes(has)
	dropped := make([]bool, len(x.s))
	// In peer order: sort entry indices by owner.
	byOwner := make([]int32, len(x.s))
	for i := range byOwner {
		byOwner[i] = int32(i)
	}
	slices.SortFunc(byOwner, func(a, b int32) int {
		return cmp.Or(cmp.Compare(x.s[a].owner, x.s[b].owner), compareSpans(x.s[a], x.s[b]))
	})
	for _, i := range byOwner {
		e := &x.s[i]
		me, p := e.owner, e.prefix()
		if a, ok := endpoints.within(p); ok {
			dropped[i] = true
			t.warnPeer(ps[me].Name, fmt.Sprintf("allowed IP %v of peer %s contains WireGuard endpoint %v; dropped from peer %s", p, ps[me].Name, a, ps[me].Name))
			continue
		}
		seg, other := -1, netip.Prefix{}
		if e.fam == v4 {
			if k, ok := overlapV4(t.segV4, maxHi, uint32(e.lo.lo), uint32(e.hi.lo)); ok {
				seg, other = int(k&(1<<24-1)), fromV4key(k>>24)
			}
		} else {
			segV6.each(p, func(j int) bool {
				seg, other = int(segV6.s[j].owner), segV6.s[j].prefix()
				return false
			})
		}
		if seg >= 0 {
			dropped[i] = true
			t.warnPeer(ps[me].Name, fmt.Sprintf("allowed IP %v of peer %s overlaps %v of location %s; dropped from peer %s",
				p, ps[me].Name, other, t.Segments[seg].Location, ps[me].Name))
			continue
		}
		x.each(p, func(j int) bool {
			if o := x.s[j].owner; o < me && !dropped[j] {
				dropped[i] = true
				t.warnPeer(ps[me].Name, fmt.Sprintf("allowed IP %v of peer %s overlaps %v of peer %s; dropped from peer %s",
					p, ps[me].Name, x.s[j].prefix(), ps[o].Name, ps[me].Name))
				return false
			}
			return true
		})
	}
	return dropAllowedIPs(ps, &x, dropped)
}

// dropAllowedIPs removes the dropped entries of x from the peers' allowed IPs.
func dropAllowedIPs(ps []Peer, x *spanIndex, dropped []bool) []Peer {
	if !slices.Contains(dropped, true) {
		return ps
	}
	for pi := range ps {
		var ips []netip.Prefix
		for _, p := range ps[pi].AllowedIPs {
			if !isDropped(x, dropped, p, pi) {
				ips = append(ips, p)
			}
		}
		ps[pi].AllowedIPs = ips
	}
	return ps
}

// segmentIndexes indexes the segments' allowed IPs of the families the
// peers use: IPv4 as t.segV4 (sorted keys) with maxHi[i], the highest last
// address among keys[0..i]; IPv6 as a spanIndex.
func (t *Topology) segmentIndexes(has [2]bool) (maxHi []uint32, segV6 spanIndex) {
	if has[v4] {
		maxHi = make([]uint32, len(t.segV4))
		var m uint32
		for i, k := range t.segV4 {
			m = max(m, keyLast(k))
			maxHi[i] = m
		}
	}
	if has[v6] {
		for s := range t.Segments {
			for _, p := range t.Segments[s].AllowedIPs {
				if p.Addr().Is6() {
					segV6.add(p, s)
				}
			}
		}
		segV6.build()
	}
	return maxHi, segV6
}

// keyLast is the last address of the prefix in a segment key (v4key<<24|seg).
func keyLast(k uint64) uint32 {
	addr, bits := uint32(k>>32), (k>>24)&0xff
	return addr | uint32(uint64(1)<<(32-bits)-1)
}

// overlapV4 finds a segment key overlapping [lo, hi].
func overlapV4(keys []uint64, maxHi []uint32, lo, hi uint32) (uint64, bool) {
	i, _ := slices.BinarySearch(keys, uint64(lo)<<32)
	if i < len(keys) && uint32(keys[i]>>32) <= hi {
		return keys[i], true
	}
	for j := i - 1; j >= 0 && maxHi[j] >= lo; j-- {
		if keyLast(keys[j]) >= lo {
			return keys[j], true
		}
	}
	return 0, false
}

// isDropped looks up whether entry (p, owner) of x was dropped.
func isDropped(x *spanIndex, dropped []bool, p netip.Prefix, owner int) bool {
	q := spanOf(p, owner)
	if i, ok := slices.BinarySearchFunc(x.s, q, compareSpans); ok {
		return dropped[i]
	}
	return false
}

// SegmentAsPeer returns the Peer that makes nodeName, if it leads a segment,
// a peer of another cluster: its key, endpoint, keepalive and everything
// routed through it. It is false for a node that carries no WireGuard
// traffic.
func (t *Topology) SegmentAsPeer(nodeName string) (Peer, bool) {
	var zero wgtypes.Key
	for s := range t.Segments {
		seg := &t.Segments[s]
		if seg.Leader != nodeName || seg.PublicKey == zero {
			continue
		}
		return Peer{
			Name:                nodeName,
			PublicKey:           seg.PublicKey,
			AllowedIPs:          slices.Clone(seg.AllowedIPs),
			Endpoint:            seg.Endpoint,
			PersistentKeepalive: seg.PersistentKeepalive,
		}, true
	}
	return Peer{}, false
}

// PeerConfig returns the configuration the outside Peer peerName needs to
// join the mesh: its addresses are its allowed IPs and it peers with every
// segment's leader.
func (t *Topology) PeerConfig(peerName string) (OutsideConfig, error) {
	i := slices.IndexFunc(t.Peers, func(p Peer) bool { return p.Name == peerName })
	if i < 0 {
		return OutsideConfig{}, fmt.Errorf("peer %q not found or not usable", peerName)
	}
	p := &t.Peers[i]
	cfg := OutsideConfig{Addresses: slices.Clone(p.AllowedIPs)}
	var zero wgtypes.Key
	for s := range t.Segments {
		seg := &t.Segments[s]
		if seg.PublicKey == zero {
			continue
		}
		wp := WireGuardPeer{
			Name:                seg.Location,
			PublicKey:           seg.PublicKey,
			Endpoint:            seg.Endpoint,
			PersistentKeepalive: p.PersistentKeepalive,
			AllowedIPs:          slices.Clone(seg.AllowedIPs),
		}
		if p.PresharedKey != nil {
			psk := *p.PresharedKey
			wp.PresharedKey = &psk
		}
		cfg.Peers = append(cfg.Peers, wp)
	}
	return cfg, nil
}
