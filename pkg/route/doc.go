// Package route keeps the kernel routes and policy rules meshd owns in line
// with a desired set.
//
// Ownership is marked in the kernel itself, so a restarted daemon finds and
// adopts what an earlier run left behind:
//
//   - a route is meshd's when it carries meshd's route protocol number
//     (Options.Protocol, default 109) in a table meshd owns (Options.Table,
//     default 51820, plus every table a desired route named during this
//     process's life);
//   - a policy rule is meshd's when it is a plain "from all lookup T" rule and
//     either points at meshd's table or carries meshd's protocol number (meshd
//     tags the rules it adds with it). Rules are identified by family,
//     priority and table.
//
// Nothing else is ever changed or deleted. [Manager.Set] diffs by full route
// identity (family, table, destination, gateway, source, output interface
// index, protocol, metric) held in a comparable struct of netip values, adds
// before it deletes, replaces in place when a route keeps its kernel slot
// (table, destination, metric) but changes gateway, source or device, and
// performs no netlink write at all when nothing differs. It goes on past a
// failure and returns every failure joined. On a kernel without IPv6 policy
// routing (booted with ipv6.disable=1, or built without
// CONFIG_IPV6_MULTIPLE_TABLES) there are no IPv6 rules: the IPv4 rules are
// managed as anywhere else, and a desired IPv6 rule fails alone, with an
// error that says why.
//
// [Manager.Run] watches rtnetlink route, rule, link and address
// notifications and puts back the last desired set when something else
// changes meshd's routes or rules, or a link they go through changes or
// loses an IPv4 address: the kernel removes, without a route notification,
// the IPv4 routes through a link that goes down or away or loses its last
// IPv4 address.
// The link the kernel chose for a route asked for by gateway alone is read
// back after the route is added while Run watches (one listing of its table,
// only when such routes were added), and remembered while the route is
// missing. While a desired route is missing (its gateway unreachable, its
// device down or absent), a notification of any link or address is followed
// by a retry, at most one per second (the gap doubling to 30 s while the
// retries leave a route missing), so a storm of unrelated notifications
// costs little. netlink v1.3.1 has no rule subscription, so rules are
// watched with a raw rtnetlink socket bound to RTNLGRP_IPV4_RULE and
// RTNLGRP_IPV6_RULE. When the kernel drops the subscription (ENOBUFS after a
// burst), Run resubscribes with exponential back-off and does a full
// resync; it never spins. Every (re)subscription is followed by a full
// resync rather than ListExisting, so nothing changed between two
// subscriptions is missed. A periodic resync is the net behind all that.
// While Run watches, a Set that repeats the last desired set, after a sync
// that left the kernel matching it (no desired route missing) and with no
// relevant notification since, reads nothing from the kernel: at 1,000
// nodes that is a listing of 2,000 to 4,000 routes saved per reconcile.
//
// Besides ordinary routes, a Route may be a blackhole, unreachable or
// prohibit route ([Type]): no gateway, no device. meshd pairs every route into
// the tunnel with an unreachable route to the same destination at a higher
// metric, so a missing route drops the packet instead of letting the lookup
// fall through to the main table. They are owned, diffed, adopted and
// repaired exactly like the others.
//
// All kernel access goes through the narrow [Kernel] interface; [New] binds it
// to real netlink in the caller's network namespace and [FakeKernel] is an
// in-memory stand-in for tests.
//
// [DiscoverUplink] reads the node's default-route interface, its addresses and
// MTU once at start-up, and [LinkExists] whether an interface is there.
//
// Out of scope: which routes and rules meshd wants (pkg/mesh plans them), the
// WireGuard interface itself (pkg/wg) and iptables (pkg/iptables); this
// package imports nothing of meshd or k8s.io.
package route
