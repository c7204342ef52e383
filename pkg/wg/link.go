package wg

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// LinkState is what Set needs to know about the interface.
type LinkState struct {
	Index int
	MTU   int
	Up    bool
	Addrs []netip.Prefix // every address on the link, link-local included
}

// LinkOps is the seam over the netlink operations Set performs on the
// interface; tests use FakeLinks.
type LinkOps interface {
	Link(name string) (LinkState, error)
	SetMTU(name string, mtu int) error
	SetUp(name string) error
	AddAddr(name string, p netip.Prefix) error
	DelAddr(name string, p netip.Prefix) error
}

// netlinkOps implements LinkOps with a netlink handle bound to the
// interface's network namespace.
type netlinkOps struct{ h *netlink.Handle }

func (o netlinkOps) link(name string) (netlink.Link, error) {
	l, err := o.h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("looking up link %s: %w", name, err)
	}
	return l, nil
}

func (o netlinkOps) Link(name string) (LinkState, error) {
	l, err := o.link(name)
	if err != nil {
		return LinkState{}, err
	}
	attrs := l.Attrs()
	st := LinkState{Index: attrs.Index, MTU: attrs.MTU, Up: attrs.Flags&unix.IFF_UP != 0}
	var addrs []netlink.Addr
	for try := 0; ; try++ {
		addrs, err = o.h.AddrList(l, netlink.FAMILY_ALL)
		if err == nil || !errors.Is(err, netlink.ErrDumpInterrupted) || try == 3 {
			break
		}
	}
	if err != nil {
		return LinkState{}, fmt.Errorf("listing addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		ip = ip.Unmap()
		if ip.Is4() && ones > 32 {
			ones -= 96
		}
		st.Addrs = append(st.Addrs, netip.PrefixFrom(ip, ones))
	}
	return st, nil
}

func (o netlinkOps) SetMTU(name string, mtu int) error {
	l, err := o.link(name)
	if err != nil {
		return err
	}
	return o.h.LinkSetMTU(l, mtu)
}

func (o netlinkOps) SetUp(name string) error {
	l, err := o.link(name)
	if err != nil {
		return err
	}
	return o.h.LinkSetUp(l)
}

func (o netlinkOps) AddAddr(name string, p netip.Prefix) error {
	l, err := o.link(name)
	if err != nil {
		return err
	}
	n := prefixToIPNet(netip.PrefixFrom(p.Addr(), p.Bits())) // keep host bits
	n.IP = p.Addr().AsSlice()
	return o.h.AddrAdd(l, &netlink.Addr{IPNet: &n})
}

func (o netlinkOps) DelAddr(name string, p netip.Prefix) error {
	l, err := o.link(name)
	if err != nil {
		return err
	}
	n := prefixToIPNet(p)
	n.IP = p.Addr().AsSlice()
	return o.h.AddrDel(l, &netlink.Addr{IPNet: &n})
}

// normalizeAddrs returns a sorted, de-duplicated copy of interface addresses
// (host bits kept, IPv4-mapped unmapped).
func normalizeAddrs(in []netip.Prefix) ([]netip.Prefix, error) {
	var errs []error
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		n, ok := normalizePrefix(p)
		if !ok {
			errs = append(errs, fmt.Errorf("invalid interface address %s; skipped", p))
			continue
		}
		out = append(out, n)
	}
	return sortCompact(out), errors.Join(errs...)
}

func sortCompact(ps []netip.Prefix) []netip.Prefix {
	sortPrefixes(ps)
	out := ps[:0]
	for i, p := range ps {
		if i == 0 || p != ps[i-1] {
			out = append(out, p)
		}
	}
	return out
}
