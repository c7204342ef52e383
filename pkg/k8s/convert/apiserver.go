package convert

import (
	"net/netip"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// The EndpointSlice of the kubernetes Service, which the API server keeps
// itself: its endpoints are the API servers' own addresses, where
// kube-proxy sends a Pod's connections to the Service's ClusterIP
// (KUBERNETES_SERVICE_HOST, what an in-cluster meshd dials).
const (
	APIServerEndpointSliceNamespace = "default"
	APIServerEndpointSliceName      = "kubernetes"
)

// APIServerEndpoints are the addresses of the slices' endpoints, ready or
// not (an API server starting up is one all the same), with dialled (the
// address meshd connects to, APIServerAddrs), sorted and without
// duplicates. A nil slice, a slice of another address type (FQDN) and an
// address that is not an IP are skipped: the slice is written by the API
// server, but the caller gets only addresses it can compare.
func APIServerEndpoints(eps []*discoveryv1.EndpointSlice, dialled ...netip.Addr) []netip.Addr {
	out := slices.Clone(dialled)
	for _, s := range eps {
		if s == nil || (s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6) {
			continue
		}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && ip.Zone() == "" {
					out = append(out, ip.Unmap())
				}
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
