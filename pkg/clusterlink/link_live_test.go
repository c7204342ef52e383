package clusterlink

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
)

// A linked cluster's leaders follow its liveness decision: a dead leader is
// replaced by a live member of its location, and the service CIDRs go to
// the first live leader rather than to the first leader.
func TestRemotePeersLive(t *testing.T) {
	ls := LinkSettings{Name: "west", Granularity: mesh.GranularityLocation, Port: 51820,
		MeshCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}}
	nodes := []*corev1.Node{
		remoteNode(t, "w1", "a", "198.51.100.101", "10.52.1.0/24"),
		remoteNode(t, "w2", "a", "198.51.100.102", "10.52.2.0/24"),
		remoteNode(t, "w3", "b", "198.51.100.103", "10.52.3.0/24"),
		remoteNode(t, "w4", "c", "198.51.100.104", "10.52.4.0/24"),
	}
	local := []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16")}
	var gotK int
	var gotG mesh.Granularity
	judge := func(live map[string]bool) RemoteJudge {
		return func(_ []mesh.Node, g mesh.Granularity, k int) liveness.Decision {
			gotG, gotK = g, k
			return liveness.Decision{Live: live}
		}
	}
	svc := netip.MustParsePrefix("10.97.0.0/16")
	names := func(ps []mesh.Peer) (out []string, withSvc string) {
		for _, p := range ps {
			out = append(out, p.Name)
			if slices.Contains(p.AllowedIPs, svc) {
				withSvc = p.Name
			}
		}
		return out, withSvc
	}

	// w1 (a's leader) and w3 (b's, alone) are dead: a fails over to w2; b
	// keeps its only node, dead, and the services go to the first live
	// leader (w2) instead.
	peers, problems := RemotePeersLive(ls, nodes, mesh.RemoteGuard{Local: local}, judge(map[string]bool{"w2": true, "w4": true}))
	if len(problems) != 0 {
		t.Fatal(problems)
	}
	got, withSvc := names(peers)
	if want := []string{"cluster-west-w2", "cluster-west-w3", "cluster-west-w4"}; !slices.Equal(got, want) || withSvc != "cluster-west-w2" {
		t.Errorf("peers %v, services via %s; want %v, services via cluster-west-w2", got, withSvc, want)
	}
	if gotG != mesh.GranularityLocation || gotK != mesh.DefaultLeaderCandidates {
		t.Errorf("judge got granularity %s and %d candidates", gotG, gotK)
	}
	// Only w4 live: services via w4.
	peers, _ = RemotePeersLive(ls, nodes, mesh.RemoteGuard{Local: local}, judge(map[string]bool{"w4": true}))
	if _, withSvc := names(peers); withSvc != "cluster-west-w4" {
		t.Errorf("services via %s, want cluster-west-w4", withSvc)
	}
	// No judge: everyone live, services via the first leader (as RemotePeers).
	peers, _ = RemotePeersLive(ls, nodes, mesh.RemoteGuard{Local: local}, nil)
	if got, withSvc := names(peers); got[0] != "cluster-west-w1" || withSvc != "cluster-west-w1" {
		t.Errorf("without a judge: %v, services via %s", got, withSvc)
	}
}

// The linked cluster's --leader-candidates comes from what most of its
// nodes publish (the default when none does): its nodes elect among that
// many candidates, and so must the link controller.
func TestLinkedLeaderCandidates(t *testing.T) {
	with := func(name, settings string) *corev1.Node {
		n := remoteNode(t, name, "a", "198.51.100.101", "10.52.1.0/24")
		if settings != "" {
			n.Annotations[convert.AnnotationSettings] = settings
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		want  int
	}{
		{"none published", []*corev1.Node{with("w1", "")}, mesh.DefaultLeaderCandidates},
		{"an older meshd: not published", []*corev1.Node{with("w1", `{"granularity":"location"}`)}, mesh.DefaultLeaderCandidates},
		{"most nodes", []*corev1.Node{with("w1", `{"leaderCandidates":6}`), with("w2", `{"leaderCandidates":6}`), with("w3", `{"leaderCandidates":3}`)}, 6},
		{"a tie: the smaller", []*corev1.Node{with("w1", `{"leaderCandidates":6}`), with("w2", `{"leaderCandidates":3}`)}, 3},
		{"malformed", []*corev1.Node{with("w1", `{`)}, mesh.DefaultLeaderCandidates},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := leaderCandidates(tc.nodes); got != tc.want {
				t.Errorf("leaderCandidates = %d, want %d", got, tc.want)
			}
		})
	}
}
