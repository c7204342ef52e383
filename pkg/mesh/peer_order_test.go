package mesh

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// Of two Peers whose allowed IPs overlap, or that share a key, the one
// created first keeps them, whatever the names, and in any input order: a
// new Peer cannot take an existing one's routes. Peers created at the same
// time (or of linked clusters, without a creation time) fall back to name
// order. What is dropped of a Peer is a warning about it (PeerWarnings),
// which its status reports.
func TestPeerOverlapKeptByTheOlder(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	laptop := peer("laptop", "10.5.0.1/32")
	laptop.Created = t0
	office := peer("aaa-office", "10.5.0.0/16", "10.6.0.0/16")
	office.Created = t0.Add(time.Hour)
	twin := peer("aaa-twin", "10.7.0.1/32")
	twin.PublicKey = laptop.PublicKey // the laptop's key again, newer
	twin.Created = t0.Add(2 * time.Hour)
	nodes := twoByTwo(nil)
	for _, in := range [][]Peer{{office, laptop, twin}, {twin, laptop, office}, {laptop, twin, office}} {
		topo, err := NewTopology(nodes, in, Local{}, v4opts())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, p := range topo.Peers {
			got[p.Name] = joinPrefixesSep(p.AllowedIPs, ",")
		}
		if want := map[string]string{"laptop": "10.5.0.1/32", "aaa-office": "10.6.0.0/16"}; !reflect.DeepEqual(got, want) {
			t.Errorf("input order %v: peers route %v, want %v", names(in), got, want)
		}
		if w := topo.PeerWarnings; len(w["laptop"]) != 0 || len(w["aaa-office"]) != 1 || !strings.Contains(w["aaa-office"][0], "10.5.0.0/16 of peer aaa-office overlaps 10.5.0.1/32 of peer laptop") ||
			len(w["aaa-twin"]) != 1 || !strings.Contains(w["aaa-twin"][0], "peer aaa-twin has the same public key as peer laptop") {
			t.Errorf("input order %v: peer warnings %q", names(in), w)
		}
		plan, err := Build(append(nodes[:0:0], nodes...), in, Local{NodeName: "a"}, v4opts())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(plan.PeerWarnings, topo.PeerWarnings) {
			t.Errorf("plan peer warnings %q, want the topology's %q", plan.PeerWarnings, topo.PeerWarnings)
		}
	}
	// Created at the same time: name order, as before.
	office.Created = laptop.Created
	topo, err := NewTopology(nodes, []Peer{laptop, office}, Local{}, v4opts())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range topo.Peers {
		if p.Name == "laptop" && len(p.AllowedIPs) != 0 {
			t.Errorf("same creation time: laptop keeps %v, want aaa-office (first by name) to keep it", p.AllowedIPs)
		}
	}
}

func names(ps []Peer) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}
