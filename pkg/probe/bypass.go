package probe

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultMark is the firewall mark of probe packets (see Options.Mark). It
// keeps clear of kube-proxy's 0x4000/0x8000 and of the top bits Calico
// allocates from.
const DefaultMark = 0x00100000

// ensureBypass adds, for both families, the policy rule "fwmark mark lookup
// main" at priority: probe packets (marked on their socket) then skip the
// rules after it, among them meshd's own table, and take the underlay path.
// An existing rule is kept. IPv6 failing alone is not an error (no IPv6).
func ensureBypass(mark uint32, priority int) error {
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		r := netlink.NewRule()
		r.Family = fam
		r.Priority = priority
		r.Table = unix.RT_TABLE_MAIN
		r.Mark = mark
		mask := uint32(0xffffffff)
		r.Mask = &mask
		if err := netlink.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			if fam == netlink.FAMILY_V6 {
				continue
			}
			errs = append(errs, fmt.Errorf("adding the rule fwmark %#x lookup main pref %d: %w", mark, priority, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveBypass deletes the rules ensureBypass adds (meshd cleanup); missing
// ones are fine.
func RemoveBypass(mark uint32, priority int) error {
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		r := netlink.NewRule()
		r.Family = fam
		r.Priority = priority
		r.Table = unix.RT_TABLE_MAIN
		r.Mark = mark
		mask := uint32(0xffffffff)
		r.Mask = &mask
		if err := netlink.RuleDel(r); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EAFNOSUPPORT) {
			errs = append(errs, fmt.Errorf("removing the rule fwmark %#x lookup main pref %d: %w", mark, priority, err))
		}
	}
	return errors.Join(errs...)
}
