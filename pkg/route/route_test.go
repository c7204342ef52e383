package route

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"syscall"
	"testing"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

type op struct {
	what string
	obj  string
}

// fakeEnv is a fake kernel with a dummy "wg0" and an underlay "eth0".
func fakeEnv(t *testing.T) (*FakeKernel, *Manager, int, int) {
	t.Helper()
	f := NewFakeKernel()
	wg := f.AddLink("wg0", pfx("10.4.0.1/16"), pfx("fd4::1/64"))
	eth := f.AddLink("eth0", pfx("198.51.100.1/24"), pfx("2001:db8::1/64"))
	return f, NewWithKernel(Options{}, f), wg, eth
}

// record logs every write the fake is asked for.
func record(f *FakeKernel) *[]op {
	var ops []op
	f.SetFail(func(what string, obj any) error {
		ops = append(ops, op{what, fmt.Sprint(obj)})
		return nil
	})
	return &ops
}

func mustSet(t *testing.T, m *Manager, routes []Route, rules []Rule) {
	t.Helper()
	if err := m.Set(routes, rules); err != nil {
		t.Fatalf("Set: %v", err)
	}
}

// ours returns the fake's routes carrying protocol 109 in table 51820.
func ours(f *FakeKernel) map[KernelRoute]bool {
	out := map[KernelRoute]bool{}
	for r := range f.Routes() {
		if r.Protocol == DefaultProtocol {
			out[r] = true
		}
	}
	return out
}

func TestSetAddsThenIdempotent(t *testing.T) {
	f, m, wg, eth := fakeEnv(t)
	routes := []Route{
		{Dst: pfx("10.5.0.0/16"), Device: "wg0"},
		{Dst: pfx("fd5::/64"), Device: "wg0"},
		{Dst: pfx("203.0.113.0/24"), Gateway: addr("198.51.100.2"), Device: "eth0", Src: addr("198.51.100.1"), Metric: 10},
		{Dst: pfx("2001:db8:5::/48"), Gateway: addr("2001:db8::2"), Device: "eth0"},
	}
	rules := []Rule{{}, {IPv6: true}}
	mustSet(t, m, routes, rules)
	if got := m.Writes(); got != 6 {
		t.Fatalf("writes = %d, want 6", got)
	}
	want := map[KernelRoute]bool{
		{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: wg, Protocol: 109}:                                                                           true,
		{Family: FamilyV6, Table: 51820, Dst: pfx("fd5::/64"), LinkIndex: wg, Protocol: 109, Metric: 1024}:                                                                true,
		{Family: FamilyV4, Table: 51820, Dst: pfx("203.0.113.0/24"), Gateway: addr("198.51.100.2"), LinkIndex: eth, Src: addr("198.51.100.1"), Protocol: 109, Metric: 10}: true,
		{Family: FamilyV6, Table: 51820, Dst: pfx("2001:db8:5::/48"), Gateway: addr("2001:db8::2"), LinkIndex: eth, Protocol: 109, Metric: 1024}:                          true,
	}
	if got := f.Routes(); !equalSets(got, want) {
		t.Fatalf("routes = %v, want %v", got, want)
	}
	wantRules := map[KernelRule]bool{
		{Family: FamilyV4, Priority: 31000, Table: 51820, Protocol: 109}: true,
		{Family: FamilyV6, Priority: 31000, Table: 51820, Protocol: 109}: true,
	}
	if got := f.Rules(); !equalSets(got, wantRules) {
		t.Fatalf("rules = %v, want %v", got, wantRules)
	}
	for range 3 {
		mustSet(t, m, routes, rules)
	}
	if got := m.Writes(); got != 6 {
		t.Fatalf("writes after repeats = %d, want 6 (zero per unchanged Set)", got)
	}
}

func equalSets[K comparable](a, b map[K]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// TestDiffDecisions checks each decision of the diff: which write (if
// any) a change of the desired set causes, in which order.
func TestDiffDecisions(t *testing.T) {
	base := []Route{
		{Dst: pfx("10.5.0.0/16"), Device: "wg0"},
		{Dst: pfx("10.6.0.0/16"), Gateway: addr("10.4.0.2"), Device: "wg0"},
		{Dst: pfx("fd5::/64"), Device: "wg0"},
	}
	with := func(i int, fn func(*Route)) []Route {
		out := append([]Route(nil), base...)
		fn(&out[i])
		return out
	}
	tests := []struct {
		name    string
		routes  []Route
		rules   []Rule
		wantOps []string
	}{
		{"unchanged", base, []Rule{{}}, nil},
		{"add one", append(append([]Route(nil), base...), Route{Dst: pfx("10.7.0.0/16"), Device: "wg0"}), []Rule{{}}, []string{"add route 10.7.0.0/16"}},
		{"remove one", base[1:], []Rule{{}}, []string{"delete route 10.5.0.0/16"}},
		{"gateway change replaces in place", with(1, func(r *Route) { r.Gateway = addr("10.4.0.3") }), []Rule{{}}, []string{"replace route 10.6.0.0/16 table 51820 via 10.4.0.3"}},
		{"source change replaces in place", with(0, func(r *Route) { r.Src = addr("10.4.0.1") }), []Rule{{}}, []string{"replace route 10.5.0.0/16"}},
		{"device change replaces in place", with(2, func(r *Route) { r.Device = "eth0" }), []Rule{{}}, []string{"replace route fd5::/64"}},
		{"destination change adds before delete", with(0, func(r *Route) { r.Dst = pfx("10.8.0.0/16") }), []Rule{{}}, []string{"add route 10.8.0.0/16", "delete route 10.5.0.0/16"}},
		{"metric change is a new slot", with(0, func(r *Route) { r.Metric = 5 }), []Rule{{}}, []string{"add route 10.5.0.0/16 table 51820 ifindex 2 proto 109 metric 5", "delete route 10.5.0.0/16 table 51820 ifindex 2 proto 109 metric 0"}},
		{"table change", with(0, func(r *Route) { r.Table = 51821 }), []Rule{{}}, []string{"add route 10.5.0.0/16 table 51821", "delete route 10.5.0.0/16 table 51820"}},
		{"ipv6 metric 0 is 1024", with(2, func(r *Route) { r.Metric = 1024 }), []Rule{{}}, nil},
		{"rule added", base, []Rule{{}, {IPv6: true}}, []string{"add rule ipv6 rule pref 31000 lookup 51820 proto 109"}},
		{"rule removed", base, nil, []string{"delete rule ipv4 rule pref 31000 lookup 51820"}},
		{"rule priority change adds before delete", base, []Rule{{Priority: 30000}}, []string{"add rule ipv4 rule pref 30000", "delete rule ipv4 rule pref 31000"}},
		{"duplicates collapse", append(append([]Route(nil), base...), base...), []Rule{{}, {Priority: 31000, Table: 51820}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, m, _, _ := fakeEnv(t)
			mustSet(t, m, base, []Rule{{}})
			ops := record(f)
			mustSet(t, m, tt.routes, tt.rules)
			if len(*ops) != len(tt.wantOps) {
				t.Fatalf("ops = %v, want %v", *ops, tt.wantOps)
			}
			for i, w := range tt.wantOps {
				if got := (*ops)[i].what + " " + (*ops)[i].obj; !strings.HasPrefix(got, w) {
					t.Errorf("op %d = %q, want prefix %q", i, got, w)
				}
			}
			if m.Writes() != uint64(len(base)+1+len(tt.wantOps)) {
				t.Errorf("writes = %d", m.Writes())
			}
			// And the result is stable.
			*ops = nil
			mustSet(t, m, tt.routes, tt.rules)
			if len(*ops) != 0 {
				t.Fatalf("second Set wrote %v", *ops)
			}
		})
	}
}

func TestForeignNeverTouched(t *testing.T) {
	f, m, wg, eth := fakeEnv(t)
	foreign := []KernelRoute{
		// our table, other protocol, a slot we also want
		{Family: FamilyV4, Table: 51820, Dst: pfx("10.9.0.0/16"), LinkIndex: wg, Protocol: 4},
		// our table, other protocol
		{Family: FamilyV4, Table: 51820, Dst: pfx("10.10.0.0/16"), LinkIndex: wg, Protocol: 3},
		// main table, our protocol (main is not ours)
		{Family: FamilyV4, Table: 254, Dst: pfx("10.11.0.0/16"), LinkIndex: eth, Protocol: 109},
		{Family: FamilyV6, Table: 254, Dst: pfx("2001:db8:9::/48"), LinkIndex: eth, Protocol: 2, Metric: 1024},
	}
	foreignRules := []KernelRule{
		{Family: FamilyV4, Priority: 32766, Table: 254},
		{Family: FamilyV4, Priority: 100, Table: 200},
		{Family: FamilyV6, Priority: 32766, Table: 254},
	}
	for _, r := range foreign {
		if err := f.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range foreignRules {
		if err := f.AddRule(r); err != nil {
			t.Fatal(err)
		}
	}
	err := m.Set([]Route{
		{Dst: pfx("10.9.0.0/16"), Device: "wg0"}, // slot taken by a foreign route
		{Dst: pfx("10.12.0.0/16"), Device: "wg0"},
	}, []Rule{{}})
	if !errors.Is(err, syscall.EEXIST) || !strings.Contains(err.Error(), "add route 10.9.0.0/16") {
		t.Fatalf("Set = %v, want EEXIST for 10.9.0.0/16", err)
	}
	if err := m.Cleanup(); err != nil {
		t.Fatal(err)
	}
	routes := f.Routes()
	for _, r := range foreign {
		if !routes[r] {
			t.Errorf("foreign route %s was touched", r)
		}
	}
	if len(routes) != len(foreign) {
		t.Errorf("routes after cleanup = %v", routes)
	}
	if got := f.Rules(); !equalSets(got, map[KernelRule]bool{foreignRules[0]: true, foreignRules[1]: true, foreignRules[2]: true}) {
		t.Errorf("rules after cleanup = %v", got)
	}
}

func TestAdoptAfterRestart(t *testing.T) {
	f, m, wg, _ := fakeEnv(t)
	routes := []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}, {Dst: pfx("fd5::/64"), Device: "wg0"}}
	mustSet(t, m, append(routes, Route{Dst: pfx("10.6.0.0/16"), Device: "wg0"}), []Rule{{}, {Priority: 30999}})
	// A stale rule tagged with our protocol in another table, and one in
	// our table without the tag (an older meshd, or by hand).
	_ = f.AddRule(KernelRule{Family: FamilyV6, Priority: 500, Table: 77, Protocol: 109})
	_ = f.AddRule(KernelRule{Family: FamilyV6, Priority: 501, Table: 51820})

	// "Restart": a new Manager knows nothing but the markers.
	m2 := NewWithKernel(Options{}, f)
	ops := record(f)
	mustSet(t, m2, routes, []Rule{{}})
	want := []string{
		"delete route 10.6.0.0/16",
		"delete rule ipv4 rule pref 30999",
		"delete rule ipv6 rule pref 500",
		"delete rule ipv6 rule pref 501",
	}
	if len(*ops) != len(want) {
		t.Fatalf("ops = %v, want %v", *ops, want)
	}
	for i, w := range want {
		if got := (*ops)[i].what + " " + (*ops)[i].obj; !strings.HasPrefix(got, w) {
			t.Errorf("op %d = %q, want %q", i, got, w)
		}
	}
	if !ours(f)[KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: wg, Protocol: 109}] {
		t.Error("adopted route lost")
	}
}

func TestGatewayRouteWithoutDevice(t *testing.T) {
	f, m, _, eth := fakeEnv(t)
	routes := []Route{{Dst: pfx("203.0.113.0/24"), Gateway: addr("198.51.100.2")}}
	mustSet(t, m, routes, nil)
	want := KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("203.0.113.0/24"), Gateway: addr("198.51.100.2"), LinkIndex: eth, Protocol: 109}
	if !f.Routes()[want] {
		t.Fatalf("routes = %v", f.Routes())
	}
	w := m.Writes()
	mustSet(t, m, routes, nil)
	if m.Writes() != w {
		t.Fatal("unchanged device-less route rewritten")
	}
}

func TestInvalidAndMissingDevice(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	err := m.Set([]Route{
		{Dst: pfx("10.5.0.0/16"), Device: "wg0"},
		{Dst: pfx("10.6.0.0/16"), Device: "nope"},
		{Dst: pfx("10.7.0.0/16"), Device: "nope"},
		{Dst: pfx("10.8.0.0/16")},
		{Dst: pfx("10.9.0.0/16"), Gateway: addr("2001:db8::1"), Device: "wg0"},
		{},
	}, nil)
	for _, want := range []string{
		`route 10.6.0.0/16: resolve device "nope"`,
		`route 10.7.0.0/16: resolve device "nope"`,
		"route 10.8.0.0/16: neither device nor gateway",
		"route 10.9.0.0/16: gateway 2001:db8::1 is not in the destination's family",
		"invalid destination",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if len(ours(f)) != 1 {
		t.Fatalf("routes = %v, want just 10.5.0.0/16", f.Routes())
	}
	// The device appears: the next Set adds only the missing routes.
	f.AddLink("nope")
	w := m.Writes()
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}, {Dst: pfx("10.6.0.0/16"), Device: "nope"}}, nil)
	if m.Writes()-w != 1 {
		t.Fatalf("writes = %d, want 1", m.Writes()-w)
	}
}

func TestRecreatedInterfaceFollowed(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	routes := []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}}
	mustSet(t, m, routes, nil)
	f.DelLink("wg0")
	idx := f.AddLink("wg0")
	mustSet(t, m, routes, nil)
	if !f.Routes()[KernelRoute{Family: FamilyV4, Table: 51820, Dst: pfx("10.5.0.0/16"), LinkIndex: idx, Protocol: 109}] {
		t.Fatalf("routes = %v", f.Routes())
	}
}

func TestPartialFailure(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	bad := pfx("10.6.0.0/16")
	f.SetFail(func(what string, obj any) error {
		if r, ok := obj.(KernelRoute); ok && r.Dst == bad {
			return syscall.ENOMEM
		}
		if r, ok := obj.(KernelRule); ok && r.Family == FamilyV6 {
			return syscall.EACCES
		}
		return nil
	})
	routes := []Route{
		{Dst: pfx("10.5.0.0/16"), Device: "wg0"},
		{Dst: bad, Device: "wg0"},
		{Dst: pfx("10.7.0.0/16"), Device: "wg0"},
	}
	rules := []Rule{{}, {IPv6: true}}
	err := m.Set(routes, rules)
	if !errors.Is(err, syscall.ENOMEM) || !errors.Is(err, syscall.EACCES) {
		t.Fatalf("Set = %v, want ENOMEM and EACCES joined", err)
	}
	if !strings.Contains(err.Error(), "add route 10.6.0.0/16") || !strings.Contains(err.Error(), "add ipv6 rule") {
		t.Fatalf("error does not say what was being done: %v", err)
	}
	if got := len(ours(f)); got != 2 {
		t.Fatalf("routes applied = %d, want 2", got)
	}
	if got := len(f.Rules()); got != 1 {
		t.Fatalf("rules applied = %d, want 1", got)
	}
	// The real state was recorded: the retry writes only the failed ones.
	ops := record(f)
	mustSet(t, m, routes, rules)
	if len(*ops) != 2 || !strings.HasPrefix((*ops)[0].what+" "+(*ops)[0].obj, "add route 10.6.0.0/16") || (*ops)[1].what != "add rule" {
		t.Fatalf("retry ops = %v, want add 10.6.0.0/16 and the v6 rule", *ops)
	}
}

func TestFailedDeleteRetried(t *testing.T) {
	f, m, _, _ := fakeEnv(t)
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}, {Dst: pfx("10.6.0.0/16"), Device: "wg0"}}, nil)
	f.SetFail(func(what string, obj any) error {
		if what == "delete route" {
			return syscall.EBUSY
		}
		return nil
	})
	if err := m.Set([]Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}}, nil); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("Set = %v", err)
	}
	ops := record(f)
	mustSet(t, m, []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}}, nil)
	if len(*ops) != 1 || (*ops)[0].what != "delete route" {
		t.Fatalf("ops = %v", *ops)
	}
}

// TestStateRandom replays random desired sets in random order (Tailscale
// style): after each Set the kernel holds exactly the desired routes and
// rules, a repeat makes no write, and foreign routes and rules survive.
func TestStateRandom(t *testing.T) {
	f, m, wg, eth := fakeEnv(t)
	idx := map[string]int{"wg0": wg, "eth0": eth}
	foreign := map[KernelRoute]bool{
		{Family: FamilyV4, Table: 51820, Dst: pfx("10.200.0.0/16"), LinkIndex: wg, Protocol: 4}:      true,
		{Family: FamilyV4, Table: 254, Dst: pfx("10.201.0.0/16"), LinkIndex: eth, Protocol: 109}:     true,
		{Family: FamilyV6, Table: 254, Dst: pfx("fd9::/64"), LinkIndex: eth, Protocol: 3, Metric: 5}: true,
	}
	for r := range foreign {
		_ = f.AddRoute(r)
	}
	foreignRule := KernelRule{Family: FamilyV4, Priority: 32766, Table: 254}
	_ = f.AddRule(foreignRule)

	rng := rand.New(rand.NewPCG(1, 2))
	type slotSpec struct {
		dst    netip.Prefix
		table  int
		metric int
	}
	var slots []slotSpec
	for i := range 12 {
		slots = append(slots,
			slotSpec{pfx(fmt.Sprintf("10.%d.0.0/16", 10+i)), []int{0, 51821}[i%2], []int{0, 7}[i/6]},
			slotSpec{pfx(fmt.Sprintf("fd%x::/64", 10+i)), []int{0, 51821}[i%2], []int{0, 7}[i/6]})
	}
	variant := func(s slotSpec) Route {
		r := Route{Table: s.table, Dst: s.dst, Metric: s.metric}
		v4 := s.dst.Addr().Is4()
		switch rng.IntN(4) {
		case 0:
			r.Device = "wg0"
		case 1:
			r.Device = "eth0"
		case 2:
			r.Device = "wg0"
			r.Gateway = map[bool]netip.Addr{true: addr("10.4.0.9"), false: addr("fd4::9")}[v4]
		case 3:
			r.Device = "eth0"
			r.Src = map[bool]netip.Addr{true: addr("198.51.100.1"), false: addr("2001:db8::1")}[v4]
		}
		return r
	}
	for iter := range 200 {
		var routes []Route
		want := map[KernelRoute]bool{}
		for _, s := range slots {
			if rng.IntN(2) == 0 {
				continue
			}
			r := variant(s)
			routes = append(routes, r)
			k, err := m.routeKey(r)
			if err != nil {
				t.Fatal(err)
			}
			k.LinkIndex = idx[r.Device]
			want[k] = true
		}
		rng.Shuffle(len(routes), func(i, j int) { routes[i], routes[j] = routes[j], routes[i] })
		var rules []Rule
		wantRules := map[KernelRule]bool{foreignRule: true}
		for _, p := range []int{0, 30000, 30001} {
			for _, v6 := range []bool{false, true} {
				if rng.IntN(2) == 0 {
					rules = append(rules, Rule{Priority: p, IPv6: v6})
					kr := KernelRule{Family: map[bool]int{false: FamilyV4, true: FamilyV6}[v6], Priority: p, Table: 51820, Protocol: 109}
					if p == 0 {
						kr.Priority = DefaultRulePriority
					}
					wantRules[kr] = true
				}
			}
		}
		mustSet(t, m, routes, rules)
		got := f.Routes()
		for r := range foreign {
			if !got[r] {
				t.Fatalf("iter %d: foreign route %s touched", iter, r)
			}
			delete(got, r)
		}
		if !equalSets(got, want) {
			t.Fatalf("iter %d: kernel %v\nwant %v", iter, got, want)
		}
		if gotRules := f.Rules(); !equalSets(gotRules, wantRules) {
			t.Fatalf("iter %d: rules %v, want %v", iter, gotRules, wantRules)
		}
		w := m.Writes()
		rng.Shuffle(len(routes), func(i, j int) { routes[i], routes[j] = routes[j], routes[i] })
		mustSet(t, m, routes, rules)
		if m.Writes() != w {
			t.Fatalf("iter %d: repeated Set wrote %d times", iter, m.Writes()-w)
		}
	}
	if err := m.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := f.Routes(); !equalSets(got, foreign) {
		t.Fatalf("after cleanup: %v", got)
	}
	if got := f.Rules(); !equalSets(got, map[KernelRule]bool{foreignRule: true}) {
		t.Fatalf("rules after cleanup: %v", got)
	}
}
