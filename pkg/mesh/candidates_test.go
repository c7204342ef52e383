package mesh

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestCandidates(t *testing.T) {
	// Location x: a..f, with e preferred and f a public endpoint; location
	// y: g, h; i has no location; j no key; k is alone in z.
	nodes := []Node{
		node("a", "x", "", ""), node("b", "x", "", ""), node("c", "x", "", ""), node("d", "x", "", ""),
		node("e", "x", "", "", preferLeader), node("f", "x", "", "", public("198.51.100.6:51820")),
		node("g", "y", "", ""), node("h", "y", "", ""),
		node("i", "", "", ""), node("j", "y", "", "", noKey), node("k", "z", "", ""),
	}
	all := map[string]bool{}
	for _, n := range nodes {
		all[n.Name] = true
	}
	without := func(names ...string) map[string]bool {
		m := maps.Clone(all)
		for _, n := range names {
			delete(m, n)
		}
		return m
	}
	set := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	for _, tc := range []struct {
		name string
		g    Granularity
		k    int
		live map[string]bool
		want map[string]bool
	}{
		{"the first k in leader order", GranularityLocation, 3, all, set("e", "f", "a", "g", "h")},
		{"dead ones are walked past", GranularityLocation, 3, without("e", "a"), set("e", "f", "a", "b", "c", "g", "h")},
		{"fewer than k live: every keyed member", GranularityLocation, 3, set("f"), set("a", "b", "c", "d", "e", "f", "g", "h")},
		{"k of 1", GranularityLocation, 1, all, set("e", "g")},
		{"k below 1 counts as 1", GranularityLocation, 0, all, set("e", "g")},
		{"full mesh: none", GranularityFull, 3, all, set()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Candidates(nodes, tc.g, tc.k, tc.live); !maps.Equal(got, tc.want) {
				t.Errorf("Candidates = %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(tc.want)))
			}
		})
	}
}

// Property: whatever is live, every location of two or more keeps min(k,
// its live keyed members) live candidates; a node that knows the liveness
// of the candidates only (a daemon: it watches their Leases) elects the
// same leaders and standbys as one that knows everyone's (the link
// controller, meshctl); and without settling nodes that is the election
// without candidates: the best live node is always a candidate.
func TestCandidatesProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for run := range 500 {
		var nodes []Node
		for i := range 2 + rng.IntN(12) {
			var mods []func(*Node)
			if rng.IntN(4) == 0 {
				mods = append(mods, preferLeader)
			}
			if rng.IntN(4) == 0 {
				mods = append(mods, public(fmt.Sprintf("198.51.100.%d:51820", i+1)))
			}
			nodes = append(nodes, node(fmt.Sprintf("n%02d", i), fmt.Sprintf("l%d", rng.IntN(3)), fmt.Sprintf("192.168.0.%d", i+1), fmt.Sprintf("10.1.%d.0/24", i), mods...))
		}
		live, settling := map[string]bool{}, map[string]bool{}
		for _, n := range nodes {
			live[n.Name] = rng.IntN(3) > 0
			settling[n.Name] = live[n.Name] && rng.IntN(4) == 0
		}
		k := 1 + rng.IntN(4)
		cands := Candidates(nodes, GranularityLocation, k, live)
		members, perLoc, liveCands := map[string]int{}, map[string]int{}, map[string]int{}
		for _, n := range nodes {
			members[n.Location]++
			if live[n.Name] {
				perLoc[n.Location]++
				if cands[n.Name] {
					liveCands[n.Location]++
				}
			}
		}
		for loc, n := range perLoc {
			want := min(k, n)
			if members[loc] < 2 {
				want = 0 // alone: it leads whatever its liveness
			}
			if liveCands[loc] != want {
				t.Fatalf("run %d: location %s has %d live candidates of %d live members, want %d (k %d)", run, loc, liveCands[loc], n, want, k)
			}
		}
		partial, partialSettling := map[string]bool{}, map[string]bool{}
		for n := range cands {
			partial[n], partialSettling[n] = live[n], settling[n]
		}
		topo := func(l Local) *Topology {
			tp, err := NewTopology(nodes, nil, l, v4opts())
			if err != nil {
				t.Fatal(err)
			}
			return tp
		}
		full := topo(Local{Live: live, Settling: settling, Candidates: cands})
		daemon := topo(Local{Live: partial, Settling: partialSettling, Candidates: cands})
		plain := topo(Local{Live: live})
		restricted := topo(Local{Live: live, Candidates: cands})
		for i := range full.Segments {
			loc := full.Segments[i].Location
			fs, _ := full.Standby(loc)
			ds, _ := daemon.Standby(loc)
			if full.Segments[i].Leader != daemon.Segments[i].Leader || fs != ds {
				t.Fatalf("run %d: location %s: leader %s standby %q knowing everyone, %s %q knowing the candidates (k %d, candidates %v)",
					run, loc, full.Segments[i].Leader, fs, daemon.Segments[i].Leader, ds, k, cands)
			}
			if liveCands[loc] > 0 && plain.Segments[i].Leader != restricted.Segments[i].Leader {
				t.Fatalf("run %d: location %s: leader %s without candidates, %s with (k %d, candidates %v)",
					run, loc, plain.Segments[i].Leader, restricted.Segments[i].Leader, k, cands)
			}
		}
	}
}
