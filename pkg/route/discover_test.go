package route

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestDiscoverUplink finds the default-route interface of a fresh namespace:
// none at first, then veth0 with its global addresses once default routes
// point through it.
func TestDiscoverUplink(t *testing.T) {
	tn := newTestNS(t)
	if u, err := DiscoverUplink(); err == nil {
		t.Fatalf("DiscoverUplink without a default route = %+v, want an error", u)
	}
	veth0, err := tn.h.LinkByName("veth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := tn.h.LinkSetMTU(veth0, 1400); err != nil {
		t.Fatal(err)
	}
	for _, gw := range []string{"198.51.100.2", "2001:db8::2"} {
		r := &netlink.Route{LinkIndex: tn.veth0, Gw: netip.MustParseAddr(gw).AsSlice()}
		if err := tn.h.RouteAdd(r); err != nil {
			t.Fatalf("default route via %s: %v", gw, err)
		}
	}
	u, err := DiscoverUplink()
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8::1")}
	if u.Interface != "veth0" || u.MTU != 1400 || !slices.Equal(u.Addrs, want) {
		t.Fatalf("DiscoverUplink = %+v, want veth0, MTU 1400, %v", u, want)
	}
	if !LinkExists("veth0") || LinkExists("wg-missing") {
		t.Fatalf("LinkExists: veth0 %v, wg-missing %v; want true, false", LinkExists("veth0"), LinkExists("wg-missing"))
	}
}
