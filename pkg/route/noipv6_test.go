package route

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A kernel without IPv6 policy routing (booted with ipv6.disable=1, or
// built without CONFIG_IPV6_MULTIPLE_TABLES) refuses the IPv6 rule dump
// with EAFNOSUPPORT. That once failed the whole rule listing: no IPv4 rule
// was ever added, so table 51820 was never consulted and mesh traffic left
// unencrypted, and every Set failed.

// TestListRulesWithoutIPv6PolicyRouting: the real Kernel's listing takes
// EAFNOSUPPORT on the IPv6 dump as "no IPv6 rules" and lists the IPv4
// ones; any other failure, or one of the IPv4 dump, is still an error.
func TestListRulesWithoutIPv6PolicyRouting(t *testing.T) {
	v4 := netlink.NewRule()
	v4.Family, v4.Priority, v4.Table = netlink.FAMILY_V4, 31000, 51820
	dump := func(failV4, failV6 error) func(int) ([]netlink.Rule, error) {
		return func(fam int) ([]netlink.Rule, error) {
			switch fam {
			case netlink.FAMILY_V4:
				if failV4 != nil {
					return nil, failV4
				}
				return []netlink.Rule{*v4}, nil
			case netlink.FAMILY_V6:
				return nil, failV6
			}
			t.Fatalf("dump of family %d", fam)
			return nil, nil
		}
	}

	got, err := listRules(dump(nil, unix.EAFNOSUPPORT))
	want := []KernelRule{{Family: FamilyV4, Priority: 31000, Table: 51820}}
	if err != nil || len(got) != 1 || got[0] != want[0] {
		t.Fatalf("IPv6 dump EAFNOSUPPORT: listRules = %v, %v; want %v, nil", got, err, want)
	}
	for _, c := range []struct {
		name           string
		failV4, failV6 error
	}{
		{"IPv4 dump EAFNOSUPPORT", unix.EAFNOSUPPORT, nil},
		{"IPv6 dump EPERM", nil, unix.EPERM},
	} {
		if got, err := listRules(dump(c.failV4, c.failV6)); err == nil {
			t.Errorf("%s: listRules = %v, nil; want the error", c.name, got)
		}
	}
}

// TestSetWithoutIPv6PolicyRouting: on such a kernel an IPv4-only plan is
// applied in full, with no error, and settles (no write when repeated); a
// plan that also asks for an IPv6 rule gets an error naming that rule and
// the reason, and everything else is applied all the same.
func TestSetWithoutIPv6PolicyRouting(t *testing.T) {
	f, m, wg, _ := fakeEnv(t)
	f.DisableIPv6Rules()
	routes := []Route{{Dst: pfx("10.5.0.0/16"), Device: "wg0"}, {Dst: pfx("10.5.0.0/16"), Type: TypeUnreachable, Metric: 65535}}
	v4Rule := KernelRule{Family: FamilyV4, Priority: 31000, Table: 51820, Protocol: 109}

	if err := m.Set(routes, []Rule{{}}); err != nil {
		t.Fatalf("IPv4-only Set: %v", err)
	}
	if got := f.Rules(); !got[v4Rule] {
		t.Fatalf("IPv4-only Set: rules %v, want %s (without it table 51820 is never consulted)", got, v4Rule)
	}
	w := m.Writes()
	mustSet(t, m, routes, []Rule{{}})
	if got := m.Writes() - w; got != 0 {
		t.Fatalf("repeated IPv4-only Set made %d writes, want 0", got)
	}

	// Dual-stack plan: the IPv6 rule alone fails, with the reason.
	routes = append(routes, Route{Dst: pfx("fd5::/64"), Device: "wg0"})
	err := m.Set(routes, []Rule{{}, {IPv6: true}, {Priority: 30000}})
	if err == nil {
		t.Fatal("Set of an IPv6 rule on a kernel without IPv6 policy routing succeeded")
	}
	if !errors.Is(err, syscall.EAFNOSUPPORT) || !strings.Contains(err.Error(), "ipv6 rule pref 31000") ||
		!strings.Contains(err.Error(), "no IPv6 policy routing") || strings.Contains(err.Error(), "ipv4") {
		t.Fatalf("Set = %q; want EAFNOSUPPORT for the IPv6 rule alone, saying the kernel has no IPv6 policy routing", err)
	}
	wantRules := map[KernelRule]bool{v4Rule: true, {Family: FamilyV4, Priority: 30000, Table: 51820, Protocol: 109}: true}
	if got := f.Rules(); !equalSets(got, wantRules) {
		t.Fatalf("dual-stack Set: rules %v, want %v", got, wantRules)
	}
	v6Route := KernelRoute{Family: FamilyV6, Table: 51820, Dst: pfx("fd5::/64"), LinkIndex: wg, Protocol: 109, Metric: 1024}
	if got := ours(f); len(got) != 3 || !got[v6Route] {
		t.Fatalf("dual-stack Set: routes %v, want all 3 (%s among them)", got, v6Route)
	}

	// Cleanup is not held back by the missing IPv6 rule either.
	if err := m.Cleanup(); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if len(f.Rules()) != 0 || len(ours(f)) != 0 {
		t.Fatalf("after Cleanup: rules %v, routes %v", f.Rules(), ours(f))
	}
}
