package mesh

import "testing"

// A settling node (live only recently) leads only where no settled live
// member can: a recovered preferred leader waits; with everyone settling,
// the usual preference order holds.
func TestElectSettling(t *testing.T) {
	nodes := twoByTwo(map[string][]func(*Node){"a": {preferLeader}, "c": {preferLeader}})
	all := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	for _, tc := range []struct {
		name     string
		live     map[string]bool
		settling map[string]bool
		want     map[string]string
	}{
		{"none settling", all, nil, map[string]string{"x": "a", "y": "c"}},
		{"preferred settling", all, map[string]bool{"a": true}, map[string]string{"x": "b", "y": "c"}},
		{"all of x settling", all, map[string]bool{"a": true, "b": true}, map[string]string{"x": "a", "y": "c"}},
		{"settled peer dead", map[string]bool{"a": true, "c": true, "d": true}, map[string]bool{"a": true}, map[string]string{"x": "a", "y": "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, err := NewTopology(nodes, nil, Local{Live: tc.live, Settling: tc.settling}, v4opts())
			if err != nil {
				t.Fatal(err)
			}
			for _, seg := range topo.Segments {
				if seg.Leader != tc.want[seg.Location] {
					t.Errorf("location %s: leader %s, want %s", seg.Location, seg.Leader, tc.want[seg.Location])
				}
			}
		})
	}
}
