package mesh

import (
	"reflect"
	"slices"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestKeyRotationChangesOnlyThatPeersKey: a node that rotated its key (a
// new meshd.io/public-key, nothing else) changes, on every other node's
// plan, only the public key of the peer that stands for it: its allowed IPs,
// endpoint and keepalive, the leaders, the mesh IPs, the routes and the
// iptables rules stay, so the executor's delta is one peer replaced (the
// rotation loses nothing, docs/security.md). The rotating node's own plan
// does not change at all: its key is not part of the plan.
func TestKeyRotationChangesOnlyThatPeersKey(t *testing.T) {
	for _, g := range []Granularity{GranularityLocation, GranularityFull} {
		opts := v4opts()
		opts.Granularity = g
		nodes := twoByTwo(map[string][]func(*Node){"a": {preferLeader}, "c": {preferLeader}})
		rotated := slices.Clone(nodes)
		rotated[0].PublicKey = key("a-rotated") // node a rotates
		for _, self := range []string{"a", "b", "c", "d"} {
			before, err := Build(nodes, nil, Local{NodeName: self}, opts)
			if err != nil {
				t.Fatal(err)
			}
			after, err := Build(rotated, nil, Local{NodeName: self}, opts)
			if err != nil {
				t.Fatal(err)
			}
			// Map the old key to the new one in the old plan: then both agree.
			for i := range before.WireGuard.Peers {
				if before.WireGuard.Peers[i].PublicKey == key("a") {
					before.WireGuard.Peers[i].PublicKey = key("a-rotated")
				}
			}
			slices.SortFunc(before.WireGuard.Peers, func(x, y WireGuardPeer) int { return compareKey(x.PublicKey, y.PublicKey) })
			if !reflect.DeepEqual(before, after) {
				t.Errorf("%s, plan of %s: a's rotation changed more than a's key:\nbefore %+v\nafter  %+v", g, self, before.WireGuard, after.WireGuard)
			}
			if self != "a" && slices.ContainsFunc(after.WireGuard.Peers, func(p WireGuardPeer) bool { return p.PublicKey == key("a") }) {
				t.Errorf("%s, plan of %s: the old key is still a peer", g, self)
			}
		}
	}
}

func compareKey(a, b wgtypes.Key) int { return slices.Compare(a[:], b[:]) }
