package mesh

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestCheckRemoteRange(t *testing.T) {
	guard := RemoteGuard{
		Local: []netip.Prefix{pfx("10.42.0.0/16"), pfx("10.4.0.0/16"), pfx("10.96.0.0/12")},
		Protected: []ProtectedAddr{
			{Addr: addr("198.51.100.10"), What: "the underlay address of node n1"},
			{Addr: addr("203.0.113.2"), What: "the API server"},
			{Addr: addr("2001:db8::10"), What: "the WireGuard endpoint of node n1"},
		},
	}
	allowed := []netip.Prefix{pfx("10.52.0.0/16"), pfx("10.5.0.0/16"), pfx("198.51.100.96/27"), pfx("2001:db8:1::/48")}
	for _, tc := range []struct {
		name    string
		p       string
		allowed []netip.Prefix
		want    RefusalReason // "" = accepted
		naming  string
	}{
		{"agreed pod CIDR", "10.52.3.0/24", allowed, "", ""},
		{"agreed remote node address", "198.51.100.101/32", allowed, "", ""},
		{"agreed IPv6", "2001:db8:1:2::/64", allowed, "", ""},
		{"no agreement recorded: anything else goes", "172.16.0.0/12", nil, "", ""},
		{"recorded empty agreement: nothing goes", "10.52.3.0/24", []netip.Prefix{}, RefusedNotAgreed, ""},
		{"overlaps the local pod range", "10.42.7.0/24", allowed, RefusedOverlap, "10.42.0.0/16"},
		{"covers the local pod range", "10.0.0.0/8", nil, RefusedOverlap, "10.42.0.0/16"},
		{"overlaps the service range", "10.100.0.0/16", nil, RefusedOverlap, "10.96.0.0/12"},
		{"covers a node's underlay address", "198.51.100.0/24", nil, RefusedProtected, "node n1"},
		{"is a node's underlay address", "198.51.100.10/32", allowed, RefusedProtected, "node n1"},
		{"covers the API server", "203.0.113.0/24", nil, RefusedProtected, "API server"},
		{"default route covers everything", "0.0.0.0/0", nil, RefusedOverlap, "10.42.0.0/16"},
		{"covers an IPv6 endpoint", "2001:db8::/32", nil, RefusedProtected, "WireGuard endpoint"},
		{"outside the agreement", "172.16.0.0/12", allowed, RefusedNotAgreed, ""},
		{"wider than the agreement", "10.52.0.0/15", allowed, RefusedNotAgreed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, bad := CheckRemoteRange(pfx(tc.p), tc.allowed, guard)
			if tc.want == "" {
				if bad {
					t.Fatalf("%s refused: %v", tc.p, r)
				}
				return
			}
			if !bad || r.Reason != tc.want {
				t.Fatalf("%s: refused=%v reason %q, want %q", tc.p, bad, r.Reason, tc.want)
			}
			r.Cluster, r.Via = "west", "w1"
			if msg := r.Error(); !strings.Contains(msg, tc.p) || !strings.Contains(msg, tc.naming) || !strings.Contains(msg, "west") {
				t.Errorf("message %q does not name %s, %q and the cluster", msg, tc.p, tc.naming)
			}
		})
	}
}

// RemotePeers: one peer per remote location leader; refused ranges are
// dropped from their peer only, everything else is routed; a leader's own
// endpoint host route is no claim; a range covering another remote leader's
// endpoint is refused (it would loop).
func TestRemotePeers(t *testing.T) {
	nodes := []Node{
		node("w1", "a", "198.51.100.101", "10.52.1.0/24"),
		node("w2", "a", "198.51.100.102", "10.52.2.0/24"),
		node("w3", "b", "198.51.100.103", "10.52.3.0/24", func(n *Node) {
			n.AllowedLocationIPs = []netip.Prefix{pfx("192.168.7.0/24"), pfx("203.0.113.0/24"), pfx("10.42.9.0/24")}
		}),
	}
	link := RemoteLink{Cluster: "west", Granularity: GranularityLocation, MeshCIDRs: []netip.Prefix{pfx("10.5.0.0/16")}, Port: 51820,
		ServiceCIDRs: []netip.Prefix{pfx("10.97.0.0/16")}}
	guard := RemoteGuard{Local: []netip.Prefix{pfx("10.42.0.0/16")},
		Protected: []ProtectedAddr{{Addr: addr("203.0.113.7"), What: "the underlay address of node e1"}}}
	for _, tc := range []struct {
		name    string
		allowed []netip.Prefix
		refused map[string]RefusalReason
		routed  []string
	}{
		{"no agreement", nil,
			map[string]RefusalReason{"203.0.113.0/24": RefusedProtected, "10.42.9.0/24": RefusedOverlap},
			[]string{"10.52.1.0/24", "10.52.2.0/24", "10.52.3.0/24", "192.168.7.0/24", "10.97.0.0/16"}},
		{"agreement at link time", ClaimableRanges(link.MeshCIDRs, link.ServiceCIDRs, nodes[:2]),
			map[string]RefusalReason{"203.0.113.0/24": RefusedProtected, "10.42.9.0/24": RefusedOverlap,
				"10.52.3.0/24": RefusedNotAgreed, "192.168.7.0/24": RefusedNotAgreed},
			[]string{"10.52.1.0/24", "10.52.2.0/24", "10.97.0.0/16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			link.Allowed = tc.allowed
			peers, refused, err := RemotePeers(link, nodes, guard)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]RefusalReason{}
			for _, r := range refused {
				if r.Cluster != "west" || r.Via == "" {
					t.Errorf("refusal without cluster or leader: %+v", r)
				}
				got[r.Prefix.String()] = r.Reason
			}
			for p, want := range tc.refused {
				if got[p] != want {
					t.Errorf("%s: refused as %q, want %q (all: %v)", p, got[p], want, got)
				}
			}
			var all []netip.Prefix
			for _, p := range peers {
				if !strings.HasPrefix(p.Name, "cluster-west-") {
					t.Errorf("peer name %q", p.Name)
				}
				if own := p.Endpoint.Addr.Addr(); slices.Contains(p.AllowedIPs, netip.PrefixFrom(own, 32)) {
					t.Errorf("peer %s routes its own endpoint %s", p.Name, own)
				}
				all = append(all, p.AllowedIPs...)
			}
			for _, want := range tc.routed {
				if !slices.Contains(all, pfx(want)) {
					t.Errorf("%s not routed: %v", want, all)
				}
			}
			for p := range tc.refused {
				if slices.Contains(all, pfx(p)) {
					t.Errorf("refused %s routed", p)
				}
			}
		})
	}
}

func TestClaimableRanges(t *testing.T) {
	nodes := []Node{
		node("w1", "a", "198.51.100.101", "10.52.1.0/24"),
		node("w2", "a", "198.51.100.102", "10.52.1.128/25", func(n *Node) { n.AllowedLocationIPs = []netip.Prefix{pfx("192.168.7.0/24")} }),
	}
	got := ClaimableRanges([]netip.Prefix{pfx("10.5.0.0/16")}, []netip.Prefix{pfx("10.97.0.0/16")}, nodes)
	want := []netip.Prefix{pfx("10.5.0.0/16"), pfx("10.52.1.0/24"), pfx("10.97.0.0/16"), pfx("192.168.7.0/24"), pfx("198.51.100.101/32"), pfx("198.51.100.102/32")}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
