package route

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var testLogLevel = slog.LevelInfo

const nsPrefix = "meshd-route-test-"

var nsCounter atomic.Int64

// testNS is a fresh named network namespace with a dummy (or veth) "mesh0"
// (203.0.113.1/24, 2001:db8:1::1/64) and a veth pair "veth0"/"veth1"
// (198.51.100.1/24 + 2001:db8::1/64 on veth0; veth1 stays without address,
// so 198.51.100.2 and 2001:db8::2 are gateways, not local addresses).
type testNS struct {
	name         string
	ns           netns.NsHandle
	h            *netlink.Handle
	mesh0, veth0 int
}

// removeStaleNamespaces deletes test namespaces left by killed runs.
func removeStaleNamespaces() {
	names, _ := filepath.Glob("/var/run/netns/" + nsPrefix + "*")
	for _, p := range names {
		pid, err := strconv.Atoi(strings.Split(strings.TrimPrefix(filepath.Base(p), nsPrefix), "-")[0])
		if err != nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			_ = netns.DeleteNamed(filepath.Base(p))
		}
	}
}

// newTestNS moves the calling goroutine, locked to its thread, into a fresh
// namespace for the rest of the test; cleanup moves it back and deletes
// the namespace.
func newTestNS(tb testing.TB) *testNS {
	tb.Helper()
	if os.Geteuid() != 0 || testing.Short() {
		tb.Skip("needs root (network namespaces); skipped by -short (make unit)")
	}
	removeStaleNamespaces()
	runtime.LockOSThread() // never unlocked: if restoring fails, the thread dies with the goroutine
	orig, err := netns.Get()
	if err != nil {
		tb.Fatal(err)
	}
	name := fmt.Sprintf("%s%d-%d", nsPrefix, os.Getpid(), nsCounter.Add(1))
	ns, err := netns.NewNamed(name)
	if err != nil {
		orig.Close()
		tb.Fatalf("create netns: %v", err)
	}
	t := &testNS{name: name, ns: ns}
	tb.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			tb.Errorf("restore netns: %v", err)
		}
		orig.Close()
		if t.h != nil {
			t.h.Close()
		}
		ns.Close()
		_ = netns.DeleteNamed(name)
	})
	if t.h, err = netlink.NewHandleAt(ns); err != nil {
		tb.Fatal(err)
	}
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	must(t.addMesh0())
	must(t.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0"}, PeerName: "veth1"}))
	addrs := map[string][]string{
		"mesh0": {"203.0.113.1/24", "2001:db8:1::1/64"},
		"veth0": {"198.51.100.1/24", "2001:db8::1/64"},
	}
	for _, name := range []string{"lo", "mesh0", "veth0", "veth1", "mesh0p"} {
		if name == "mesh0p" {
			if _, err := t.h.LinkByName(name); err != nil {
				continue // a real dummy
			}
		}
		l, err := t.h.LinkByName(name)
		must(err)
		for _, a := range addrs[name] {
			ipn, err := netlink.ParseIPNet(a)
			must(err)
			must(t.h.AddrAdd(l, &netlink.Addr{IPNet: ipn, Flags: unix.IFA_F_NODAD}))
		}
		must(t.h.LinkSetUp(l))
		switch name {
		case "mesh0":
			t.mesh0 = l.Attrs().Index
		case "veth0":
			t.veth0 = l.Attrs().Index
		}
	}
	return t
}

// addMesh0 creates "mesh0": a dummy, or where this kernel has no dummy
// driver (this testbed), one end of a veth pair "mesh0"/"mesh0p".
func (t *testNS) addMesh0() error {
	err := t.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "mesh0"}})
	if err == nil {
		return nil
	}
	return t.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "mesh0"}, PeerName: "mesh0p"})
}

// newManager makes a Manager on real netlink in t's namespace (the calling
// thread is in it).
func (t *testNS) newManager(tb testing.TB) *Manager {
	tb.Helper()
	m, err := New(Options{Logger: slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: testLogLevel}))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}

// kernelRoutes lists every route of table in t's namespace, any protocol.
func (t *testNS) kernelRoutes(tb testing.TB, table int) map[KernelRoute]bool {
	tb.Helper()
	rs, err := t.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[KernelRoute]bool{}
	for _, r := range rs {
		if kr, ok := fromNetlinkRoute(&r); ok {
			out[kr] = true
		}
	}
	return out
}

func (t *testNS) ourRoutes(tb testing.TB) map[KernelRoute]bool {
	out := map[KernelRoute]bool{}
	for r := range t.kernelRoutes(tb, DefaultTable) {
		if r.Protocol == DefaultProtocol {
			out[r] = true
		}
	}
	return out
}

func (t *testNS) rules(tb testing.TB) map[KernelRule]bool {
	tb.Helper()
	k := &netlinkKernel{h: t.h}
	rs, err := k.ListRules()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[KernelRule]bool{}
	for _, r := range rs {
		out[r] = true
	}
	return out
}

var rootRoutes = []Route{
	{Dst: pfx("10.5.0.0/16"), Device: "mesh0"},
	{Dst: pfx("10.6.0.0/16"), Device: "mesh0", Src: addr("203.0.113.1")},
	{Dst: pfx("10.7.0.0/16"), Gateway: addr("198.51.100.2"), Device: "veth0", Metric: 10},
	{Dst: pfx("10.8.0.0/16"), Gateway: addr("198.51.100.2")}, // kernel picks veth0
	{Dst: pfx("2001:db8:5::/48"), Device: "mesh0"},
	{Dst: pfx("2001:db8:6::/48"), Gateway: addr("2001:db8::2"), Device: "veth0", Src: addr("2001:db8::1")},
}

var rootRules = []Rule{{}, {IPv6: true}}

func TestNetlinkSetAdoptCleanup(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)

	// Foreign routes: one in main, one in our table with another protocol,
	// and a foreign rule.
	foreignMain := &netlink.Route{Dst: ipNet(pfx("10.50.0.0/16")), LinkIndex: tn.mesh0, Protocol: 109}
	foreignOurs := &netlink.Route{Dst: ipNet(pfx("10.51.0.0/16")), LinkIndex: tn.mesh0, Table: DefaultTable, Protocol: unix.RTPROT_STATIC}
	foreignRule := netlink.NewRule()
	foreignRule.Table, foreignRule.Priority = 100, 100
	for _, r := range []*netlink.Route{foreignMain, foreignOurs} {
		if err := tn.h.RouteAdd(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := tn.h.RuleAdd(foreignRule); err != nil {
		t.Fatal(err)
	}
	// The kernel adds fe80::/64 routes by itself, whenever IPv6 link-local
	// addresses come up: leave them out of the comparison.
	mainRoutes := func() map[KernelRoute]bool {
		out := tn.kernelRoutes(t, unix.RT_TABLE_MAIN)
		for r := range out {
			if r.Dst.Addr().IsLinkLocalUnicast() {
				delete(out, r)
			}
		}
		return out
	}
	mainBefore := mainRoutes()

	mustSet(t, m, rootRoutes, rootRules)
	if got := m.Writes(); got != 8 {
		t.Fatalf("writes = %d, want 8", got)
	}
	want := map[KernelRoute]bool{
		{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: tn.mesh0, Protocol: 109}:                                                                           true,
		{Family: FamilyV4, Table: 51820, Dst: pfx("10.6.0.0/16"), LinkIndex: tn.mesh0, Src: addr("203.0.113.1"), Protocol: 109}:                                                 true,
		{Family: FamilyV4, Table: 51820, Dst: pfx("10.7.0.0/16"), Gateway: addr("198.51.100.2"), LinkIndex: tn.veth0, Protocol: 109, Metric: 10}:                                true,
		{Family: FamilyV4, Table: 51820, Dst: pfx("10.8.0.0/16"), Gateway: addr("198.51.100.2"), LinkIndex: tn.veth0, Protocol: 109}:                                            true,
		{Family: FamilyV6, Table: 51820, Dst: pfx("2001:db8:5::/48"), LinkIndex: tn.mesh0, Protocol: 109, Metric: 1024}:                                                         true,
		{Family: FamilyV6, Table: 51820, Dst: pfx("2001:db8:6::/48"), Gateway: addr("2001:db8::2"), Src: addr("2001:db8::1"), LinkIndex: tn.veth0, Protocol: 109, Metric: 1024}: true,
	}
	if got := tn.ourRoutes(t); !equalSets(got, want) {
		t.Fatalf("kernel routes:\n%v\nwant\n%v", got, want)
	}
	for _, r := range []KernelRule{
		{Family: FamilyV4, Priority: 31000, Table: 51820, Protocol: 109},
		{Family: FamilyV6, Priority: 31000, Table: 51820, Protocol: 109},
	} {
		if !tn.rules(t)[r] {
			t.Fatalf("rule %s missing: %v", r, tn.rules(t))
		}
	}

	// Unchanged: zero writes.
	mustSet(t, m, rootRoutes, rootRules)
	if got := m.Writes(); got != 8 {
		t.Fatalf("unchanged Set wrote %d times", got-8)
	}

	// Change one route's gateway: one replace. Change a destination: add + delete.
	changed := append([]Route(nil), rootRoutes...)
	changed[2].Gateway = addr("198.51.100.3")
	mustSet(t, m, changed, rootRules)
	if got := m.Writes() - 8; got != 1 {
		t.Fatalf("gateway change: %d writes, want 1", got)
	}
	changed[0].Dst = pfx("10.9.0.0/16")
	mustSet(t, m, changed, rootRules)
	if got := m.Writes() - 9; got != 2 {
		t.Fatalf("destination change: %d writes, want 2", got)
	}

	// Simulated restart: a new Manager, same desired set: zero writes; a
	// stale route and rule of the old run are removed.
	stale := Route{Dst: pfx("10.10.0.0/16"), Device: "mesh0"}
	mustSet(t, m, append(changed, stale), append(rootRules, Rule{Priority: 30000}))
	m2 := tn.newManager(t)
	mustSet(t, m2, append(changed, stale), append(rootRules, Rule{Priority: 30000}))
	if got := m2.Writes(); got != 0 {
		t.Fatalf("adopting Manager wrote %d times, want 0", got)
	}
	mustSet(t, m2, changed, rootRules)
	if got := m2.Writes(); got != 2 {
		t.Fatalf("stale removal: %d writes, want 2", got)
	}
	if len(tn.ourRoutes(t)) != len(changed) {
		t.Fatalf("routes = %v", tn.ourRoutes(t))
	}

	// Cleanup leaves nothing of ours, and the foreign routes and rule.
	if err := m2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := tn.ourRoutes(t); len(got) != 0 {
		t.Fatalf("after Cleanup: %v", got)
	}
	for r := range tn.rules(t) {
		if r.Protocol == DefaultProtocol || r.Table == DefaultTable {
			t.Fatalf("after Cleanup rule left: %s", r)
		}
	}
	if !tn.rules(t)[KernelRule{Family: FamilyV4, Priority: 100, Table: 100}] {
		t.Fatal("foreign rule removed")
	}
	if got := tn.kernelRoutes(t, DefaultTable); len(got) != 1 {
		t.Fatalf("our table after Cleanup = %v, want just the foreign route", got)
	}
	if got := mainRoutes(); !equalSets(got, mainBefore) {
		t.Fatalf("main table changed:\n%v\nwas\n%v", got, mainBefore)
	}
}

func TestNetlinkMissingDevice(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)
	err := m.Set([]Route{{Dst: pfx("10.5.0.0/16"), Device: "mesh0"}, {Dst: pfx("10.6.0.0/16"), Device: "wg9"}}, nil)
	if err == nil || !strings.Contains(err.Error(), `resolve device "wg9"`) {
		t.Fatalf("Set = %v", err)
	}
	if len(tn.ourRoutes(t)) != 1 {
		t.Fatalf("routes = %v", tn.ourRoutes(t))
	}
	// Unreachable gateway: an error for that route alone.
	err = m.Set([]Route{{Dst: pfx("10.5.0.0/16"), Device: "mesh0"}, {Dst: pfx("10.7.0.0/16"), Gateway: addr("10.99.0.1")}}, nil)
	if err == nil || !strings.Contains(err.Error(), "add route 10.7.0.0/16") {
		t.Fatalf("Set = %v", err)
	}
	// Interface recreated: the route follows the new index.
	l, _ := tn.h.LinkByName("mesh0")
	if err := tn.h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	if err := tn.addMesh0(); err != nil {
		t.Fatal(err)
	}
	l, _ = tn.h.LinkByName("mesh0")
	_ = tn.h.LinkSetUp(l)
	if p, err := tn.h.LinkByName("mesh0p"); err == nil {
		_ = tn.h.LinkSetUp(p)
	}
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "mesh0"}}, nil)
	if !tn.ourRoutes(t)[KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: l.Attrs().Index, Protocol: 109}] {
		t.Fatalf("routes = %v", tn.ourRoutes(t))
	}
}

// ipDel runs `ip -n NS args...` (or does nothing and returns false when ip
// is missing).
func (t *testNS) ip(tb testing.TB, args ...string) bool {
	tb.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		return false
	}
	out, err := exec.Command("ip", append([]string{"-n", t.name}, args...)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("ip %v: %v: %s", args, err, out)
	}
	return true
}

func TestNetlinkRunRepairs(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)
	mustSet(t, m, rootRoutes, rootRules)
	changed := startRun(t, m)
	time.Sleep(100 * time.Millisecond) // subscribed
	want := tn.ourRoutes(t)

	cases := []struct {
		name string
		args []string
		del  func()
	}{
		{"v4 dev route", []string{"route", "del", "10.5.0.0/16", "table", "51820"}, nil},
		{"v6 gateway route", []string{"-6", "route", "del", "2001:db8:6::/48", "table", "51820"}, nil},
		{"v4 rule", []string{"rule", "del", "pref", "31000", "table", "51820"}, nil},
		{"v6 rule", []string{"-6", "rule", "del", "pref", "31000", "table", "51820"}, nil},
		{"flush table", []string{"route", "flush", "table", "51820"}, nil},
	}
	for i, c := range cases {
		if !tn.ip(t, c.args...) {
			t.Skip("no ip(8)")
		}
		took := waitFor(t, time.Second, c.name+" restored", func() bool {
			return equalSets(tn.ourRoutes(t), want) && len(tn.rules(t)) >= 2 &&
				tn.rules(t)[KernelRule{Family: FamilyV4, Priority: 31000, Table: 51820, Protocol: 109}] &&
				tn.rules(t)[KernelRule{Family: FamilyV6, Priority: 31000, Table: 51820, Protocol: 109}]
		})
		t.Logf("%s: restored in %v", c.name, took)
		waitFor(t, time.Second, "changed", func() bool { return changed.Load() == int64(i+1) })
	}
	// A stray route with our marker, added by someone else, is removed.
	tn.ip(t, "route", "add", "10.77.0.0/16", "dev", "mesh0", "table", "51820", "proto", "109")
	waitFor(t, time.Second, "stray removed", func() bool { return equalSets(tn.ourRoutes(t), want) })
	// Foreign changes cause no writes.
	time.Sleep(200 * time.Millisecond)
	w := m.Writes()
	tn.ip(t, "route", "add", "10.78.0.0/16", "dev", "mesh0", "table", "51820")
	tn.ip(t, "route", "add", "10.79.0.0/16", "dev", "mesh0", "proto", "109")
	tn.ip(t, "rule", "add", "pref", "200", "table", "200")
	time.Sleep(300 * time.Millisecond)
	if m.Writes() != w {
		t.Fatalf("foreign changes caused %d writes", m.Writes()-w)
	}
}

// TestNetlinkLinkDownUp: the kernel removes the IPv4 routes through a link
// that goes down, without a route notification; Run learns of it from the
// link notifications and puts the routes back as soon as the link is up
// again (the periodic resync, 10 minutes in meshd, is not what repairs
// it), and a Set of the same set after that looks at the kernel again.
func TestNetlinkLinkDownUp(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)
	// IPv4 only: the kernel announces the removal of IPv6 routes.
	v4 := []Route{{Dst: pfx("10.5.0.0/16"), Device: "mesh0"}, {Dst: pfx("10.6.0.0/16"), Device: "mesh0", Src: addr("203.0.113.1")}}
	mustSet(t, m, v4, rootRules)
	startRun(t, m)
	time.Sleep(100 * time.Millisecond) // subscribed
	want := tn.ourRoutes(t)
	if !tn.ip(t, "link", "set", "mesh0", "down") {
		t.Skip("no ip(8)")
	}
	waitFor(t, time.Second, "the kernel dropped the routes through mesh0", func() bool { return !equalSets(tn.ourRoutes(t), want) })
	tn.ip(t, "link", "set", "mesh0", "up")
	took := waitFor(t, 2*time.Second, "routes back", func() bool { return equalSets(tn.ourRoutes(t), want) })
	t.Logf("routes back %v after the link came up", took)
	mustSet(t, m, v4, rootRules)
	if !equalSets(tn.ourRoutes(t), want) {
		t.Error("a Set after the repair lost routes")
	}
}

// TestNetlinkOverrun provokes a real ENOBUFS (tiny receive buffer, a burst
// of 2,000 route notifications), and checks that Run resubscribes, resyncs
// in full (a route deleted in the burst comes back) and does not spin.
func TestNetlinkOverrun(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)
	k := m.k.(*netlinkKernel)
	k.rcvBuf, k.rcvBufForce = 1, false // the kernel rounds up to its minimum (a few KiB)
	mustSet(t, m, rootRoutes, rootRules)
	want := tn.ourRoutes(t)
	startRun(t, m)
	time.Sleep(100 * time.Millisecond)

	burst := func(add bool) {
		for i := range 2000 {
			r := &netlink.Route{Dst: ipNet(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100 + byte(i/250), byte(i % 250), 0}), 24)),
				LinkIndex: tn.mesh0, Table: 1000}
			var err error
			if add {
				err = tn.h.RouteAdd(r)
			} else {
				err = tn.h.RouteDel(r)
			}
			if err != nil {
				t.Fatal(err)
			}
			if i == 1000 && add {
				// Lost in the overrun: only a full resync brings it back.
				if err := tn.h.RouteDel(toNetlinkRoute(KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: tn.mesh0, Protocol: 109})); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for round := 0; m.Resubscribes() == 0; round++ {
		if round == 5 {
			t.Skip("could not provoke ENOBUFS on this machine")
		}
		burst(true)
		burst(false)
	}
	waitFor(t, 2*time.Second, "resync after overrun", func() bool { return equalSets(tn.ourRoutes(t), want) })
	t.Logf("resubscribes after bursts: %d", m.Resubscribes())

	// Idle: no busy loop (CPU time of the whole process stays small).
	time.Sleep(500 * time.Millisecond) // let the tail of the burst's overrun settle
	r0 := m.Resubscribes()
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	time.Sleep(time.Second)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	t.Logf("CPU while idle for 1s: %v; resubscribes %d -> %d", cpu, r0, m.Resubscribes())
	if cpu > 200*time.Millisecond {
		t.Fatalf("busy loop: %v CPU in 1s idle", cpu)
	}
	if m.Resubscribes() > r0+1 {
		t.Fatalf("resubscribing while idle: %d -> %d", r0, m.Resubscribes())
	}
	// And the new subscription works: repair still happens.
	if err := tn.h.RouteDel(toNetlinkRoute(KernelRoute{Family: FamilyV6, Table: 51820, Dst: pfx("2001:db8:5::/48"), LinkIndex: tn.mesh0, Protocol: 109, Metric: 1024})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "repair after resubscribe", func() bool { return equalSets(tn.ourRoutes(t), want) })
}

// TestNetlinkRunContextCancel checks that Run returns promptly and leaves no
// goroutine blocked in the subscription.
func TestNetlinkRunContextCancel(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx, nil) }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return")
	}
	waitFor(t, 2*time.Second, "subscription goroutines gone", func() bool { return runtime.NumGoroutine() <= before })
}

func benchRoutes(n int) []Route {
	routes := make([]Route, 0, n)
	for i := range n {
		if i%2 == 0 {
			j := i / 2
			routes = append(routes, Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10 + byte(j/250), byte(j % 250), 0}), 24), Device: "mesh0"})
		} else {
			j := i / 2
			a := [16]byte{0x20, 0x01, 0x0d, 0xb8, 0x01, 0x00, byte(j >> 8), byte(j)}
			routes = append(routes, Route{Dst: netip.PrefixFrom(netip.AddrFrom16(a), 64), Gateway: addr("2001:db8::2"), Device: "veth0"})
		}
	}
	return routes
}

// BenchmarkSet1000Routes: 1,000 routes (half IPv4 dev routes, half IPv6
// gateway routes) and 2 rules, from empty, in a fresh namespace.
func BenchmarkSet1000Routes(b *testing.B) {
	tn := newTestNS(b)
	m := tn.newManager(b)
	routes := benchRoutes(1000)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if err := m.Cleanup(); err != nil {
			b.Fatal(err)
		}
		w := m.Writes()
		b.StartTimer()
		if err := m.Set(routes, rootRules); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if got := m.Writes() - w; got != 1002 {
			b.Fatalf("writes = %d, want 1002", got)
		}
		b.StartTimer()
	}
}

// BenchmarkSetUnchanged: Set of the same 1,000 routes and 2 rules again.
func BenchmarkSetUnchanged(b *testing.B) {
	tn := newTestNS(b)
	m := tn.newManager(b)
	routes := benchRoutes(1000)
	if err := m.Set(routes, rootRules); err != nil {
		b.Fatal(err)
	}
	w := m.Writes()
	b.ResetTimer()
	for range b.N {
		if err := m.Set(routes, rootRules); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if m.Writes() != w {
		b.Fatalf("unchanged Set wrote %d times", m.Writes()-w)
	}
	b.ReportMetric(0, "writes/op")
}

// TestNetlinkRunLargeSet: a Set of 1,000 routes while Run watches neither
// overruns the subscription nor counts as a foreign change.
func TestNetlinkRunLargeSet(t *testing.T) {
	tn := newTestNS(t)
	m := tn.newManager(t)
	changed := startRun(t, m)
	time.Sleep(100 * time.Millisecond)
	mustSet(t, m, benchRoutes(1000), rootRules)
	mustSet(t, m, benchRoutes(1000)[:500], rootRules)
	w := m.Writes()
	time.Sleep(300 * time.Millisecond)
	if m.Resubscribes() != 0 || changed.Load() != 0 || m.Writes() != w {
		t.Fatalf("resubscribes %d, changed %d, writes after Set %d", m.Resubscribes(), changed.Load(), m.Writes()-w)
	}
}
