package route

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Uplink is the node's default-route interface as the kernel sees it.
type Uplink struct {
	Interface string       // its name
	Addrs     []netip.Addr // its global unicast addresses, at most one per family, IPv4 first
	MTU       int          // its MTU
}

// DiscoverUplink finds the interface of the main table's default route
// (IPv4 first, else IPv6) and its global addresses, in the network namespace
// of the calling thread. It reads the kernel once; it is for start-up, not
// for the reconcile.
func DiscoverUplink() (Uplink, error) {
	var u Uplink
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return u, fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range rs {
			if !isDefault(r) {
				continue
			}
			link, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue
			}
			if u.Interface == "" {
				u.Interface, u.MTU = link.Attrs().Name, link.Attrs().MTU
			}
			a, err := globalAddr(link, fam)
			if err != nil {
				continue
			}
			if a.IsValid() {
				u.Addrs = append(u.Addrs, a)
			}
			break
		}
	}
	if u.Interface == "" {
		return u, errors.New("no default route")
	}
	return u, nil
}

// isDefault reports whether r is a default route (no destination or a /0).
func isDefault(r netlink.Route) bool {
	if r.Dst == nil || r.Dst.IP == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// globalAddr is link's first global unicast address of family fam (not
// valid if it has none).
func globalAddr(link netlink.Link, fam int) (netip.Addr, error) {
	addrs, err := netlink.AddrList(link, fam)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsGlobalUnicast() {
			return ip.Unmap(), nil
		}
	}
	return netip.Addr{}, nil
}

// LinkExists reports whether a network interface named name exists in the
// network namespace of the calling thread.
func LinkExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}
