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
	// b's leader is b6 (say b5 died): probed, plus the first three
	// candidates in preference order (b5 preferred, then by name).
	got := probeTargets(nodes, "a1", mesh.GranularityLocation, map[string]string{"a": "a1", "b": "b6", "c": "c1"}, 51821)
	want := []probe.Target{
		tg("a2", "198.51.100.11"), tg("a3", "198.51.100.12"),
		tg("b1", "203.0.113.1"), tg("b2", "203.0.113.2"), tg("b5", "203.0.113.5"), tg("b6", "203.0.113.6"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("probeTargets =\n%v\nwant\n%v", got, want)
	}
	if got := probeTargets(nodes, "a1", mesh.GranularityFull, nil, 51821); len(got) != 0 {
		t.Errorf("full mesh: every node leads itself, nothing to probe: %v", got)
	}
	keys := convert.LocationKeys([]mesh.Node{{Name: "x", Location: "a"}, {Name: "y"}}, mesh.GranularityLocation)
	if want := map[string]string{"x": "location/a", "y": "node/y"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("locationKeys = %v", keys)
	}
}
