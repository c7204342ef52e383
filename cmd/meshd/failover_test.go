package main

import (
	"net/netip"
	"reflect"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/probe"
)

func TestProbeTargets(t *testing.T) {
	key := wgtypes.Key{1}
	n := func(name, loc, ip string, mod ...func(*mesh.Node)) mesh.Node {
		a := netip.MustParseAddr(ip)
		m := mesh.Node{Name: name, Location: loc, PublicKey: key, InternalIPs: []netip.Addr{a},
			Endpoint: mesh.Endpoint{Addr: netip.AddrPortFrom(a, 51820)}}
		for _, f := range mod {
			f(&m)
		}
		return m
	}
	prefer := func(m *mesh.Node) { m.PreferLeader = true }
	nodes := []mesh.Node{
		n("a1", "a", "198.51.100.10"), n("a2", "a", "198.51.100.11"), n("a3", "a", "198.51.100.12"),
		n("a4", "a", "198.51.100.13", func(m *mesh.Node) { m.PublicKey = wgtypes.Key{} }), // no meshd yet
		n("b1", "b", "203.0.113.1"), n("b2", "b", "203.0.113.2"), n("b3", "b", "203.0.113.3"),
		n("b4", "b", "203.0.113.4"), n("b5", "b", "203.0.113.5", prefer), n("b6", "b", "203.0.113.6"),
		n("c1", "c", "203.0.113.20"), // alone: nothing to choose
	}
	tg := func(name, ip string) probe.Target {
		return probe.Target{Name: name, Addr: netip.AddrPortFrom(netip.MustParseAddr(ip), 51821)}
	}
	// k=3: a's candidates a1, a2, a3 (a4 has no key); b's are b5
	// (preferred), b1, b2, and, b1 being dead and b3's Lease never seen,
	// b3 and b4 too; c1 is alone. A candidate probes every other candidate
	// with an observed Lease (not b3): its own location's at the internal
	// IP, the others' at the endpoint.
	live := map[string]bool{"a1": true, "a2": true, "a3": true, "b1": false, "b2": true, "b4": true, "b5": true, "b6": true, "c1": true}
	cands := mesh.Candidates(nodes, mesh.GranularityLocation, 3, live)
	if want := map[string]bool{"a1": true, "a2": true, "a3": true, "b5": true, "b1": true, "b2": true, "b3": true, "b4": true}; !reflect.DeepEqual(cands, want) {
		t.Fatalf("candidates %v, want %v", cands, want)
	}
	judged := map[string]bool{}
	for n := range live {
		judged[n] = cands[n]
	}
	// b5 leads b: probed at every interval, b's other candidates at every
	// 4th.
	slow := func(tt probe.Target) probe.Target { tt.Every = remoteCandidateEvery; return tt }
	got := probeTargets(nodes, "a1", mesh.GranularityLocation, cands, judged, map[string]string{"a": "a1", "b": "b5"}, 51821)
	want := []probe.Target{
		tg("a2", "198.51.100.11"), tg("a3", "198.51.100.12"),
		slow(tg("b1", "203.0.113.1")), slow(tg("b2", "203.0.113.2")), slow(tg("b4", "203.0.113.4")), tg("b5", "203.0.113.5"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("probeTargets =\n%v\nwant\n%v", got, want)
	}
	if got := probeTargets(nodes, "b6", mesh.GranularityLocation, cands, judged, nil, 51821); len(got) != 0 {
		t.Errorf("b6 is no candidate: it probes nothing, got %v", got)
	}
	full := mesh.Candidates(nodes, mesh.GranularityFull, 3, live)
	if got := probeTargets(nodes, "a1", mesh.GranularityFull, full, judged, nil, 51821); len(got) != 0 {
		t.Errorf("full mesh: every node leads itself, nothing to probe: %v", got)
	}
	keys := convert.LocationKeys([]mesh.Node{{Name: "x", Location: "a"}, {Name: "y"}}, mesh.GranularityLocation)
	if want := map[string]string{"x": "location/a", "y": "node/y"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("locationKeys = %v", keys)
	}
}
