package mesh

import (
	"cmp"
	"slices"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// DefaultLeaderCandidates is how many live leader candidates a location
// keeps (Candidates), the daemon's --leader-candidates default.
const DefaultLeaderCandidates = 4

// leaderOrder orders nodes as leaders are preferred whatever their
// liveness: one with a published key, then the preferred leader, then a
// public endpoint (0: equal; the name decides).
func leaderOrder(a, b *Node) int {
	var zero wgtypes.Key
	return cmp.Or(
		boolFirst(a.PublicKey != zero, b.PublicKey != zero),
		boolFirst(a.PreferLeader, b.PreferLeader),
		boolFirst(a.PublicEndpoint, b.PublicEndpoint))
}

// boolFirst orders true before false.
func boolFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// Candidates returns the leader candidates of every location: walking a
// location's members with a published key in the order leaders are
// preferred whatever their liveness (the preferred leader, then a public
// endpoint, then the name), every one up to and including the k-th whose
// heartbeat Lease is live (leaseLive; a node missing from it is not). A
// location whose candidates die thus gets new ones once their Leases
// expire, as long as it has k live members.
//
// Only candidates lead. So only they need to be judged (their Leases, the
// probes among them and their votes, see pkg/k8s/liveness): a node watches
// the heartbeat Leases of the candidates, k or a few more per location,
// not of every node. Every node computes the same set from the same Nodes
// and Leases. In full mesh, for nodes without a location and in a location
// with one keyed member, there is nothing to elect: none. k < 1 counts as
// 1.
func Candidates(nodes []Node, g Granularity, k int, leaseLive map[string]bool) map[string]bool {
	out := map[string]bool{}
	if g == GranularityFull {
		return out
	}
	var zero wgtypes.Key
	var keyed []*Node
	for i := range nodes {
		if n := &nodes[i]; n.Location != "" && n.Name != "" && n.PublicKey != zero {
			keyed = append(keyed, n)
		}
	}
	slices.SortFunc(keyed, func(a, b *Node) int {
		return cmp.Or(strings.Compare(a.Location, b.Location), leaderOrder(a, b), strings.Compare(a.Name, b.Name))
	})
	for lo := 0; lo < len(keyed); {
		hi := lo + 1
		for hi < len(keyed) && keyed[hi].Location == keyed[lo].Location {
			hi++
		}
		if hi-lo < 2 {
			lo = hi
			continue // one member leads whatever its liveness
		}
		live := 0
		for _, n := range keyed[lo:hi] {
			if live >= max(k, 1) {
				break
			}
			out[n.Name] = true
			if leaseLive[n.Name] {
				live++
			}
		}
		lo = hi
	}
	return out
}
