package convert

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/secrets"
	"meshd.io/meshd/pkg/mesh"
)

// fuzzKey is a deterministic key; fuzzKeyText its base64 text.
func fuzzKey(i int) wgtypes.Key { return wgtypes.Key(sha256.Sum256([]byte{byte(i)})) }

func fuzzKeyText(i int) string { return fuzzKey(i).String() }

// applyMergePatch applies an annotation merge patch from AnnotationPatch the
// way the API server does: a null value deletes the key.
func applyMergePatch(t *testing.T, annotations map[string]string, patch []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range annotations {
		out[k] = v
	}
	if patch == nil {
		return out
	}
	var p struct {
		Metadata struct {
			Annotations map[string]*string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		t.Fatalf("patch %s is not JSON: %v", patch, err)
	}
	for k, v := range p.Metadata.Annotations {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = *v
		}
	}
	return out
}

// publishedOf is what meshd publishes for a node it parsed as n.
func publishedOf(n mesh.Node) Published {
	return Published{
		PublicKey:           n.PublicKey,
		Endpoint:            n.Endpoint.Addr, // invalid for a DNS name: not published
		InternalIPs:         n.InternalIPs,
		WireGuardIPs:        n.WireGuardIPs,
		DiscoveredEndpoints: n.DiscoveredEndpoints,
	}
}

// parseStatusAddrs decodes "I:addr,E:addr,H:name" into status addresses.
func parseStatusAddrs(s string) []corev1.NodeAddress {
	var out []corev1.NodeAddress
	for _, f := range strings.Split(s, ",") {
		typ, a, ok := strings.Cut(f, ":")
		if !ok {
			continue
		}
		t := map[string]corev1.NodeAddressType{"I": corev1.NodeInternalIP, "E": corev1.NodeExternalIP, "H": corev1.NodeHostName}[typ]
		out = append(out, corev1.NodeAddress{Type: t, Address: a})
	}
	return out
}

// FuzzNodeFromObject parses a Node with fuzzed annotations, status
// addresses and pod CIDRs. Whatever the input: every error is an
// *AnnotationError, the result is normalized (unmapped addresses, at most one
// per family, IPv4 first, masked CIDRs, a usable port), parsing is
// deterministic, and publishing what was parsed and parsing again gives the
// same mesh.Node without errors on the published annotations (and a second
// publication patches nothing).
func FuzzNodeFromObject(f *testing.F) {
	f.Add("x", "true", fuzzKeyText(1), "", "", "25", "", "", "", "", "", "I:192.168.0.1", "10.42.1.0/24", 0)
	f.Add("", "false", fuzzKeyText(2), "vpn.example.org:51821", "10.0.0.1,fd00::1/64", "0", "172.16.0.0/16, 10.9.0.0/24",
		"198.51.100.1:51820", "10.0.0.9", "10.4.0.1,fd4e::1", `{"`+fuzzKeyText(3)+`":"203.0.113.7:4000"}`, "I:192.168.0.2,E:198.51.100.2,I:fd00::2", "10.42.2.0/24,fd42::/64", 4000)
	f.Add(" y ", "yes", "not-a-key", "[fd00::1]:0", "::ffff:10.0.0.1", "-1", "bad", "[fe80::1%eth0]:1", "1.2.3.4,5.6.7.8", "x", "{", "E:::ffff:198.51.100.3,E:198.51.100.4", "::ffff:10.0.0.0/104", 70000)
	f.Add("", "", "", "", "", "", "", "[2001:db8::1]:51820", "", "", `{"`+fuzzKeyText(3)+`":"[2001:db8::3]:51820","`+fuzzKeyText(4)+`":"[::ffff:192.0.2.1]:7"}`, "", "", 0)
	f.Fuzz(func(t *testing.T, location, leader, publicKey, forceEndpoint, forceInternalIP, keepalive, alis,
		endpoint, internalIP, wireguardIP, discovered, status, podCIDRs string, port int) {
		annotations := map[string]string{}
		for k, v := range map[string]string{
			AnnotationLocation: location, AnnotationLeader: leader, AnnotationPublicKey: publicKey,
			AnnotationForceEndpoint: forceEndpoint, AnnotationForceInternalIP: forceInternalIP,
			AnnotationPersistentKeepalive: keepalive, AnnotationAllowedLocationIPs: alis,
			AnnotationEndpoint: endpoint, AnnotationInternalIP: internalIP, AnnotationWireGuardIP: wireguardIP,
			AnnotationDiscoveredEndpoints: discovered,
		} {
			if v != "" {
				annotations[k] = v
			}
		}
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: annotations, Labels: map[string]string{DefaultTopologyLabel: "region"}},
			Status:     corev1.NodeStatus{Addresses: parseStatusAddrs(status)},
		}
		if podCIDRs != "" {
			node.Spec.PodCIDRs = strings.Split(podCIDRs, ",")
		}
		o := ParseOptions{Port: port}
		n1, errs := NodeFromObject(node, o)
		for _, err := range errs {
			var ae *AnnotationError
			if !errors.As(err, &ae) {
				t.Errorf("error %v is not an *AnnotationError", err)
			}
		}
		checkNormalNode(t, n1)
		for range 2 {
			if again, _ := NodeFromObject(node, o); !reflect.DeepEqual(again, n1) {
				t.Fatalf("parsing the same node twice differs:\n%+v\n%+v", n1, again)
			}
		}

		// Publish what was parsed, as the API server would store it.
		want := NodeAnnotations(publishedOf(n1))
		patch, err := AnnotationPatch(want, node.Annotations)
		if err != nil {
			t.Fatal(err)
		}
		published := node.DeepCopy()
		published.Annotations = applyMergePatch(t, node.Annotations, patch)
		n2, errs2 := NodeFromObject(published, o)
		for _, err := range errs2 {
			var ae *AnnotationError
			if errors.As(err, &ae) && isPublished(ae.Annotation) {
				t.Errorf("meshd's own annotation does not parse: %v", err)
			}
		}
		if !reflect.DeepEqual(n1, n2) {
			t.Fatalf("parse, publish, parse changed the node:\n%+v\n%+v\nannotations %q", n1, n2, published.Annotations)
		}
		if again, _ := AnnotationPatch(NodeAnnotations(publishedOf(n2)), published.Annotations); again != nil {
			t.Fatalf("publishing the same node again patches %s", again)
		}
	})
}

func isPublished(annotation string) bool {
	for _, a := range PublishedAnnotations() {
		if a == annotation {
			return true
		}
	}
	return false
}

// checkNormalNode checks the normal form NodeFromObject promises.
func checkNormalNode(t *testing.T, n mesh.Node) {
	t.Helper()
	addrList := func(what string, as []netip.Addr) {
		if len(as) > 2 || len(as) == 2 && (!as[0].Is4() || !as[1].Is6()) {
			t.Errorf("%s %v: want at most one per family, IPv4 first", what, as)
		}
		for _, a := range as {
			if !a.IsValid() || a.Is4In6() || a.Zone() != "" {
				t.Errorf("%s: %v is not a plain address", what, a)
			}
		}
	}
	addrList("internal IPs", n.InternalIPs)
	addrList("mesh IPs", n.WireGuardIPs)
	for _, ps := range [][]netip.Prefix{n.PodCIDRs, n.AllowedLocationIPs} {
		for _, p := range ps {
			if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() {
				t.Errorf("CIDR %v is not normalized", p)
			}
		}
	}
	checkEndpoint(t, n.Endpoint)
	for k, ap := range n.DiscoveredEndpoints {
		if !ap.IsValid() || ap.Port() == 0 || ap.Addr().Is4In6() || ap.Addr().Zone() != "" {
			t.Errorf("discovered endpoint %v of %s is not usable", ap, k)
		}
	}
	if n.PersistentKeepalive < 0 {
		t.Errorf("negative keepalive %v", n.PersistentKeepalive)
	}
}

// checkEndpoint checks that e is empty, an IP endpoint with a port, or a
// valid lower-case DNS name with a port.
func checkEndpoint(t *testing.T, e mesh.Endpoint) {
	t.Helper()
	switch {
	case e.IsZero():
	case e.Host != "":
		if e.Addr.Addr().IsValid() || e.Addr.Port() == 0 {
			t.Errorf("DNS endpoint %q has address %v", e.Host, e.Addr)
		}
		if msgs := validation.IsDNS1123Subdomain(e.Host); len(msgs) > 0 {
			t.Errorf("DNS endpoint %q: %v", e.Host, msgs)
		}
		if _, err := netip.ParseAddr(e.Host); err == nil {
			t.Errorf("DNS endpoint %q is an IP address", e.Host)
		}
	default:
		a := e.Addr.Addr()
		if e.Addr.Port() == 0 || a.Is4In6() || a.Zone() != "" {
			t.Errorf("endpoint %v is not usable", e.Addr)
		}
	}
}

// FuzzParseEndpoint checks that an accepted endpoint is well formed and that
// its String form parses back to it.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"198.51.100.1:51820", "[2001:db8::1]:4000", "2001:db8::1", "vpn.Example.org.",
		"[vpn.example.org]", "::ffff:10.0.0.1", "[fe80::1%eth0]:1", "host:0", "host:65536", ":51820", "[]:1", "a:b:c"} {
		f.Add(s, mesh.DefaultPort)
	}
	f.Add("example.org", 0)
	f.Add("10.0.0.1", 65535)
	f.Fuzz(func(t *testing.T, s string, port int) {
		e1, err := ParseEndpoint(s, port)
		if err != nil {
			if !e1.IsZero() {
				t.Errorf("error %v with endpoint %v", err, e1)
			}
			return
		}
		if e1.IsZero() {
			t.Fatalf("%q parsed to an empty endpoint", s)
		}
		checkEndpoint(t, e1)
		s2 := e1.String()
		e2, err := ParseEndpoint(s2, port)
		if err != nil {
			t.Fatalf("%q parsed to %#v whose String %q does not parse: %v", s, e1, s2, err)
		}
		if e2 != e1 {
			t.Fatalf("%q parsed to %#v; its String %q to %#v", s, e1, s2, e2)
		}
	})
}

// FuzzParseDiscovered checks the discovered-endpoints annotation parser:
// deterministic, normalized output, and what meshd publishes for it parses
// back to the same map.
func FuzzParseDiscovered(f *testing.F) {
	f.Add(`{"` + fuzzKeyText(1) + `":"198.51.100.1:51820"}`)
	f.Add(`{"` + fuzzKeyText(1) + `":"[2001:db8::1]:51820","` + fuzzKeyText(2) + `":"[::ffff:10.0.0.1]:1"}`)
	f.Add(`{}`)
	f.Add(`{"x":"1.2.3.4:5"}`)
	f.Add(`{"` + fuzzKeyText(1) + `":"198.51.100.1:0"}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseDiscovered(s)
		if err != nil {
			if m != nil {
				t.Errorf("error %v with result %v", err, m)
			}
			return
		}
		for range 3 {
			if again, _ := parseDiscovered(s); !reflect.DeepEqual(again, m) {
				t.Fatalf("parsing %q twice differs: %v and %v", s, m, again)
			}
		}
		for k, ap := range m {
			if !ap.IsValid() || ap.Port() == 0 || ap.Addr().Is4In6() || ap.Addr().Zone() != "" {
				t.Errorf("endpoint %v of %s is not usable", ap, k)
			}
		}
		if len(m) == 0 {
			return
		}
		text := NodeAnnotations(Published{DiscoveredEndpoints: m})[AnnotationDiscoveredEndpoints]
		m2, err := parseDiscovered(text)
		if err != nil {
			t.Fatalf("published %q does not parse: %v", text, err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("parse, publish, parse: %v became %v", m, m2)
		}
	})
}

// FuzzPeerFromObject converts a Peer with fuzzed fields. An accepted Peer is
// normalized, its errors never contain the preshared key, and the Peer
// object that describes the result converts to the same mesh.Peer.
func FuzzPeerFromObject(f *testing.F) {
	psk := fuzzKey(9)
	f.Add("laptop", fuzzKeyText(1), "10.5.0.1/32", "", int32(0), int32(-1), "", "", "", []byte(nil), false)
	f.Add("site", fuzzKeyText(2), "10.6.0.0/16,fd06::/64,::ffff:10.7.0.0/112", "vpn.example.org", int32(51820), int32(25), "ns", "psk", "key", []byte(psk.String()+"\n"), false)
	f.Add("raw", fuzzKeyText(3), "0.0.0.0/0", "2001:db8::1", int32(1), int32(65535), "ns", "psk", "key", psk[:], false)
	f.Add("bad", "not-a-key", "10.0.0.1", "[::1]", int32(70000), int32(70000), "ns", "", "key", []byte("short"), true)
	f.Fuzz(func(t *testing.T, name, publicKey, allowed, host string, port, keepalive int32, ns, secret, key string, pskData []byte, lookupFails bool) {
		p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.PeerSpec{PublicKey: publicKey}}
		if allowed != "" {
			p.Spec.AllowedIPs = strings.Split(allowed, ",")
		}
		if host != "" || port != 0 {
			p.Spec.Endpoint = &v1alpha1.PeerEndpoint{Host: host, Port: port}
		}
		if keepalive >= 0 {
			p.Spec.PersistentKeepalive = &keepalive
		}
		if ns != "" || secret != "" || key != "" {
			p.Spec.PresharedKeySecretRef = &v1alpha1.SecretKeyRef{Namespace: ns, Name: secret, Key: key}
		}
		lookups := 0
		lookup := func(gotNS, gotName, gotKey string) ([]byte, error) {
			lookups++
			if gotNS != ns || gotName != secret || gotKey != key {
				t.Errorf("looked up %s/%s[%s], want %s/%s[%s]", gotNS, gotName, gotKey, ns, secret, key)
			}
			if lookupFails {
				return nil, errors.New("secret not found")
			}
			return pskData, nil
		}
		mp, err := PeerFromObject(p, lookup)
		if lookups > 1 {
			t.Errorf("%d Secret lookups", lookups)
		}
		if err != nil {
			if !reflect.DeepEqual(mp, mesh.Peer{}) {
				t.Errorf("error %v with peer %+v", err, mp)
			}
			// Key material never shows in errors.
			if k, kerr := secrets.ParsePresharedKey(pskData); kerr == nil && !lookupFails {
				other := name + publicKey + allowed + host + ns + secret + key
				for _, secretText := range []string{k.String(), string(bytes.TrimSpace(pskData))} {
					if len(secretText) >= 16 && strings.Contains(err.Error(), secretText) && !strings.Contains(other, secretText) {
						t.Errorf("error reveals the preshared key: %v", err)
					}
				}
			}
			return
		}
		// Accepted: normalized, and as described.
		if mp.Name != name || mp.PublicKey != mustParseKey(t, publicKey) {
			t.Errorf("name/key %q %v from %q %q", mp.Name, mp.PublicKey, name, publicKey)
		}
		if len(mp.AllowedIPs) != len(p.Spec.AllowedIPs) || len(mp.AllowedIPs) == 0 {
			t.Errorf("allowed IPs %v from %q", mp.AllowedIPs, p.Spec.AllowedIPs)
		}
		for _, a := range mp.AllowedIPs {
			if !a.IsValid() || a != a.Masked() || a.Addr().Is4In6() || a.Addr().Zone() != "" {
				t.Errorf("allowed IP %v is not normalized", a)
			}
		}
		checkEndpoint(t, mp.Endpoint)
		if p.Spec.Endpoint != nil && mp.Endpoint.Addr.Port() != uint16(port) {
			t.Errorf("endpoint %v, want port %d", mp.Endpoint, port)
		}
		if (p.Spec.PresharedKeySecretRef != nil) != (mp.PresharedKey != nil) {
			t.Errorf("preshared key %v for ref %v", mp.PresharedKey, p.Spec.PresharedKeySecretRef)
		}

		// The object describing mp converts to mp again.
		q := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: mp.Name}, Spec: v1alpha1.PeerSpec{PublicKey: mp.PublicKey.String()}}
		for _, a := range mp.AllowedIPs {
			q.Spec.AllowedIPs = append(q.Spec.AllowedIPs, a.String())
		}
		switch {
		case mp.Endpoint.Host != "":
			q.Spec.Endpoint = &v1alpha1.PeerEndpoint{Host: mp.Endpoint.Host, Port: int32(mp.Endpoint.Addr.Port())}
		case mp.Endpoint.Addr.IsValid():
			q.Spec.Endpoint = &v1alpha1.PeerEndpoint{Host: mp.Endpoint.Addr.Addr().String(), Port: int32(mp.Endpoint.Addr.Port())}
		}
		if mp.PersistentKeepalive > 0 {
			ka := int32(mp.PersistentKeepalive.Seconds())
			q.Spec.PersistentKeepalive = &ka
		}
		var qLookup func(string, string, string) ([]byte, error)
		if mp.PresharedKey != nil {
			q.Spec.PresharedKeySecretRef = &v1alpha1.SecretKeyRef{Namespace: "ns", Name: "psk", Key: "key"}
			qLookup = func(string, string, string) ([]byte, error) { return []byte(mp.PresharedKey.String()), nil }
		}
		mq, err := PeerFromObject(q, qLookup)
		if err != nil {
			t.Fatalf("the Peer describing %+v does not convert: %v", mp, err)
		}
		if !reflect.DeepEqual(mp, mq) {
			t.Fatalf("convert, describe, convert: %+v became %+v", mp, mq)
		}
	})
}

func mustParseKey(t *testing.T, s string) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.ParseKey(s)
	if err != nil {
		t.Fatalf("accepted key %q does not parse: %v", s, err)
	}
	return k
}

// FuzzAPIServerEndpoints checks the reading of the kubernetes Service's
// EndpointSlice (addresses separated by commas, in one IPv4 and one IPv6
// slice): sorted, unique, zone-free addresses, each one an input address
// that parses, and every such input address present.
func FuzzAPIServerEndpoints(f *testing.F) {
	for _, s := range []string{"203.0.113.2", "192.0.2.10,192.0.2.11,192.0.2.10", "2001:db8::2,::ffff:10.0.0.1", "fe80::1%eth0,", "nonsense,,1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addrs := strings.Split(s, ",")
		got := APIServerEndpoints([]*discoveryv1.EndpointSlice{
			{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: addrs}}},
			{AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{{Addresses: addrs[len(addrs)/2:]}}},
		})
		want := map[netip.Addr]bool{}
		for _, a := range addrs {
			if ip, err := netip.ParseAddr(a); err == nil && ip.Zone() == "" {
				want[ip.Unmap()] = true
			}
		}
		for i, a := range got {
			if !want[a] {
				t.Fatalf("%q: %v is not an input address", s, a)
			}
			if a.Zone() != "" || a.Is4In6() {
				t.Fatalf("%q: %v kept a zone or a mapping", s, a)
			}
			if i > 0 && got[i-1].Compare(a) >= 0 {
				t.Fatalf("%q: %v not sorted and unique", s, got)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%q: got %v, want the %d input addresses", s, got, len(want))
		}
	})
}
