package route

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults for Options.
const (
	DefaultProtocol       = 109
	DefaultTable          = 51820
	DefaultRulePriority   = 31000
	DefaultResyncInterval = 30 * time.Second
)

// Route is one route meshd wants. Table 0 means Options.Table. Device is an
// interface name, resolved to its index at every Set (so a recreated
// interface is followed); "" lets the kernel choose the device by Gateway.
// Metric 0 on IPv6 is what the kernel calls 1024. A Type other than unicast
// (blackhole, unreachable, prohibit) takes no Gateway, Device or Src.
type Route struct {
	Table   int
	Dst     netip.Prefix
	Gateway netip.Addr
	Device  string
	Src     netip.Addr
	Metric  int
	Type    Type
}

// Rule is one policy rule "from all lookup Table" at Priority. Priority 0
// means DefaultRulePriority, Table 0 means Options.Table.
type Rule struct {
	Priority int
	Table    int
	IPv6     bool
}

// Options configure a Manager. Zero values take the defaults.
type Options struct {
	Protocol int          // route protocol number marking meshd's routes; default 109
	Table    int          // the table meshd owns; default 51820
	Logger   *slog.Logger // default: discard
	// ResyncInterval is how often Run re-applies the desired set even when
	// no notification arrived; default 30s.
	ResyncInterval time.Duration
}

// Manager owns meshd's routes and rules. Its methods are safe for
// concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger
	k    Kernel

	mu           sync.Mutex
	haveDesired  bool
	routes       []Route
	rules        []Rule
	tables       map[int]bool         // tables whose protocol-marked routes are ours
	routeState   map[KernelRoute]bool // our routes in the kernel after the last sync (never mutated once stored)
	ruleState    map[KernelRule]bool  // ids of our rules in the kernel after the last sync (idem)
	desiredRules map[KernelRule]bool  // ids of the desired rules (idem)
	// chosenLinks is, for each desired route whose device the kernel
	// chooses (keyed without it), the link it was last seen through: the
	// link to watch while the route is missing.
	chosenLinks map[KernelRoute]int
	// routeLinks are the links of the routes, desired or in the kernel,
	// after the last sync (never mutated once stored); routesMissing says
	// that the sync left a desired route out of the kernel (or does not
	// know: a listing failed).
	routeLinks    map[int]bool
	routesMissing bool

	// view is what the last sync left, for Run to judge notifications by
	// without waiting for a Set in progress.
	view atomic.Pointer[view]

	writes       atomic.Uint64
	applied      atomic.Uint64 // writes the kernel took (a repair is one that wrote)
	resubscribes atomic.Uint64
	syncs        atomic.Uint64
	skips        atomic.Uint64
	close        func() error

	// watching is true while Run watches the kernel's notifications;
	// changes counts the notifications that may mean the kernel no longer
	// matches (and every loss of the watch). clean is changes+1 as read at
	// the start of the last sync that left the kernel matching the desired
	// set while watching (0: none since): while it still holds, a Set of
	// the same set has nothing to do.
	watching atomic.Bool
	changes  atomic.Uint64
	clean    uint64
}

// view is an immutable snapshot of the Manager's state after a sync.
type view struct {
	haveDesired  bool
	tables       map[int]bool
	routes       map[KernelRoute]bool
	rules        map[KernelRule]bool
	desiredRules map[KernelRule]bool
	links        map[int]bool // the links our routes go, or would go, through
	// missing: a desired route is not in the kernel (not addable at the
	// last sync: its device down, its gateway unreachable), or a listing
	// failed.
	missing bool
}

// NewWithKernel returns a Manager working through k.
func NewWithKernel(opts Options, k Kernel) *Manager {
	if opts.Protocol == 0 {
		opts.Protocol = DefaultProtocol
	}
	if opts.Table == 0 {
		opts.Table = DefaultTable
	}
	if opts.ResyncInterval <= 0 {
		opts.ResyncInterval = DefaultResyncInterval
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{
		opts:   opts,
		log:    log.With("component", "route"),
		k:      k,
		tables: map[int]bool{opts.Table: true},
	}
}

// Writes is the number of netlink writes (route and rule add, replace and
// delete requests, failed ones included) made so far.
func (m *Manager) Writes() uint64 { return m.writes.Load() }

// Resubscribes is how many times Run had to subscribe again after the
// kernel dropped its subscription or subscribing failed.
func (m *Manager) Resubscribes() uint64 { return m.resubscribes.Load() }

// Close releases the netlink handle of a Manager made by New. It does not
// remove anything from the kernel (see Cleanup).
func (m *Manager) Close() error {
	if m.close == nil {
		return nil
	}
	return m.close()
}

// Set makes meshd's routes and rules exactly routes and rules. It is
// idempotent: when the kernel already matches it makes no write. It goes on
// past failures and returns them all joined; the next Set (or a repair by
// Run) retries only what is still missing or stale.
func (m *Manager) Set(routes []Route, rules []Rule) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.haveDesired && m.clean == m.changes.Load()+1 && slices.Equal(m.routes, routes) && slices.Equal(m.rules, rules) {
		m.skips.Add(1)
		return nil // unchanged, and Run saw nothing change in the kernel
	}
	m.routes = slices.Clone(routes)
	m.rules = slices.Clone(rules)
	m.haveDesired = true
	return m.syncLocked()
}

// Cleanup removes every route and rule meshd owns and forgets the desired
// set, so Run stops repairing until the next Set.
func (m *Manager) Cleanup() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.routes, m.rules, m.haveDesired = nil, nil, false
	return m.syncLocked()
}

// resync re-applies the last desired set; it reports whether it wrote
// something the kernel took (a retry whose add fails again changed
// nothing: no repair to report).
func (m *Manager) resync() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.haveDesired {
		return false, nil
	}
	before := m.applied.Load()
	err := m.syncLocked()
	return m.applied.Load() != before, err
}

func (m *Manager) write(what string, obj fmt.Stringer, f func() error) error {
	m.writes.Add(1)
	if err := f(); err != nil {
		return fmt.Errorf("%s %s: %w", what, obj, err)
	}
	m.applied.Add(1)
	m.log.Debug(what, "obj", obj.String())
	return nil
}

func (m *Manager) syncLocked() error {
	m.syncs.Add(1)
	start := m.changes.Load()
	var errs []error
	errs = append(errs, m.syncRoutes()...)
	errs = append(errs, m.syncRules()...)
	m.view.Store(&view{
		haveDesired:  m.haveDesired,
		tables:       maps.Clone(m.tables),
		routes:       m.routeState,
		rules:        m.ruleState,
		desiredRules: m.desiredRules,
		links:        m.routeLinks,
		missing:      m.routesMissing,
	})
	m.clean = 0
	if len(errs) == 0 && !m.routesMissing && m.watching.Load() {
		m.clean = start + 1
	}
	return errors.Join(errs...)
}

// desiredRouteKeys turns the desired routes into kernel identities,
// resolving device names once each; unresolved says that a device was not
// found (it may come: a link notification is worth a retry).
func (m *Manager) desiredRouteKeys() (want map[KernelRoute]bool, unresolved bool, errs []error) {
	want = make(map[KernelRoute]bool, len(m.routes))
	links := map[string]int{}
	linkErrs := map[string]error{}
	for _, r := range m.routes {
		k, err := m.routeKey(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %s: %w", r.Dst, err))
			continue
		}
		if r.Device != "" {
			idx, ok := links[r.Device]
			if !ok {
				if err, seen := linkErrs[r.Device]; seen {
					errs = append(errs, fmt.Errorf("route %s: resolve device %q: %w", r.Dst, r.Device, err))
					continue
				}
				idx, err = m.k.LinkIndex(r.Device)
				if err != nil {
					unresolved = true
					linkErrs[r.Device] = err
					errs = append(errs, fmt.Errorf("route %s: resolve device %q: %w", r.Dst, r.Device, err))
					continue
				}
				links[r.Device] = idx
			}
			k.LinkIndex = idx
		}
		m.tables[k.Table] = true
		want[k] = true
	}
	return want, unresolved, errs
}

// routeKey validates and normalizes r (without its device).
func (m *Manager) routeKey(r Route) (KernelRoute, error) {
	if !r.Dst.IsValid() {
		return KernelRoute{}, errors.New("invalid destination")
	}
	addr, bits := r.Dst.Addr(), r.Dst.Bits()
	if addr.Is4In6() {
		addr, bits = addr.Unmap(), bits-96
	}
	dst := netip.PrefixFrom(addr.WithZone(""), bits)
	if !dst.IsValid() {
		return KernelRoute{}, errors.New("invalid destination")
	}
	dst = dst.Masked()
	k := KernelRoute{
		Family:   FamilyV4,
		Table:    r.Table,
		Dst:      dst,
		Protocol: m.opts.Protocol,
		Metric:   r.Metric,
		Type:     r.Type,
	}
	if !r.Type.valid() {
		return KernelRoute{}, fmt.Errorf("unsupported route %s", r.Type)
	}
	if r.Type != TypeUnicast && (r.Gateway.IsValid() || r.Device != "" || r.Src.IsValid()) {
		return KernelRoute{}, fmt.Errorf("a %s route takes no gateway, device or source", r.Type)
	}
	if dst.Addr().Is6() {
		k.Family = FamilyV6
		if k.Metric == 0 {
			k.Metric = 1024
		}
	}
	if k.Table == 0 {
		k.Table = m.opts.Table
	}
	if k.Table < 0 || k.Metric < 0 {
		return KernelRoute{}, errors.New("negative table or metric")
	}
	if r.Gateway.IsValid() {
		k.Gateway = r.Gateway.Unmap().WithZone("")
		if k.Gateway.Is6() != dst.Addr().Is6() {
			return KernelRoute{}, fmt.Errorf("gateway %s is not in the destination's family", r.Gateway)
		}
	}
	if r.Src.IsValid() {
		k.Src = r.Src.Unmap().WithZone("")
		if k.Src.Is6() != dst.Addr().Is6() {
			return KernelRoute{}, fmt.Errorf("source %s is not in the destination's family", r.Src)
		}
	}
	if r.Type == TypeUnicast && r.Device == "" && !k.Gateway.IsValid() {
		return KernelRoute{}, errors.New("neither device nor gateway")
	}
	return k, nil
}

// sortedRoutes returns the routes of set for which keep is true, in a
// stable order (only what changes is sorted: an unchanged Set sorts nothing).
func sortedRoutes(set map[KernelRoute]bool, keep func(KernelRoute) bool) []KernelRoute {
	var out []KernelRoute
	for r := range set {
		if keep(r) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b KernelRoute) int {
		return cmp.Or(cmp.Compare(a.Table, b.Table), a.Dst.Addr().Compare(b.Dst.Addr()),
			cmp.Compare(a.Dst.Bits(), b.Dst.Bits()), cmp.Compare(a.Metric, b.Metric),
			a.Gateway.Compare(b.Gateway), cmp.Compare(a.LinkIndex, b.LinkIndex), a.Src.Compare(b.Src), cmp.Compare(a.Type, b.Type))
	})
	return out
}

func (m *Manager) syncRoutes() []error {
	want, unresolved, errs := m.desiredRouteKeys()
	chosen := map[KernelRoute]bool{} // desired routes whose device the kernel chooses
	for r := range want {
		if r.LinkIndex == 0 && r.Type == TypeUnicast {
			chosen[r] = true
		}
	}
	have, err := m.ownedRoutes()
	if err != nil {
		// Without knowing what is there, writing could only guess.
		m.routesMissing = true
		return append(errs, err)
	}
	matchAnyLink(want, have)
	var added []KernelRoute // added or replaced, the kernel choosing the device

	stale := map[slot]KernelRoute{}
	for h := range have {
		if !want[h] {
			stale[h.slot()] = h
		}
	}

	// Add (or replace in place) first, then delete.
	for _, r := range sortedRoutes(want, func(r KernelRoute) bool { return !have[r] }) {
		if old, ok := stale[r.slot()]; ok {
			err := m.write("replace route", r, func() error { return m.k.ReplaceRoute(r) })
			if err != nil {
				errs = append(errs, err)
				continue
			}
			delete(stale, r.slot())
			delete(have, old)
			have[r] = true
			if chosen[r] {
				added = append(added, r)
			}
			continue
		}
		if err := m.write("add route", r, func() error { return m.k.AddRoute(r) }); err != nil {
			errs = append(errs, err)
			continue
		}
		have[r] = true
		if chosen[r] {
			added = append(added, r)
		}
	}
	for _, r := range sortedRoutes(have, func(r KernelRoute) bool { return !want[r] }) {
		if err := m.write("delete route", r, func() error { return m.k.DelRoute(r) }); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(have, r)
	}
	learnErr := m.learnLinks(added, want, have)
	if learnErr != nil {
		errs = append(errs, learnErr)
	}
	m.routeState = have
	m.noteRoutes(chosen, want, have)
	// A device that is not there yet, or a link not read back, may be
	// what a link notification is about.
	m.routesMissing = m.routesMissing || unresolved || learnErr != nil
	return errs
}

// learnLinks reads back from the kernel the routes just added without a
// device, so that what the sync leaves records the link the kernel chose
// for each: the link whose notifications tell Run that the kernel may have
// dropped the route. It lists only the tables those routes are in, only
// when there are some, and only while Run watches (Run starts with a full
// resync, which reads them back anyway): an unchanged Set lists nothing
// more.
func (m *Manager) learnLinks(added []KernelRoute, want, have map[KernelRoute]bool) error {
	if len(added) == 0 || !m.watching.Load() {
		return nil
	}
	tables := map[int]bool{}
	for _, r := range added {
		tables[r.Table] = true
	}
	var errs []error
	for _, t := range slices.Sorted(maps.Keys(tables)) {
		rs, err := m.k.ListRoutes(t, m.opts.Protocol)
		if err != nil {
			errs = append(errs, fmt.Errorf("list routes of table %d: %w", t, err))
			continue
		}
		inKernel := make(map[KernelRoute]KernelRoute, len(rs))
		for _, h := range rs {
			z := h
			z.LinkIndex = 0
			inKernel[z] = h
		}
		for _, r := range added {
			if r.Table != t {
				continue
			}
			delete(have, r)
			if h, ok := inKernel[r]; ok {
				delete(want, r)
				want[h], have[h] = true, true
			} // else gone already: missing, and repaired as such
		}
	}
	return errors.Join(errs...)
}

// noteRoutes records, after a sync, the links of the routes desired and in
// the kernel, and whether a desired route is missing.
func (m *Manager) noteRoutes(chosen, want, have map[KernelRoute]bool) {
	links := map[int]bool{}
	chosenLinks := make(map[KernelRoute]int, len(chosen))
	missing := false
	for r := range want {
		missing = missing || !have[r]
	}
	for _, set := range []map[KernelRoute]bool{want, have} {
		for r := range set {
			if r.LinkIndex != 0 {
				links[r.LinkIndex] = true
			}
			if r.LinkIndex != 0 && r.Type == TypeUnicast {
				z := r
				z.LinkIndex = 0
				if chosen[z] {
					chosenLinks[z] = r.LinkIndex
				}
			}
		}
	}
	for z := range chosen {
		if _, ok := chosenLinks[z]; !ok {
			if idx, ok := m.chosenLinks[z]; ok {
				chosenLinks[z] = idx // not in the kernel now: watch where it was
				links[idx] = true
			}
		}
	}
	m.chosenLinks, m.routeLinks, m.routesMissing = chosenLinks, links, missing
}

// ownedRoutes lists meshd's routes (its protocol) in the tables it owns.
func (m *Manager) ownedRoutes() (map[KernelRoute]bool, error) {
	have := map[KernelRoute]bool{}
	tables := make([]int, 0, len(m.tables))
	for t := range m.tables {
		tables = append(tables, t)
	}
	slices.Sort(tables)
	for _, t := range tables {
		rs, err := m.k.ListRoutes(t, m.opts.Protocol)
		if err != nil {
			return nil, fmt.Errorf("list routes of table %d: %w", t, err)
		}
		for _, r := range rs {
			have[r] = true
		}
	}
	return have, nil
}

// matchAnyLink makes a desired route without device (want) match the
// kernel's route (have) whatever interface the kernel chose for it.
func matchAnyLink(want, have map[KernelRoute]bool) {
	var anyLink map[KernelRoute]KernelRoute
	for r := range want {
		if r.LinkIndex != 0 || have[r] {
			continue
		}
		if anyLink == nil {
			anyLink = map[KernelRoute]KernelRoute{}
			for h := range have {
				w := h
				w.LinkIndex = 0
				anyLink[w] = h
			}
		}
		if h, ok := anyLink[r]; ok {
			delete(want, r)
			want[h] = true
		}
	}
}

func (m *Manager) ownsRule(r KernelRule) bool {
	return r.Protocol == m.opts.Protocol || r.Table == m.opts.Table
}

func (m *Manager) syncRules() []error {
	var errs []error
	want := map[KernelRule]bool{}
	for _, r := range m.rules {
		k := KernelRule{Family: FamilyV4, Priority: r.Priority, Table: r.Table}
		if r.IPv6 {
			k.Family = FamilyV6
		}
		if k.Priority == 0 {
			k.Priority = DefaultRulePriority
		}
		if k.Table == 0 {
			k.Table = m.opts.Table
		}
		if k.Priority < 0 || k.Table < 0 {
			errs = append(errs, fmt.Errorf("%s: negative priority or table", k))
			continue
		}
		want[k] = true
	}
	m.desiredRules = want

	list, err := m.k.ListRules()
	if err != nil {
		return append(errs, fmt.Errorf("list rules: %w", err))
	}
	present := map[KernelRule]bool{} // every plain rule, ours or not, by id
	ours := map[KernelRule]KernelRule{}
	for _, r := range list {
		present[r.id()] = true
		if m.ownsRule(r) {
			ours[r.id()] = r
		}
	}
	state := map[KernelRule]bool{}
	for _, id := range sortedRules(want) {
		if present[id] {
			state[id] = true
			continue
		}
		if err := m.addRule(id); err != nil {
			errs = append(errs, err)
			continue
		}
		state[id] = true
	}
	for _, id := range sortedRules(mapKeys(ours)) {
		if want[id] {
			continue
		}
		r := ours[id]
		if err := m.write("delete", r, func() error { return m.k.DelRule(r) }); err != nil {
			errs = append(errs, err)
			state[id] = true
		}
	}
	m.ruleState = state
	return errs
}

// addRule adds the rule with id, tagged with meshd's protocol.
func (m *Manager) addRule(id KernelRule) error {
	r := id
	r.Protocol = m.opts.Protocol
	err := m.write("add", r, func() error { return m.k.AddRule(r) })
	if err != nil && r.Family == FamilyV6 && errors.Is(err, syscall.EAFNOSUPPORT) {
		return fmt.Errorf("%w (this kernel has no IPv6 policy routing: booted with ipv6.disable=1, or built without CONFIG_IPV6_MULTIPLE_TABLES)", err)
	}
	return err
}

func mapKeys[V any](m map[KernelRule]V) map[KernelRule]bool {
	out := make(map[KernelRule]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func sortedRules(set map[KernelRule]bool) []KernelRule {
	out := make([]KernelRule, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b KernelRule) int {
		return cmp.Or(cmp.Compare(a.Family, b.Family), cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.Table, b.Table))
	})
	return out
}
