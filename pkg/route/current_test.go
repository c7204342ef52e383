package route

import (
	"strings"
	"testing"
)

// TestCurrent: meshd's routes and rules as the kernel has them, read now
// (a route deleted behind meshd's back is gone from it), nothing written.
func TestCurrent(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}, {Dst: pfx("10.6.0.0/16"), Device: "wg0"}}, []Rule{{}})
	writes := m.Writes()
	routes, rules, err := m.Current()
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 2 || !strings.HasPrefix(routes[0], "10.5.0.0/16 table 51820 dev wg0 ") || len(rules) != 1 || !strings.Contains(rules[0], "lookup 51820") {
		t.Fatalf("routes %q, rules %q", routes, rules)
	}
	for r := range ours(f) {
		if r.Dst == pfx("10.6.0.0/16") {
			if err := f.DelRoute(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	routes, _, err = m.Current()
	if err != nil || len(routes) != 1 || m.Writes() != writes {
		t.Errorf("after a deletion: %q, %v, %d writes (had %d)", routes, err, m.Writes(), writes)
	}
}
