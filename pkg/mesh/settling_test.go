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

// A settling preferred node is the standby: the other locations' leaders
// peer with it (no allowed IPs, a keepalive to handshake at once) and it
// with them, its endpoint is not routed into the mesh, and the takeover
// then moves allowed IPs only.
func TestStandbyPeers(t *testing.T) {
	nodes := twoByTwo(map[string][]func(*Node){"a": {preferLeader}})
	local := func(name string) Local {
		return Local{NodeName: name, Live: map[string]bool{"a": true, "b": true, "c": true, "d": true}, Settling: map[string]bool{"a": true}}
	}
	pc, err := Build(nodes, nil, local("c"), v4opts())
	if err != nil {
		t.Fatal(err)
	}
	if !pc.Leader || pc.Leaders["x"] != "b" {
		t.Fatalf("c leads %v, leaders %v", pc.Leader, pc.Leaders)
	}
	var toA, toB *WireGuardPeer
	for i := range pc.WireGuard.Peers {
		switch pc.WireGuard.Peers[i].PublicKey {
		case key("a"):
			toA = &pc.WireGuard.Peers[i]
		case key("b"):
			toB = &pc.WireGuard.Peers[i]
		}
	}
	if toA == nil || toB == nil {
		t.Fatalf("c's peers: %+v", pc.WireGuard.Peers)
	}
	if len(toA.AllowedIPs) != 0 || toA.PersistentKeepalive == 0 || !toA.Endpoint.Addr.IsValid() {
		t.Errorf("standby peer a: %+v", *toA)
	}
	for _, p := range toB.AllowedIPs {
		if p.Contains(toA.Endpoint.Addr.Addr()) {
			t.Errorf("standby a's endpoint %s is routed to leader b (%s)", toA.Endpoint.Addr, p)
		}
	}
	pa, err := Build(nodes, nil, local("a"), v4opts())
	if err != nil {
		t.Fatal(err)
	}
	if pa.Leader || len(pa.WireGuard.Peers) != 1 || pa.WireGuard.Peers[0].PublicKey != key("c") || len(pa.WireGuard.Peers[0].AllowedIPs) == 0 {
		t.Errorf("standby a: leader %v, peers %+v; want one peer c with y's allowed IPs", pa.Leader, pa.WireGuard.Peers)
	}
	for _, r := range pa.Routes {
		if r.Device == DefaultInterface {
			t.Errorf("standby a routes into WireGuard before the takeover: %+v", r)
		}
	}
	leaderRoutes := 0
	for _, r := range pc.Routes {
		if r.Device == DefaultInterface {
			leaderRoutes++
		}
	}
	if leaderRoutes == 0 {
		t.Error("leader c has no route into WireGuard: the standby check above proves nothing")
	}
	pd, err := Build(nodes, nil, local("d"), v4opts())
	if err != nil {
		t.Fatal(err)
	}
	if len(pd.WireGuard.Peers) != 0 {
		t.Errorf("non-leader d has peers: %+v", pd.WireGuard.Peers)
	}
	// Settled: no standby, a leads with allowed IPs.
	l := local("c")
	l.Settling = nil
	pc, _ = Build(nodes, nil, l, v4opts())
	if pc.Leaders["x"] != "a" || len(pc.WireGuard.Peers) != 1 {
		t.Errorf("after settling: leaders %v, c's peers %d", pc.Leaders, len(pc.WireGuard.Peers))
	}
}

// Only candidates lead where a location has any (Local.Candidates): a
// settled live non-candidate does not win over a settling candidate, and
// a location without candidates elects among everyone.
func TestElectAmongCandidates(t *testing.T) {
	nodes := twoByTwo(map[string][]func(*Node){"b": {preferLeader}})
	all := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	topo, err := NewTopology(nodes, nil, Local{Live: all, Settling: map[string]bool{"a": true}, Candidates: map[string]bool{"a": true}}, v4opts())
	if err != nil {
		t.Fatal(err)
	}
	if topo.Segments[0].Leader != "a" || topo.Segments[1].Leader != "c" {
		t.Errorf("leaders %s, %s; want a (the only candidate of x, settling), c (y has no candidates)", topo.Segments[0].Leader, topo.Segments[1].Leader)
	}
	if s, ok := topo.Standby("x"); ok {
		t.Errorf("standby %s of x: a non-candidate", s)
	}
}
