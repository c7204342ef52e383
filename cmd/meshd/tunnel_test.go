package main

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/probe"
)

// Tunnel probe targets: the linked clusters' mesh addresses their leaders
// route, nothing else (pod CIDRs, underlay addresses, IPv6).
func TestTunnelTargets(t *testing.T) {
	pfx := netip.MustParsePrefix
	peers := map[string][]mesh.Peer{
		"c2": {
			{Name: "cluster-c2-a", AllowedIPs: []netip.Prefix{pfx("10.4.0.1/32"), pfx("10.244.0.0/24"), pfx("192.168.2.10/32"), pfx("fd00::1/128")}},
			{Name: "cluster-c2-b", AllowedIPs: []netip.Prefix{pfx("10.4.0.2/31")}},
		},
		"c3": {{Name: "cluster-c3-x", AllowedIPs: []netip.Prefix{pfx("10.5.0.9/32")}}},
	}
	mc := map[string][]netip.Prefix{"c2": {pfx("10.4.0.0/16"), pfx("fd00::/64")}, "c3": {pfx("10.5.0.0/16")}}
	var got []string
	for _, tg := range tunnelTargets(peers, mc) {
		got = append(got, tg.Name+"@"+tg.Addr.String())
	}
	want := []string{"c2/10.4.0.1@10.4.0.1:0", "c2/10.4.0.2@10.4.0.2:0", "c2/10.4.0.3@10.4.0.3:0", "c3/10.5.0.9@10.5.0.9:0"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tunnelTargets = %v, want %v", got, want)
	}
	if got := tunnelTargets(peers, nil); len(got) != 0 {
		t.Errorf("without mesh CIDRs: %v, want none", got)
	}
}

// A cluster is up when any of its leaders answers, down when none does and
// one answered before; never-answered targets are unknown.
func TestClusterReport(t *testing.T) {
	up, down := clusterReport(map[string]probe.State{
		"c2/10.4.0.1": probe.Down, "c2/10.4.0.2": probe.Up,
		"c3/10.5.0.1": probe.Down, "c3/10.5.0.2": probe.Down,
		"c4/10.6.0.1": probe.Up,
		"n1":          probe.Down, // not a tunnel target
	})
	if !reflect.DeepEqual(up, []string{"c2", "c4"}) || !reflect.DeepEqual(down, []string{"c3"}) {
		t.Errorf("clusterReport = up %v down %v, want up [c2 c4] down [c3]", up, down)
	}
}

// meshd_linked_cluster_tunnel_up follows clusterReport: 1 up, 0 down, no
// series for a cluster whose tunnel is unknown.
func TestTunnelUpMetric(t *testing.T) {
	results := map[string]probe.State{"c2/10.4.0.1": probe.Up, "c3/10.5.0.1": probe.Down, "c5/10.7.0.1": probe.Unknown}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(tunnelCollector{func() map[string]probe.State { return results }})
	want := `# HELP meshd_linked_cluster_tunnel_up Whether a linked cluster answers ICMP probes through the WireGuard tunnel from this node (1), or stopped answering (0); absent while unknown.
# TYPE meshd_linked_cluster_tunnel_up gauge
meshd_linked_cluster_tunnel_up{cluster="c2"} 1
meshd_linked_cluster_tunnel_up{cluster="c3"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshd_linked_cluster_tunnel_up"); err != nil {
		t.Error(err)
	}
	results = map[string]probe.State{"c3/10.5.0.1": probe.Up}
	if n := testutil.CollectAndCount(reg, "meshd_linked_cluster_tunnel_up"); n != 1 {
		t.Errorf("%d series after c2 became unknown and c3 came back, want 1", n)
	}
}
