package main

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
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

// discoverLocal finds the default-route interface and its addresses.
func discoverLocal(log *slog.Logger) (localFacts, error) {
	var f localFacts
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return f, fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range rs {
			if r.Dst != nil && r.Dst.IP != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			link, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue
			}
			if f.iface == "" {
				f.iface, f.mtu = link.Attrs().Name, link.Attrs().MTU
			}
			addrs, err := netlink.AddrList(link, fam)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				ip, ok := netip.AddrFromSlice(a.IP)
				if !ok || !ip.IsGlobalUnicast() {
					continue
				}
				f.addrs = append(f.addrs, ip.Unmap())
				break
			}
			break
		}
	}
	if f.iface == "" {
		return f, fmt.Errorf("no default route")
	}
	log.Debug("discovered local facts", "interface", f.iface, "addresses", f.addrs, "mtu", f.mtu)
	return f, nil
}
