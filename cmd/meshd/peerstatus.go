package main

import (
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// peerReporter takes the report stage's findings about Peers
// (convert.PeerStatusWriter: Report never blocks).
type peerReporter interface{ Report(convert.PeerReport) }

// reportPeers hands this node's view of every Peer object to the status
// writer: whether it converted (objects holds the usable ones), the problems
// reported for it, and, read from the WireGuard interface after the apply,
// whether the interface carries it and its latest handshake. Only a location
// leader reports findings; a non-leader's report removes its old entries.
func (r *reconciler) reportPeers(peers []*v1alpha1.Peer, objects []mesh.Peer, plan *mesh.Plan) {
	if r.peerStatus == nil {
		return
	}
	rep := convert.PeerReport{Node: r.node, Location: plan.Location, Leader: plan.Leader && reportsPeers(plan)}
	if rep.Leader {
		rep.Locations = make(map[string]bool, len(plan.Leaders))
		for loc := range plan.Leaders {
			rep.Locations[loc] = true
		}
		stats, err := r.device.Stats()
		if err != nil {
			return // the interface cannot be read: report nothing this time
		}
		on := make(map[[32]byte]int, len(stats))
		for i, s := range stats {
			on[s.PublicKey] = i
		}
		usable := make(map[string]mesh.Peer, len(objects))
		for _, p := range objects {
			usable[p.Name] = p
		}
		rep.Peers = make(map[string]convert.PeerFinding, len(peers))
		for _, o := range peers {
			// What conversion refused of it, then what the planner dropped
			// (an allowed IP another Peer or a location keeps).
			msg := r.reported["peer/"+o.Name]
			if ws := plan.PeerWarnings[o.Name]; len(ws) > 0 {
				msg = strings.Join(append(slices.DeleteFunc([]string{msg}, func(m string) bool { return m == "" }), ws...), "\n")
			}
			f := convert.PeerFinding{Message: msg}
			if p, ok := usable[o.Name]; ok {
				f.Accepted = true
				if i, ok := on[p.PublicKey]; ok {
					f.Applied = true
					f.LastHandshake = stats[i].LastHandshake
				}
			}
			rep.Peers[o.Name] = f
		}
	}
	r.peerStatus.Report(rep)
}

// reportsPeers says whether this leader's location is one of the first
// convert.MaxPeerStatusLeaders locations by name, the ones that report on
// Peers: a full mesh of many nodes (every node its own location) would
// otherwise have every node race to write every Peer's status.
func reportsPeers(plan *mesh.Plan) bool {
	if len(plan.Leaders) <= convert.MaxPeerStatusLeaders {
		return true
	}
	locs := slices.Sorted(maps.Keys(plan.Leaders))
	return slices.Contains(locs[:convert.MaxPeerStatusLeaders], plan.Location)
}

// statusOnly reports whether a Peer update changed nothing but its status
// (or metadata the planner ignores): the spec is what the plan reads.
func statusOnly(old, cur any) bool {
	o, ok1 := old.(*v1alpha1.Peer)
	c, ok2 := cur.(*v1alpha1.Peer)
	return ok1 && ok2 && o.Generation != 0 && o.Generation == c.Generation && equality.Semantic.DeepEqual(o.Spec, c.Spec)
}
