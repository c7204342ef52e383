package convert

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
)

func slice(t discoveryv1.AddressType, addrs ...[]string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{AddressType: t}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: a})
	}
	return s
}

// TestAPIServerEndpoints: every IP of every endpoint (sorted, once each),
// IPv4 and IPv6 slices alike; FQDN slices, names and zoned or malformed
// addresses skipped.
func TestAPIServerEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []*discoveryv1.EndpointSlice
		want []string
	}{
		{"none", nil, nil},
		{"nil slice", []*discoveryv1.EndpointSlice{nil}, nil},
		{"one", []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, []string{"203.0.113.2"})}, []string{"203.0.113.2"}},
		{"HA, unsorted, repeated", []*discoveryv1.EndpointSlice{
			slice(discoveryv1.AddressTypeIPv4, []string{"192.0.2.12"}, []string{"192.0.2.10", "192.0.2.11"}),
			slice(discoveryv1.AddressTypeIPv4, []string{"192.0.2.10"}),
		}, []string{"192.0.2.10", "192.0.2.11", "192.0.2.12"}},
		{"dual stack", []*discoveryv1.EndpointSlice{
			slice(discoveryv1.AddressTypeIPv6, []string{"2001:db8::2"}),
			slice(discoveryv1.AddressTypeIPv4, []string{"203.0.113.2"}),
		}, []string{"203.0.113.2", "2001:db8::2"}},
		{"IPv4-mapped IPv6 unmapped", []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv6, []string{"::ffff:203.0.113.2"})}, []string{"203.0.113.2"}},
		{"FQDN slice skipped", []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeFQDN, []string{"api.example.com"})}, nil},
		{"garbage skipped", []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, []string{"", "nonsense", "203.0.113.300", "fe80::1%eth0", "198.51.100.7"})}, []string{"198.51.100.7"}},
		{"with the address dialled", []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, []string{"203.0.113.2"})}, []string{"10.96.0.1", "203.0.113.2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dialled []netip.Addr
			if strings.HasPrefix(tc.name, "with the address dialled") {
				dialled = []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("203.0.113.2")}
			}
			got := APIServerEndpoints(tc.in, dialled...)
			var want []netip.Addr
			for _, a := range tc.want {
				want = append(want, netip.MustParseAddr(a))
			}
			if !slices.Equal(got, want) {
				t.Fatalf("got %v, want %v", got, want)
			}
		})
	}
}
