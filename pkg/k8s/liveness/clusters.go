package liveness

// JudgeClusters decides, from the heartbeat Leases of this cluster's nodes,
// which linked clusters the tunnels reach. It is pure. Only nodes whose
// Lease is live (leaseLive) vote, each on the clusters it reports on
// (Report.ClustersUp/Down; location leaders probe the linked clusters'
// leaders through the tunnel). A cluster is down when a strict majority of
// its voters say down, up otherwise; a cluster no live node reports on is
// absent from the result (unknown: its endpoints keep their state).
func JudgeClusters(leaseLive map[string]bool, reports map[string]Report) map[string]bool {
	type tally struct{ up, down int }
	votes := map[string]*tally{}
	vote := func(cluster string) *tally {
		t := votes[cluster]
		if t == nil {
			t = &tally{}
			votes[cluster] = t
		}
		return t
	}
	for node, r := range reports {
		if !leaseLive[node] {
			continue
		}
		for _, c := range r.ClustersUp {
			vote(c).up++
		}
		for _, c := range r.ClustersDown {
			vote(c).down++
		}
	}
	out := make(map[string]bool, len(votes))
	for c, t := range votes {
		out[c] = t.down <= t.up
	}
	return out
}
