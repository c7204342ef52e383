package main

import (
	"log/slog"
	"net/netip"

	"meshd.io/meshd/pkg/route"
)

// wireGuardOverhead is the worst-case WireGuard encapsulation (IPv6 outer).
const wireGuardOverhead = 80

// localFacts are what this node finds out about itself from the kernel.
type localFacts struct {
	iface string       // default-route interface
	addrs []netip.Addr // its global addresses, at most one per family
	mtu   int          // its MTU
}

// wireGuardMTU is the underlay MTU minus the WireGuard overhead.
func (f localFacts) wireGuardMTU() int {
	if f.mtu == 0 {
		return 1420
	}
	return f.mtu - wireGuardOverhead
}

// discoverLocal finds the default-route interface and its addresses (once,
// at start-up; see route.DiscoverUplink).
func discoverLocal(log *slog.Logger) (localFacts, error) {
	u, err := route.DiscoverUplink()
	if err != nil {
		return localFacts{}, err
	}
	f := localFacts{iface: u.Interface, addrs: u.Addrs, mtu: u.MTU}
	log.Debug("discovered local facts", "interface", f.iface, "addresses", f.addrs, "mtu", f.mtu)
	return f, nil
}
