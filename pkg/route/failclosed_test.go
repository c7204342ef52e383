package route

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
)

// failClosedRoutes are a tunnelled destination per family plus, at a
// higher metric, an unreachable route for the same destination.
var failClosedRoutes = []Route{
	{Dst: pfx("10.5.0.0/16"), Device: "mesh0"},
	{Dst: pfx("10.5.0.0/16"), Type: TypeUnreachable, Metric: 65535},
	{Dst: pfx("2001:db8:5::/48"), Device: "mesh0"},
	{Dst: pfx("2001:db8:5::/48"), Type: TypeUnreachable, Metric: 65535},
	{Dst: pfx("10.9.0.0/16"), Type: TypeBlackhole, Metric: 65535},
}

func TestFakeRouteTypes(t *testing.T) {
	k := NewFakeKernel()
	k.AddLink("mesh0")
	m := NewWithKernel(Options{}, k)
	if err := m.Set(failClosedRoutes, nil); err != nil {
		t.Fatal(err)
	}
	if got := len(k.Routes()); got != len(failClosedRoutes) {
		t.Fatalf("%d routes in the kernel, want %d", got, len(failClosedRoutes))
	}
	w := m.Writes()
	if err := m.Set(failClosedRoutes, nil); err != nil || m.Writes() != w {
		t.Fatalf("unchanged Set: err %v, %d writes", err, m.Writes()-w)
	}
	for _, bad := range []Route{
		{Dst: pfx("10.6.0.0/16"), Type: TypeUnreachable, Device: "mesh0"},
		{Dst: pfx("10.6.0.0/16"), Type: TypeBlackhole, Gateway: addr("198.51.100.2")},
		{Dst: pfx("10.6.0.0/16"), Type: Type(99)},
	} {
		if err := m.Set(append(failClosedRoutes, bad), nil); err == nil {
			t.Errorf("Set accepted %+v", bad)
		}
	}
	if err := m.Set(nil, nil); err != nil || len(k.Routes()) != 0 {
		t.Fatalf("empty Set: err %v, left %v", err, k.Routes())
	}
}

// routeGet asks the kernel where a packet to ip goes: the output device's
// index, or the lookup's error (EHOSTUNREACH for an unreachable route).
func (tn *testNS) routeGet(t *testing.T, ip string) (int, error) {
	t.Helper()
	rs, err := tn.h.RouteGet(net.ParseIP(ip))
	if err != nil {
		return 0, err
	}
	if len(rs) == 0 {
		return 0, errors.New("no route")
	}
	return rs[0].LinkIndex, nil
}

// TestNetlinkFailClosed: with a tunnelled route deleted by hand, the
// lookup hits meshd's unreachable route instead of falling through to the
// main table's default route (clear text on the underlay); Set adopts the
// reject routes without writes, repairs only what is missing and removes
// them when no longer desired.
func TestNetlinkFailClosed(t *testing.T) {
	tn := newTestNS(t)
	// The underlay's default route, where a fall-through would go.
	for _, gw := range []string{"198.51.100.2", "2001:db8::2"} {
		if err := tn.h.RouteAdd(&netlink.Route{LinkIndex: tn.veth0, Gw: net.ParseIP(gw)}); err != nil {
			t.Fatal(err)
		}
	}
	m := tn.newManager(t)
	if err := m.Set(failClosedRoutes, rootRules); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"10.5.1.1", "2001:db8:5::1"} {
		if dev, err := tn.routeGet(t, ip); err != nil || dev != tn.mesh0 {
			t.Fatalf("%s: dev %d, err %v; want mesh0 (%d)", ip, dev, err, tn.mesh0)
		}
	}
	if _, err := tn.routeGet(t, "10.9.1.1"); err == nil {
		t.Errorf("10.9.1.1 routed despite the blackhole route")
	}

	// A fresh Manager adopts everything: no write.
	m2 := tn.newManager(t)
	if err := m2.Set(failClosedRoutes, rootRules); err != nil || m2.Writes() != 0 {
		t.Fatalf("adopting: err %v, %d writes", err, m2.Writes())
	}

	// Delete the tunnelled routes by hand: dropped, not sent to veth0.
	for _, dst := range []string{"10.5.0.0/16", "2001:db8:5::/48"} {
		if err := tn.h.RouteDel(&netlink.Route{Table: DefaultTable, Dst: ipNet(pfx(dst)), LinkIndex: tn.mesh0, Protocol: DefaultProtocol, Scope: netlink.SCOPE_NOWHERE}); err != nil {
			t.Fatalf("deleting %s: %v", dst, err)
		}
	}
	for _, ip := range []string{"10.5.1.1", "2001:db8:5::1"} {
		dev, err := tn.routeGet(t, ip)
		if err == nil {
			t.Fatalf("%s with its route deleted goes out ifindex %d (veth0 is %d): fails open", ip, dev, tn.veth0)
		}
		if !errors.Is(err, syscall.EHOSTUNREACH) && !strings.Contains(err.Error(), "unreachable") {
			t.Errorf("%s: %v, want host unreachable", ip, err)
		}
	}
	w := m2.Writes()
	if err := m2.Set(failClosedRoutes, rootRules); err != nil {
		t.Fatal(err)
	}
	if got := m2.Writes() - w; got != 2 {
		t.Errorf("repair made %d writes, want 2 (only the deleted routes)", got)
	}
	if dev, err := tn.routeGet(t, "10.5.1.1"); err != nil || dev != tn.mesh0 {
		t.Fatalf("after repair: dev %d, err %v", dev, err)
	}

	// The reject route deleted by hand is put back too.
	if err := tn.h.RouteDel(&netlink.Route{Table: DefaultTable, Dst: ipNet(pfx("10.5.0.0/16")), Type: int(TypeUnreachable), Priority: 65535, Scope: netlink.SCOPE_NOWHERE}); err != nil {
		t.Fatalf("deleting the unreachable route: %v", err)
	}
	w = m2.Writes()
	if err := m2.Set(failClosedRoutes, rootRules); err != nil || m2.Writes()-w != 1 {
		t.Fatalf("reject route repair: err %v, %d writes", err, m2.Writes()-w)
	}
	if got := len(tn.ourRoutes(t)); got != len(failClosedRoutes) {
		t.Errorf("%d routes of ours, want %d: %v", got, len(failClosedRoutes), tn.ourRoutes(t))
	}
	if err := m2.Set(nil, nil); err != nil {
		t.Fatal(err)
	}
	if left := tn.ourRoutes(t); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}
