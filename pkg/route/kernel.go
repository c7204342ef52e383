package route

import (
	"fmt"
	"net/netip"
	"strings"
)

// Address families as the kernel numbers them (AF_INET, AF_INET6).
const (
	FamilyV4 = 2
	FamilyV6 = 10
)

// KernelRoute is the full identity of one route: two routes are the same
// route exactly when their KernelRoutes are equal (it is comparable and used
// as a map key).
type KernelRoute struct {
	Family    int // FamilyV4 or FamilyV6
	Table     int
	Dst       netip.Prefix // masked
	Gateway   netip.Addr   // invalid: no gateway
	Src       netip.Addr   // preferred source; invalid: none
	LinkIndex int          // output interface; 0 only in a request: let the kernel choose by gateway
	Protocol  int
	Metric    int // IPv6: 0 is stored by the kernel as 1024, so meshd asks for 1024
	Type      Type
}

// Type is a route's type. The zero value is an ordinary (unicast) route; the
// others drop what they match and have neither gateway nor device (meshd
// uses them to fail closed: a tunnelled destination whose route is missing
// is dropped, never sent out of the underlay).
type Type int

// Route types, numbered as the kernel does (RTN_*), unicast excepted.
const (
	TypeUnicast     Type = 0
	TypeBlackhole   Type = 6 // RTN_BLACKHOLE: dropped silently
	TypeUnreachable Type = 7 // RTN_UNREACHABLE: dropped, ICMP host unreachable to the sender
	TypeProhibit    Type = 8 // RTN_PROHIBIT: dropped, ICMP administratively prohibited
)

func (t Type) String() string {
	switch t {
	case TypeUnicast:
		return "unicast"
	case TypeBlackhole:
		return "blackhole"
	case TypeUnreachable:
		return "unreachable"
	case TypeProhibit:
		return "prohibit"
	}
	return fmt.Sprintf("type %d", int(t))
}

// valid reports whether t is one of the supported types.
func (t Type) valid() bool {
	switch t {
	case TypeUnicast, TypeBlackhole, TypeUnreachable, TypeProhibit:
		return true
	}
	return false
}

func (r KernelRoute) String() string {
	var b strings.Builder
	if r.Type != TypeUnicast {
		fmt.Fprintf(&b, "%s ", r.Type)
	}
	fmt.Fprintf(&b, "%s table %d", r.Dst, r.Table)
	if r.Gateway.IsValid() {
		fmt.Fprintf(&b, " via %s", r.Gateway)
	}
	if r.LinkIndex != 0 {
		fmt.Fprintf(&b, " ifindex %d", r.LinkIndex)
	}
	if r.Src.IsValid() {
		fmt.Fprintf(&b, " src %s", r.Src)
	}
	fmt.Fprintf(&b, " proto %d metric %d", r.Protocol, r.Metric)
	return b.String()
}

// slot is where the kernel keeps one route: a second route in the same slot
// is refused (EEXIST), so a route that only changes gateway, source or
// device is replaced in place rather than added then deleted.
type slot struct {
	family, table, metric int
	dst                   netip.Prefix
}

func (r KernelRoute) slot() slot {
	return slot{family: r.Family, table: r.Table, metric: r.Metric, dst: r.Dst}
}

// KernelRule is one plain policy rule ("from all lookup Table", no other
// selector). Its identity is Family, Priority and Table; Protocol is the
// rule's originator tag (FRA_PROTOCOL), meshd's mark on rules it adds.
type KernelRule struct {
	Family   int
	Priority int
	Table    int
	Protocol int
}

func (r KernelRule) id() KernelRule {
	r.Protocol = 0
	return r
}

func (r KernelRule) String() string {
	fam := "ipv4"
	if r.Family == FamilyV6 {
		fam = "ipv6"
	}
	return fmt.Sprintf("%s rule pref %d lookup %d proto %d", fam, r.Priority, r.Table, r.Protocol)
}

// Event is one notification from a [Kernel] subscription.
type Event struct {
	// Route is set for a route notification, Rule for a rule notification,
	// Link for a link notification, Addr for an address notification.
	Route *KernelRoute
	Rule  *KernelRule
	Link  *LinkEvent
	Addr  *AddrEvent
	// Deleted is true for RTM_DELROUTE / RTM_DELRULE.
	Deleted bool
	// Err reports that notifications may have been lost (a receive error,
	// an interrupted dump): the watcher resyncs. The subscription itself is
	// dead only when its channel closes.
	Err error
}

// LinkEvent is a link notification: an interface was added, changed (up,
// down) or removed. The kernel removes the IPv4 routes through a link that
// goes down or away without a route notification; a link event on a link
// meshd's routes use is how the Manager learns of that.
type LinkEvent struct {
	Index   int
	Deleted bool // RTM_DELLINK
}

// AddrEvent is an address notification: an address was added to or
// removed from an interface. The kernel removes the IPv4 routes through a
// link that loses its last IPv4 address (a DHCP client re-applying its
// lease) without a route notification; an address added may let a route
// that could not be added (its gateway unreachable) be added now.
type AddrEvent struct {
	LinkIndex int
	Addr      netip.Addr
	Deleted   bool // RTM_DELADDR
}

// Kernel is the seam between the Manager and the kernel's routing state.
// Implementations must be safe for concurrent use.
type Kernel interface {
	// ListRoutes lists the routes of one table carrying one protocol, both
	// families.
	ListRoutes(table, protocol int) ([]KernelRoute, error)
	AddRoute(KernelRoute) error     // fails with EEXIST when the slot is taken
	ReplaceRoute(KernelRoute) error // replaces the route in the same slot
	DelRoute(KernelRoute) error
	// ListRules lists the plain rules of both families; rules with any
	// other selector or action are left out. A kernel without IPv6 policy
	// routing (ipv6.disable=1, or no CONFIG_IPV6_MULTIPLE_TABLES) has no
	// IPv6 rules: its IPv4 rules are listed all the same.
	ListRules() ([]KernelRule, error)
	AddRule(KernelRule) error
	DelRule(KernelRule) error
	// LinkIndex resolves an interface name.
	LinkIndex(name string) (int, error)
	// Subscribe starts route, rule, link and address notifications. The channel is closed
	// when the subscription dies (the kernel dropped it, e.g. ENOBUFS) or
	// done is closed; the caller must then resubscribe.
	Subscribe(done <-chan struct{}) (<-chan Event, error)
}
