package main

import (
	"net"
	"net/netip"
	"strconv"

	"meshd.io/meshd/pkg/k8s/convert"
)

// publishedSettings are the effective settings this node publishes in
// meshd.io/settings (convert.Settings), for meshctl: the flags as parsed and
// validated, nothing secret. The value only changes with the flags or the
// version, so publishing it costs a Node write per restart with other flags,
// none at idle.
func (c *config) publishedSettings(meshCIDRs, serviceCIDRs []netip.Prefix) convert.Settings {
	s := convert.Settings{
		Version:             version,
		Granularity:         c.Granularity,
		Port:                c.Port,
		TopologyLabel:       c.TopologyLabel,
		LeaseNamespace:      c.LeaseNamespace,
		LeaseDuration:       c.LeaseDuration.String(),
		PeerSecretNamespace: c.PeerSecretNamespace,
		ProbePort:           c.ProbePort,
		TakeoverDelay:       c.TakeoverDelay.String(),
		LeaderCandidates:    c.LeaderCandidates,
		ClusterLinks:        c.ClusterLinks,
		Interface:           c.Interface,
	}
	for _, p := range meshCIDRs {
		s.MeshCIDRs = append(s.MeshCIDRs, p.String())
	}
	for _, p := range serviceCIDRs {
		s.ServiceCIDRs = append(s.ServiceCIDRs, p.String())
	}
	if host, port, err := net.SplitHostPort(c.Listen); err == nil {
		s.ListenPort, _ = strconv.Atoi(port)
		if a, err := netip.ParseAddr(host); err == nil {
			s.ListenLoopback = a.IsLoopback()
		} else {
			s.ListenLoopback = host == "localhost"
		}
	}
	return s
}
