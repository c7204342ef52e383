package mesh

import (
	"net/netip"
	"slices"
	"testing"
)

// TestFailClosed: with FailClosed, every route into the mesh (other
// locations, Peers) has an unreachable twin at FailClosedMetric in the same
// table; routes within the location have none; without FailClosed the plan
// is unchanged.
func TestFailClosed(t *testing.T) {
	nodes := []Node{
		node("a1", "a", "192.168.0.1", "10.1.1.0/24", preferLeader),
		node("a2", "a", "192.168.0.2", "10.1.2.0/24"),
		node("b1", "b", "192.168.1.1", "10.1.3.0/24", alis("172.16.0.0/24")),
		node("c1", "c", "192.168.2.1", "10.1.4.0/24", extra("fd00:2::1", "fd01:4::/64")),
	}
	peers := []Peer{peer("laptop", "10.9.0.1/32", "fd09::1/128")}
	for _, tc := range []struct {
		self string
		// tunnelled are destinations that must fail closed; within must not.
		tunnelled, within []string
	}{
		{"a1", []string{"10.1.3.0/24", "172.16.0.0/24", "10.1.4.0/24", "10.9.0.1/32"}, []string{"10.1.2.0/24"}},
		{"a2", []string{"10.1.3.0/24", "172.16.0.0/24", "10.1.4.0/24", "10.9.0.1/32"}, []string{"10.1.1.0/24"}},
	} {
		t.Run(tc.self, func(t *testing.T) {
			opts := dualOpts()
			opts.LocalRoutes = true
			plain, err := Build(nodes, peers, Local{NodeName: tc.self}, opts)
			if err != nil {
				t.Fatal(err)
			}
			opts.FailClosed = true
			p, err := Build(nodes, peers, Local{NodeName: tc.self}, opts)
			if err != nil {
				t.Fatal(err)
			}
			unicast := map[netip.Prefix]Route{}
			reject := map[netip.Prefix]Route{}
			for _, r := range p.Routes {
				if r.Type == RouteUnicast {
					unicast[r.Dst] = r
					continue
				}
				if r.Type != RouteUnreachable || r.Metric != FailClosedMetric || r.Device != "" || r.Gateway.IsValid() || r.Src.IsValid() {
					t.Errorf("bad reject route %+v", r)
				}
				if _, dup := reject[r.Dst]; dup {
					t.Errorf("two reject routes to %v", r.Dst)
				}
				reject[r.Dst] = r
			}
			if !slices.Equal(p.Routes[:len(plain.Routes)], plain.Routes) || len(unicast) != len(plain.Routes) {
				t.Errorf("FailClosed changed the ordinary routes:\n%v\n%v", plain.Routes, p.Routes)
			}
			for _, d := range tc.tunnelled {
				u, ok := unicast[pfx(d)]
				if !ok {
					t.Fatalf("no route to %s: %v", d, p.Routes)
				}
				r, ok := reject[pfx(d)]
				if !ok {
					t.Errorf("route to %s has no unreachable twin", d)
				} else if r.Table != u.Table {
					t.Errorf("reject route to %s in table %d, its route in %d", d, r.Table, u.Table)
				}
			}
			for _, d := range tc.within {
				if _, ok := unicast[pfx(d)]; !ok {
					t.Fatalf("no local route to %s", d)
				}
				if _, ok := reject[pfx(d)]; ok {
					t.Errorf("route within the location to %s fails closed", d)
				}
			}
			for d := range reject {
				if _, ok := unicast[d]; !ok {
					t.Errorf("reject route to %s without a route", d)
				}
			}
			if !slices.Equal(p.Rules, plain.Rules) {
				t.Errorf("rules changed: %v vs %v", p.Rules, plain.Rules)
			}
		})
	}
}

func TestFailClosedHelper(t *testing.T) {
	routes := []Route{
		{Table: 51820, Dst: pfx("10.1.0.0/24"), Device: "meshd0"},
		{Table: 51820, Dst: pfx("10.2.0.0/24"), Gateway: addr("192.168.0.1")},
		{Table: 51820, Dst: pfx("10.2.0.0/24"), Gateway: addr("192.168.0.2"), Metric: 5},
		{Table: 51820, Dst: pfx("10.3.0.0/24"), Gateway: addr("192.168.0.3")},
		{Table: 51820, Dst: pfx("10.4.0.0/24"), Type: RouteUnreachable, Metric: 7},
	}
	got := failClosed(routes, map[netip.Prefix]bool{pfx("10.3.0.0/24"): true})
	want := []Route{
		{Table: 51820, Dst: pfx("10.1.0.0/24"), Type: RouteUnreachable, Metric: FailClosedMetric},
		{Table: 51820, Dst: pfx("10.2.0.0/24"), Type: RouteUnreachable, Metric: FailClosedMetric},
	}
	if !slices.Equal(got, want) {
		t.Errorf("failClosed = %v, want %v", got, want)
	}
}
