package route

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// New returns a Manager on real netlink in the network namespace of the
// calling OS thread: the netlink handle and the subscriptions are bound to
// that namespace, so later goroutines (on any thread) still act on it.
// Close releases the handle.
func New(opts Options) (*Manager, error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("get current network namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(unlessCurrentNS(ns), unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("open netlink handle: %w", err)
	}
	k := &netlinkKernel{h: h, ns: ns, rcvBuf: subscriptionBuffer, rcvBufForce: true}
	m := NewWithKernel(opts, k)
	m.close = k.close
	return m, nil
}

// netlinkKernel is the Kernel on real rtnetlink in one namespace.
type netlinkKernel struct {
	h  *netlink.Handle
	ns netns.NsHandle
	// rcvBuf, when not 0, sets the subscription sockets' receive buffer;
	// rcvBufForce sets it beyond net.core.rmem_max (SO_RCVBUFFORCE, needs
	// CAP_NET_ADMIN). Tests make it tiny to provoke ENOBUFS.
	rcvBuf      int
	rcvBufForce bool
}

// subscriptionBuffer is the receive buffer of the subscription sockets: room
// for the notifications of a few thousand route changes in one burst.
const subscriptionBuffer = 4 << 20

func (k *netlinkKernel) close() error {
	k.h.Close()
	return k.ns.Close()
}

// dumpRetries bounds retries of a dump the kernel interrupted (NLM_F_DUMP_INTR).
const dumpRetries = 5

func (k *netlinkKernel) ListRoutes(table, protocol int) ([]KernelRoute, error) {
	filter := &netlink.Route{Table: table, Protocol: netlink.RouteProtocol(protocol)}
	var err error
	for range dumpRetries {
		var out []KernelRoute
		err = k.h.RouteListFilteredIter(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL,
			func(r netlink.Route) bool {
				if kr, ok := fromNetlinkRoute(&r); ok {
					out = append(out, kr)
				}
				return true
			})
		if err == nil {
			return out, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
	}
	return nil, err
}

// fromNetlinkRoute turns a unicast route into its identity.
func fromNetlinkRoute(r *netlink.Route) (KernelRoute, bool) {
	if r.Dst == nil {
		return KernelRoute{}, false
	}
	var typ Type
	switch r.Type {
	case unix.RTN_UNICAST:
	case unix.RTN_BLACKHOLE, unix.RTN_UNREACHABLE, unix.RTN_PROHIBIT:
		typ = Type(r.Type)
	default:
		return KernelRoute{}, false
	}
	kr := KernelRoute{
		Family:    r.Family,
		Table:     r.Table,
		LinkIndex: r.LinkIndex,
		Protocol:  int(r.Protocol),
		Metric:    r.Priority,
		Type:      typ,
	}
	if typ != TypeUnicast {
		// The kernel hangs IPv6 reject routes on lo; they have no device.
		kr.LinkIndex = 0
	}
	addr, ok := netip.AddrFromSlice(r.Dst.IP)
	if !ok {
		return KernelRoute{}, false
	}
	ones, _ := r.Dst.Mask.Size()
	if r.Family == FamilyV4 {
		addr = addr.Unmap()
	}
	kr.Dst = netip.PrefixFrom(addr, ones).Masked()
	if kr.Family == 0 {
		kr.Family = FamilyV4
		if addr.Is6() {
			kr.Family = FamilyV6
		}
	}
	kr.Gateway = ipAddr(r.Gw)
	kr.Src = ipAddr(r.Src)
	return kr, true
}

func ipAddr(ip net.IP) netip.Addr {
	if ip == nil {
		return netip.Addr{}
	}
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	a, _ := netip.AddrFromSlice(ip)
	return a
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func toNetlinkRoute(r KernelRoute) *netlink.Route {
	nr := &netlink.Route{
		Family:    r.Family,
		Table:     r.Table,
		Dst:       ipNet(r.Dst),
		LinkIndex: r.LinkIndex,
		Protocol:  netlink.RouteProtocol(r.Protocol),
		Priority:  r.Metric,
		Type:      unix.RTN_UNICAST,
	}
	if r.Type != TypeUnicast {
		nr.Type = int(r.Type)
		return nr
	}
	if r.Gateway.IsValid() {
		nr.Gw = r.Gateway.AsSlice()
	} else if r.Family == FamilyV4 {
		nr.Scope = netlink.SCOPE_LINK // what `ip route add ... dev X` does
	}
	if r.Src.IsValid() {
		nr.Src = r.Src.AsSlice()
	}
	return nr
}

func (k *netlinkKernel) AddRoute(r KernelRoute) error     { return k.h.RouteAdd(toNetlinkRoute(r)) }
func (k *netlinkKernel) ReplaceRoute(r KernelRoute) error { return k.h.RouteReplace(toNetlinkRoute(r)) }

func (k *netlinkKernel) DelRoute(r KernelRoute) error {
	nr := toNetlinkRoute(r)
	nr.Scope = netlink.SCOPE_NOWHERE // match whatever scope it has
	return k.h.RouteDel(nr)
}

func (k *netlinkKernel) ListRules() ([]KernelRule, error) { return listRules(k.h.RuleList) }

// listRules lists the plain rules of both families with list (a RuleList).
// A kernel without IPv6 policy routing (booted with ipv6.disable=1, or built
// without CONFIG_IPV6_MULTIPLE_TABLES) refuses the IPv6 dump with
// EAFNOSUPPORT: it has no IPv6 rules, and its IPv4 rules are listed all the
// same (adding an IPv6 rule fails there, for that rule alone).
func listRules(list func(family int) ([]netlink.Rule, error)) ([]KernelRule, error) {
	var out []KernelRule
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		var rules []netlink.Rule
		var err error
		for range dumpRetries {
			rules, err = list(fam)
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if fam == netlink.FAMILY_V6 && errors.Is(err, unix.EAFNOSUPPORT) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			if !plainRule(&r) {
				continue
			}
			out = append(out, KernelRule{Family: fam, Priority: r.Priority, Table: r.Table, Protocol: int(r.Protocol)})
		}
	}
	return out, nil
}

// plainRule reports whether r is "from all lookup TABLE" with no other
// selector: the only kind of rule meshd makes or touches.
func plainRule(r *netlink.Rule) bool {
	return r.Table != 0 && r.Src == nil && r.Dst == nil && r.Mark == 0 && r.Mask == nil &&
		r.Tos == 0 && r.TunID == 0 && r.Goto == -1 && r.Flow == -1 && r.IifName == "" &&
		r.OifName == "" && r.SuppressIfgroup == -1 && r.SuppressPrefixlen == -1 && !r.Invert &&
		r.Dport == nil && r.Sport == nil && r.IPProto == 0 && r.UIDRange == nil
}

func toNetlinkRule(r KernelRule) *netlink.Rule {
	nr := netlink.NewRule()
	nr.Family = r.Family
	nr.Priority = r.Priority
	nr.Table = r.Table
	nr.Protocol = uint8(r.Protocol)
	return nr
}

func (k *netlinkKernel) AddRule(r KernelRule) error { return k.h.RuleAdd(toNetlinkRule(r)) }
func (k *netlinkKernel) DelRule(r KernelRule) error { return k.h.RuleDel(toNetlinkRule(r)) }

func (k *netlinkKernel) LinkIndex(name string) (int, error) {
	l, err := k.h.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

// Subscribe merges netlink's route, link and address subscriptions with a
// raw rtnetlink socket for rules (netlink v1.3.1 has no RuleSubscribe). If
// any dies, all are closed and the merged channel is closed.
func (k *netlinkKernel) Subscribe(done <-chan struct{}) (<-chan Event, error) {
	sub := &subscription{stop: make(chan struct{}), out: make(chan Event, 64)}
	routes, err := k.subscribeRoutes(sub)
	if err != nil {
		sub.shutdown()
		return nil, err
	}
	rules, err := k.subscribeRules()
	if err != nil {
		sub.shutdown()
		for range routes {
		}
		return nil, err
	}
	links, err := k.subscribeLinks(sub)
	if err != nil {
		sub.shutdown()
		rules.Close()
		for range routes {
		}
		return nil, err
	}
	addrs, err := k.subscribeAddrs(sub)
	if err != nil {
		sub.shutdown()
		rules.Close()
		for range routes {
		}
		for range links {
		}
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() { sub.pumpRoutes(routes) })
	wg.Go(func() { sub.pumpRules(rules) })
	wg.Go(func() { sub.pumpLinks(links) })
	wg.Go(func() { sub.pumpAddrs(addrs) })
	go func() {
		select {
		case <-done:
			sub.shutdown()
		case <-sub.stop:
		}
		rules.Close()
	}()
	go func() {
		wg.Wait()
		close(sub.out)
	}()
	return sub.out, nil
}

// subscription is one merged route, rule, link and address subscription:
// out carries its events until stop is closed.
type subscription struct {
	stop chan struct{}
	once sync.Once
	out  chan Event
}

func (s *subscription) shutdown() { s.once.Do(func() { close(s.stop) }) }

func (s *subscription) send(ev Event) {
	select {
	case s.out <- ev:
	case <-s.stop:
	}
}

// subscribeNS is the namespace option of a netlink subscription: nil for
// this namespace (subscribed without entering it).
func (k *netlinkKernel) subscribeNS() *netns.NsHandle {
	if ns := unlessCurrentNS(k.ns); ns.IsOpen() {
		return &ns
	}
	return nil
}

// subscribeRoutes subscribes to route notifications, closed with s.stop.
func (k *netlinkKernel) subscribeRoutes(s *subscription) (chan netlink.RouteUpdate, error) {
	routes := make(chan netlink.RouteUpdate, 256)
	err := netlink.RouteSubscribeWithOptions(routes, s.stop, netlink.RouteSubscribeOptions{
		Namespace:              k.subscribeNS(),
		ReceiveBufferSize:      k.rcvBuf,
		ReceiveBufferForceSize: k.rcvBufForce,
		ErrorCallback:          func(err error) { s.send(Event{Err: fmt.Errorf("route notifications: %w", err)}) },
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to route notifications: %w", err)
	}
	return routes, nil
}

// subscribeLinks subscribes to link notifications, closed with s.stop.
func (k *netlinkKernel) subscribeLinks(s *subscription) (chan netlink.LinkUpdate, error) {
	links := make(chan netlink.LinkUpdate, 64)
	err := netlink.LinkSubscribeWithOptions(links, s.stop, netlink.LinkSubscribeOptions{
		Namespace:              k.subscribeNS(),
		ReceiveBufferSize:      k.rcvBuf,
		ReceiveBufferForceSize: k.rcvBufForce,
		ErrorCallback:          func(err error) { s.send(Event{Err: fmt.Errorf("link notifications: %w", err)}) },
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to link notifications: %w", err)
	}
	return links, nil
}

// pumpLinks forwards link notifications until the subscription ends.
func (s *subscription) pumpLinks(links <-chan netlink.LinkUpdate) {
	defer s.shutdown()
	for u := range links {
		s.send(Event{Link: &LinkEvent{Index: int(u.Index), Deleted: u.Header.Type == unix.RTM_DELLINK}})
	}
}

// subscribeAddrs subscribes to address notifications (both families),
// closed with s.stop.
func (k *netlinkKernel) subscribeAddrs(s *subscription) (chan netlink.AddrUpdate, error) {
	addrs := make(chan netlink.AddrUpdate, 64)
	err := netlink.AddrSubscribeWithOptions(addrs, s.stop, netlink.AddrSubscribeOptions{
		Namespace:              k.subscribeNS(),
		ReceiveBufferSize:      k.rcvBuf,
		ReceiveBufferForceSize: k.rcvBufForce,
		ErrorCallback:          func(err error) { s.send(Event{Err: fmt.Errorf("address notifications: %w", err)}) },
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to address notifications: %w", err)
	}
	return addrs, nil
}

// pumpAddrs forwards address notifications until the subscription ends.
func (s *subscription) pumpAddrs(addrs <-chan netlink.AddrUpdate) {
	defer s.shutdown()
	for u := range addrs {
		if a := ipAddr(u.LinkAddress.IP); a.IsValid() {
			s.send(Event{Addr: &AddrEvent{LinkIndex: u.LinkIndex, Addr: a, Deleted: !u.NewAddr}})
		}
	}
}

// subscribeRules opens a raw rtnetlink socket on the rule groups.
func (k *netlinkKernel) subscribeRules() (*nl.NetlinkSocket, error) {
	rules, err := nl.SubscribeAt(unlessCurrentNS(k.ns), netns.None(), unix.NETLINK_ROUTE, unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE)
	if err == nil && k.rcvBuf != 0 {
		if err = rules.SetReceiveBufferSize(k.rcvBuf, k.rcvBufForce); err != nil {
			rules.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("subscribe to rule notifications: %w", err)
	}
	return rules, nil
}

// pumpRoutes forwards route notifications until the subscription ends.
func (s *subscription) pumpRoutes(routes <-chan netlink.RouteUpdate) {
	defer s.shutdown()
	for u := range routes {
		if u.Type != unix.RTM_NEWROUTE && u.Type != unix.RTM_DELROUTE {
			continue
		}
		if r, ok := fromNetlinkRoute(&u.Route); ok {
			s.send(Event{Route: &r, Deleted: u.Type == unix.RTM_DELROUTE})
		}
	}
}

// pumpRules forwards rule notifications until the socket fails or closes.
func (s *subscription) pumpRules(rules *nl.NetlinkSocket) {
	defer s.shutdown()
	for {
		msgs, _, err := rules.Receive()
		if err != nil {
			select {
			case <-s.stop:
			default:
				s.send(Event{Err: fmt.Errorf("rule notifications: %w", err)})
			}
			return
		}
		for _, msg := range msgs {
			if msg.Header.Type != unix.RTM_NEWRULE && msg.Header.Type != unix.RTM_DELRULE {
				continue
			}
			if r, ok := parseRuleMsg(msg.Data); ok {
				s.send(Event{Rule: &r, Deleted: msg.Header.Type == unix.RTM_DELRULE})
			}
		}
	}
}

// parseRuleMsg decodes a plain rule from an RTM_NEWRULE/RTM_DELRULE payload
// (struct fib_rule_hdr and attributes).
func parseRuleMsg(b []byte) (KernelRule, bool) {
	const hdrLen = 12 // family, dst_len, src_len, tos, table, res1, res2, action, flags(4)
	if len(b) < hdrLen {
		return KernelRule{}, false
	}
	if b[1] != 0 || b[2] != 0 || b[3] != 0 || b[7] != nl.FR_ACT_TO_TBL {
		return KernelRule{}, false
	}
	r := KernelRule{Family: int(b[0]), Table: int(b[4])}
	attrs, err := nl.ParseRouteAttr(b[hdrLen:])
	if err != nil {
		return KernelRule{}, false
	}
	for _, a := range attrs {
		switch a.Attr.Type {
		case nl.FRA_PRIORITY:
			if len(a.Value) >= 4 {
				r.Priority = int(binary.NativeEndian.Uint32(a.Value))
			}
		case nl.FRA_TABLE:
			if len(a.Value) >= 4 {
				r.Table = int(binary.NativeEndian.Uint32(a.Value))
			}
		case nl.FRA_PROTOCOL:
			if len(a.Value) >= 1 {
				r.Protocol = int(a.Value[0])
			}
		case nl.FRA_SUPPRESS_PREFIXLEN, nl.FRA_SUPPRESS_IFGROUP:
			if len(a.Value) >= 4 && binary.NativeEndian.Uint32(a.Value) != 0xffffffff {
				return KernelRule{}, false
			}
		case nl.FRA_IIFNAME, nl.FRA_OIFNAME, nl.FRA_FWMARK, nl.FRA_FWMASK, nl.FRA_GOTO, nl.FRA_FLOW,
			nl.FRA_TUN_ID, nl.FRA_UID_RANGE, nl.FRA_IP_PROTO, nl.FRA_SPORT_RANGE, nl.FRA_DPORT_RANGE, nl.FRA_L3MDEV:
			return KernelRule{}, false
		}
	}
	return r, r.Table != 0
}
