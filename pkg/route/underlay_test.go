package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// The kernel drops IPv4 routes without a route notification when the link
// they go through goes down or loses its last IPv4 address. Run learns of
// it from link and address notifications, and must know which links its
// routes go through, including the link the kernel chose for a route asked
// for by gateway alone (a non-leader's routes to other locations).

// gatewayRoutes are a route by gateway alone (the kernel picks eth0 in
// fakeEnv, veth0 in a testNS) and its fail-closed twin.
var gatewayRoutes = []Route{
	{Dst: pfx("10.8.0.0/16"), Gateway: addr("198.51.100.2")},
	{Dst: pfx("10.8.0.0/16"), Type: TypeUnreachable, Metric: 65535},
}

// waitRepairAttempt waits until Run synced after the call (a repair on
// the notification just sent), so that what follows happens after it.
func waitRepairAttempt(t *testing.T, m *Manager, what string) func() {
	t.Helper()
	syncs := m.syncs.Load()
	return func() {
		t.Helper()
		waitFor(t, time.Second, "a repair attempt after "+what, func() bool { return m.syncs.Load() > syncs })
	}
}

// TestRunRepairsGatewayRouteAfterUnderlayDownUp: the first Set happens
// while Run already watches (as in the daemon), so the route's link is
// known only if it is read back; the underlay then goes down long enough
// for the repair to fail (gateway unreachable) and comes back up. The
// route is back at once, not at the periodic resync, and a Set of the same
// plan keeps it.
func TestRunRepairsGatewayRouteAfterUnderlayDownUp(t *testing.T) {
	f, m, _, eth := fakeEnv(t)
	startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return f.Subscribes() == 1 && m.watching.Load() })
	mustSet(t, m, gatewayRoutes, []Rule{{}})
	gw := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.8.0.0/16"), Gateway: addr("198.51.100.2"), LinkIndex: eth, Protocol: 109}
	if !f.Routes()[gw] {
		t.Fatalf("after Set: routes %v, want %s among them", f.Routes(), gw)
	}
	if v := m.view.Load(); !v.links[eth] {
		t.Errorf("the link the kernel chose (eth0, %d) is not among the watched links %v", eth, v.links)
	}
	want := ours(f)

	attempted := waitRepairAttempt(t, m, "eth0 went down")
	f.SetLinkUp("eth0", false)
	if ours(f)[gw] {
		t.Fatal("the fake kept a route through a link that went down")
	}
	attempted()
	if ours(f)[gw] {
		t.Fatal("the route came back through a link that is down")
	}
	f.SetLinkUp("eth0", true)
	took := waitFor(t, 2*time.Second, "gateway route back after eth0 came up", func() bool { return equalSets(ours(f), want) })
	t.Logf("route back %v after eth0 came up", took)
	mustSet(t, m, gatewayRoutes, []Rule{{}})
	if got := ours(f); !equalSets(got, want) {
		t.Fatalf("after a Set of the same plan: routes %v, want %v", got, want)
	}
}

// TestRunRepairsRoutesAfterAddressRemoved: the underlay's only IPv4
// address is removed and added back (a DHCP client re-applying its lease).
// The kernel drops, silently, the IPv4 routes through the link; the repair
// on the removal cannot put them back (their gateway is unreachable), and
// they are back as soon as the address is.
func TestRunRepairsRoutesAfterAddressRemoved(t *testing.T) {
	for _, c := range []struct {
		name     string
		runFirst bool
	}{
		{"Set while Run watches", true},
		{"Run started after the Set", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, m, _, eth := fakeEnv(t)
			routes := []Route{
				{Dst: pfx("10.8.0.0/16"), Gateway: addr("198.51.100.2")}, // the kernel picks eth0
				{Dst: pfx("10.7.0.0/16"), Gateway: addr("198.51.100.2"), Device: "eth0"},
			}
			if c.runFirst {
				startRun(t, m)
				waitFor(t, time.Second, "subscribed", func() bool { return m.watching.Load() })
				mustSet(t, m, routes, []Rule{{}})
			} else {
				mustSet(t, m, routes, []Rule{{}})
				startRun(t, m)
				waitFor(t, time.Second, "subscribed", func() bool { return m.watching.Load() })
			}
			want := ours(f)
			chosen := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.8.0.0/16"), Gateway: addr("198.51.100.2"), LinkIndex: eth, Protocol: 109}
			if len(want) != len(routes) || !want[chosen] {
				t.Fatalf("after Set: routes %v, want %d with %s", want, len(routes), chosen)
			}
			attempted := waitRepairAttempt(t, m, "the address was removed")
			f.DelAddr("eth0", pfx("198.51.100.1/24"))
			if len(ours(f)) != 0 {
				t.Fatalf("the fake kept routes %v through a link without IPv4 address", ours(f))
			}
			attempted()
			if ours(f)[chosen] {
				t.Fatal("the route by gateway came back while its gateway was unreachable")
			}
			f.AddAddr("eth0", pfx("198.51.100.1/24"))
			took := waitFor(t, 2*time.Second, "routes back after the address", func() bool { return equalSets(ours(f), want) })
			t.Logf("routes back %v after the address", took)
			mustSet(t, m, routes, []Rule{{}})
			if got := ours(f); !equalSets(got, want) {
				t.Fatalf("after a Set of the same plan: routes %v, want %v", got, want)
			}
		})
	}
}

// TestRunRetriesMissingRouteOnAnyLink: a route whose gateway is on no
// connected network cannot be added; any link or address notification
// may change that, so Run retries on them, but at most once per retry gap
// however many arrive. Once nothing is missing, unrelated links and
// addresses cost nothing.
func TestRunRetriesMissingRouteOnAnyLink(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return m.watching.Load() })
	routes := []Route{{Dst: pfx("10.9.0.0/16"), Gateway: addr("192.0.2.1")}}
	if err := m.Set(routes, nil); err == nil {
		t.Fatal("Set of a route through an unreachable gateway succeeded")
	}

	// A storm of unrelated links (pods starting): the gateway stays
	// unreachable, and Run lists at most once per gap.
	syncs := m.syncs.Load()
	start := time.Now()
	for i := range 200 {
		f.AddLink(fmt.Sprintf("veth%d", i))
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	time.Sleep(3 * repairDelay)
	if got, limit := m.syncs.Load()-syncs, uint64(elapsed/minRetryGap)+2; got == 0 || got > limit {
		t.Fatalf("%d syncs for 200 unrelated links in %v, want 1 to %d (a retry, rate-limited)", got, elapsed, limit)
	}

	// A link whose network holds the gateway: the route is added.
	idx := f.AddLink("eth1", pfx("192.0.2.10/24"))
	r := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.9.0.0/16"), Gateway: addr("192.0.2.1"), LinkIndex: idx, Protocol: 109}
	took := waitFor(t, maxRetryGap+time.Second, "route added once its gateway is reachable", func() bool { return f.Routes()[r] })
	t.Logf("route added %v after its gateway became reachable", took)

	// Nothing missing: unrelated links and addresses cause no sync.
	waitFor(t, time.Second, "the view says nothing is missing", func() bool { return !m.view.Load().missing })
	syncs = m.syncs.Load()
	f.AddLink("veth-late")
	f.AddAddr("veth-late", pfx("203.0.113.5/24"))
	time.Sleep(3 * repairDelay)
	if got := m.syncs.Load() - syncs; got != 0 {
		t.Fatalf("an unrelated link and address caused %d syncs with nothing missing", got)
	}
}

// TestNetlinkGatewayRouteUnderlayDownUp is TestRunRepairsGatewayRouteAfterUnderlayDownUp
// on a real kernel: Set while Run watches, veth0 (which the kernel chose
// for the gateway route) down long enough for a repair to fail, then up.
func TestNetlinkGatewayRouteUnderlayDownUp(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)
	startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return m.watching.Load() })
	mustSet(t, m, gatewayRoutes, rootRules)
	want := tn.ourRoutes(t)
	gw := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.8.0.0/16"), Gateway: addr("198.51.100.2"), LinkIndex: tn.veth0, Protocol: 109}
	if len(want) != 2 || !want[gw] {
		t.Fatalf("after Set: routes %v, want %s and its unreachable twin", want, gw)
	}
	if v := m.view.Load(); !v.links[tn.veth0] {
		t.Errorf("the link the kernel chose (veth0, %d) is not among the watched links %v", tn.veth0, v.links)
	}
	l, err := tn.h.LinkByIndex(tn.veth0)
	if err != nil {
		t.Fatal(err)
	}
	attempted := waitRepairAttempt(t, m, "veth0 went down")
	if err := tn.h.LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "the kernel dropped the gateway route", func() bool { return !tn.ourRoutes(t)[gw] })
	attempted()
	if err := tn.h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 2*time.Second, "gateway route back after veth0 came up", func() bool { return equalSets(tn.ourRoutes(t), want) })
	t.Logf("route back %v after veth0 came up", took)
	mustSet(t, m, gatewayRoutes, rootRules)
	if got := tn.ourRoutes(t); !equalSets(got, want) {
		t.Fatalf("after a Set of the same plan: routes %v, want %v", got, want)
	}
}

// TestNetlinkRoutesUnderlayReaddress is TestRunRepairsRoutesAfterAddressRemoved
// on a real kernel: veth0 loses its only IPv4 address long enough for a
// repair to fail, and gets it back.
func TestNetlinkRoutesUnderlayReaddress(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)
	routes := []Route{
		{Dst: pfx("10.8.0.0/16"), Gateway: addr("198.51.100.2")}, // the kernel picks veth0
		{Dst: pfx("10.7.0.0/16"), Gateway: addr("198.51.100.2"), Device: "veth0"},
		{Dst: pfx("10.7.0.0/16"), Type: TypeUnreachable, Metric: 65535},
	}
	startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return m.watching.Load() })
	mustSet(t, m, routes, rootRules)
	want := tn.ourRoutes(t)
	if len(want) != len(routes) {
		t.Fatalf("after Set: routes %v, want %d", want, len(routes))
	}
	l, err := tn.h.LinkByIndex(tn.veth0)
	if err != nil {
		t.Fatal(err)
	}
	ipn, err := netlink.ParseIPNet("198.51.100.1/24")
	if err != nil {
		t.Fatal(err)
	}
	a := &netlink.Addr{IPNet: ipn}
	attempted := waitRepairAttempt(t, m, "the address was removed")
	if err := tn.h.AddrDel(l, a); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "the kernel dropped the routes through veth0", func() bool { return len(tn.ourRoutes(t)) == 1 })
	attempted()
	if err := tn.h.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 2*time.Second, "routes back after the address", func() bool { return equalSets(tn.ourRoutes(t), want) })
	t.Logf("routes back %v after the address", took)
	mustSet(t, m, routes, rootRules)
	if got := tn.ourRoutes(t); !equalSets(got, want) {
		t.Fatalf("after a Set of the same plan: routes %v, want %v", got, want)
	}
}

// TestRunFailedRetryIsNoRepair: while a route cannot be added, the retries
// that unrelated links set off fail again; they wrote nothing the kernel
// took, so Run reports no repair (no changed call: no daemon reconcile, no
// repairs metric, no "repaired" log line).
func TestRunFailedRetryIsNoRepair(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	changed := startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return m.watching.Load() })
	if err := m.Set([]Route{{Dst: pfx("10.9.0.0/16"), Gateway: addr("192.0.2.1")}}, nil); err == nil {
		t.Fatal("Set of a route through an unreachable gateway succeeded")
	}
	c0, s0 := changed.Load(), m.syncs.Load()
	for i := range 20 {
		f.AddLink(fmt.Sprintf("veth%d", i))
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, 2*time.Second, "a retry", func() bool { return m.syncs.Load() > s0 })
	if got := changed.Load() - c0; got != 0 {
		t.Errorf("%d repairs reported while the route was still missing and no write succeeded", got)
	}
}

// TestRunAddressChurnOnMissingRouteLinkRateLimited: the underlay lost its
// IPv4 address (the route through it is gone, its gateway unreachable)
// while IPv6 addresses keep coming and going on it (SLAAC): those are
// retries, rate-limited, not a repair each.
func TestRunAddressChurnOnMissingRouteLinkRateLimited(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	changed := startRun(t, m)
	waitFor(t, time.Second, "subscribed", func() bool { return m.watching.Load() })
	mustSet(t, m, []Route{{Dst: pfx("10.9.0.0/16"), Gateway: addr("198.51.100.2")}}, nil)
	f.DelAddr("eth0", pfx("198.51.100.1/24"))
	waitFor(t, 2*time.Second, "the route missing", func() bool { v := m.view.Load(); return v != nil && v.missing })
	s0, c0 := m.syncs.Load(), changed.Load()
	start := time.Now()
	for i := range 20 {
		f.AddAddr("eth0", pfx(fmt.Sprintf("2001:db8::%x/64", 100+i)))
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)
	time.Sleep(3 * repairDelay)
	if got, limit := m.syncs.Load()-s0, uint64(elapsed/minRetryGap)+2; got > limit {
		t.Errorf("%d syncs for 20 IPv6 addresses on the link in %v, want at most %d (rate-limited retries)", got, elapsed, limit)
	}
	if got := changed.Load() - c0; got != 0 {
		t.Errorf("%d repairs reported while the route stayed missing", got)
	}
}
