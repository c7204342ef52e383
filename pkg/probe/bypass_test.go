package probe

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The bypass rule, in a network namespace of its own: added once (a second
// ensureBypass keeps it), removed by RemoveBypass.
func TestBypassRule(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace)")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	defer func() { _ = netns.Set(orig); ns.Close() }()

	count := func() int {
		rules, err := netlink.RuleList(netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range rules {
			if r.Mark == DefaultMark && r.Priority == 30999 && r.Table == 254 {
				n++
			}
		}
		return n
	}
	for range 2 {
		if err := ensureBypass(DefaultMark, 30999); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("%d bypass rules, want 1", n)
	}
	if err := RemoveBypass(DefaultMark, 30999); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d bypass rules after RemoveBypass", n)
	}
	if err := RemoveBypass(DefaultMark, 30999); err != nil {
		t.Errorf("removing a missing rule: %v", err)
	}
}
