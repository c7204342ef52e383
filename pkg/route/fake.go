package route

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"syscall"
)

// FakeKernel is an in-memory Kernel for tests. It keeps the kernel's rules
// that matter to meshd: one route per slot (family, table, destination,
// metric) with EEXIST on a second add, replace in place, exact-match delete,
// ENODEV for unknown interfaces, ENETDOWN for a link that is down,
// ENETUNREACH for a gateway on no connected network of a link that is up,
// plain rules with EEXIST on duplicates. Each change is announced to
// subscribers, except the IPv4 routes the kernel removes silently (see
// DelLink, SetLinkUp, DelAddr); a subscriber whose buffer is full is dropped
// (its channel closed), as the kernel does on ENOBUFS; DropSubscriptions
// does the same on demand.
type FakeKernel struct {
	mu        sync.Mutex
	routes    map[KernelRoute]bool
	rules     map[KernelRule]bool
	links     map[string]int
	down      map[int]bool
	connected map[netip.Prefix]int // for choosing the device of a gateway route
	addrs     map[netip.Addr]int   // the connected prefixes' addresses
	nextLink  int
	noV6Rules bool
	subs      map[*fakeSub]bool
	writes    uint64
	subscribe int
	lists     int

	failFn       func(op string, obj any) error
	subscribeErr error
}

type fakeSub struct {
	ch   chan Event
	once sync.Once
}

func (s *fakeSub) close() { s.once.Do(func() { close(s.ch) }) }

// NewFakeKernel returns an empty FakeKernel.
func NewFakeKernel() *FakeKernel {
	return &FakeKernel{
		routes:    map[KernelRoute]bool{},
		rules:     map[KernelRule]bool{},
		links:     map[string]int{},
		down:      map[int]bool{},
		connected: map[netip.Prefix]int{},
		addrs:     map[netip.Addr]int{},
		nextLink:  2,
		subs:      map[*fakeSub]bool{},
	}
}

// SetFail installs a hook asked before every write: op is "add route",
// "replace route", "delete route", "add rule" or "delete rule", obj the
// KernelRoute or KernelRule; a non-nil error fails the write (it still
// counts as a write). nil removes the hook.
func (f *FakeKernel) SetFail(fn func(op string, obj any) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failFn = fn
}

// SetSubscribeErr makes Subscribe fail with err (nil: succeed again).
func (f *FakeKernel) SetSubscribeErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subscribeErr = err
}

// DisableIPv6Rules makes f a kernel without IPv6 policy routing (booted
// with ipv6.disable=1, or built without CONFIG_IPV6_MULTIPLE_TABLES):
// ListRules lists IPv4 rules only, as the real Kernel does there, and adding
// or deleting an IPv6 rule fails with EAFNOSUPPORT.
func (f *FakeKernel) DisableIPv6Rules() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noV6Rules = true
	for r := range f.rules {
		if r.Family == FamilyV6 {
			delete(f.rules, r)
		}
	}
}

// AddLink creates an interface, up (a new index each time), notifies it and
// returns its index; the prefixes are its addresses, whose networks are
// connected.
func (f *FakeKernel) AddLink(name string, addrs ...netip.Prefix) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx := f.nextLink
	f.nextLink++
	f.links[name] = idx
	for _, p := range addrs {
		f.connected[p.Masked()] = idx
		f.addrs[p.Addr()] = idx
	}
	f.notifyLocked(Event{Link: &LinkEvent{Index: idx}})
	return idx
}

// SetLinkUp sets an interface up or down and notifies it. As the kernel
// does, down removes the routes through it: the IPv4 ones silently, the
// IPv6 ones with a notification.
func (f *FakeKernel) SetLinkUp(name string, up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx, ok := f.links[name]
	if !ok {
		return
	}
	f.down[idx] = !up
	if !up {
		for r := range f.routes {
			if r.LinkIndex != idx {
				continue
			}
			delete(f.routes, r)
			if r.Family == FamilyV6 {
				f.notifyLocked(Event{Route: &r, Deleted: true})
			}
		}
	}
	f.notifyLocked(Event{Link: &LinkEvent{Index: idx}})
}

// AddAddr adds an address to an interface (its network becomes connected)
// and notifies it.
func (f *FakeKernel) AddAddr(name string, p netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx, ok := f.links[name]
	if !ok {
		return
	}
	f.connected[p.Masked()] = idx
	f.addrs[p.Addr()] = idx
	f.notifyLocked(Event{Addr: &AddrEvent{LinkIndex: idx, Addr: p.Addr()}})
}

// DelAddr removes an address from an interface and notifies that alone:
// when it was the link's last IPv4 address, it removes every IPv4 route
// through the link silently, as the kernel does.
func (f *FakeKernel) DelAddr(name string, p netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx, ok := f.links[name]
	if !ok || f.addrs[p.Addr()] != idx {
		return
	}
	delete(f.addrs, p.Addr())
	delete(f.connected, p.Masked())
	lastV4 := p.Addr().Is4()
	for a, i := range f.addrs {
		if i == idx && a.Is4() {
			lastV4 = false
		}
	}
	for r := range f.routes {
		if lastV4 && r.Family == FamilyV4 && r.LinkIndex == idx {
			delete(f.routes, r)
		}
	}
	f.notifyLocked(Event{Addr: &AddrEvent{LinkIndex: idx, Addr: p.Addr(), Deleted: true}})
}

// DelLink removes an interface and, silently as the kernel does for IPv4,
// every route through it; subscribers get the link notification only.
func (f *FakeKernel) DelLink(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx := f.links[name]
	delete(f.links, name)
	delete(f.down, idx)
	for p, i := range f.connected {
		if i == idx {
			delete(f.connected, p)
		}
	}
	for a, i := range f.addrs {
		if i == idx {
			delete(f.addrs, a)
		}
	}
	for r := range f.routes {
		if r.LinkIndex == idx {
			delete(f.routes, r)
		}
	}
	f.notifyLocked(Event{Link: &LinkEvent{Index: idx, Deleted: true}})
}

// Lists counts calls to ListRoutes.
func (f *FakeKernel) Lists() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists
}

// Routes returns every route of every table and protocol.
func (f *FakeKernel) Routes() map[KernelRoute]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.routes)
}

// Rules returns every rule.
func (f *FakeKernel) Rules() map[KernelRule]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.rules)
}

// Writes counts the writes the fake was asked for, failed ones included.
func (f *FakeKernel) Writes() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

// Subscribes counts calls to Subscribe.
func (f *FakeKernel) Subscribes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subscribe
}

// DropSubscriptions closes every subscription, as the kernel does on
// overrun.
func (f *FakeKernel) DropSubscriptions() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		delete(f.subs, s)
		s.close()
	}
}

// Notify sends ev to every subscriber (for instance an Err event).
func (f *FakeKernel) Notify(ev Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notifyLocked(ev)
}

func (f *FakeKernel) notifyLocked(ev Event) {
	for s := range f.subs {
		select {
		case s.ch <- ev:
		default: // overrun: the kernel drops the listener
			delete(f.subs, s)
			s.close()
		}
	}
}

func (f *FakeKernel) fail(op string, obj any) error {
	f.writes++
	if f.failFn != nil {
		return f.failFn(op, obj)
	}
	return nil
}

func (f *FakeKernel) ListRoutes(table, protocol int) ([]KernelRoute, error) {
	f.mu.Lock()
	f.lists++
	defer f.mu.Unlock()
	var out []KernelRoute
	for r := range f.routes {
		if r.Table == table && r.Protocol == protocol {
			out = append(out, r)
		}
	}
	return out, nil
}

// resolveLocked checks r's device, or picks one from its gateway.
func (f *FakeKernel) resolveLocked(r KernelRoute) (KernelRoute, error) {
	if !r.Dst.IsValid() || r.Table == 0 {
		return r, syscall.EINVAL
	}
	if r.Type != TypeUnicast {
		if r.LinkIndex != 0 || r.Gateway.IsValid() || r.Src.IsValid() {
			return r, syscall.EINVAL
		}
		return r, nil
	}
	if r.LinkIndex != 0 {
		if !slices.Contains(slices.Collect(maps.Values(f.links)), r.LinkIndex) {
			return r, syscall.ENODEV
		}
		if f.down[r.LinkIndex] {
			return r, syscall.ENETDOWN
		}
		return r, nil
	}
	for p, idx := range f.connected {
		if r.Gateway.IsValid() && p.Contains(r.Gateway) && !f.down[idx] {
			r.LinkIndex = idx
			return r, nil
		}
	}
	return r, syscall.ENETUNREACH
}

func (f *FakeKernel) slotTakenLocked(s slot) (KernelRoute, bool) {
	for r := range f.routes {
		if r.slot() == s {
			return r, true
		}
	}
	return KernelRoute{}, false
}

func (f *FakeKernel) AddRoute(r KernelRoute) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("add route", r); err != nil {
		return err
	}
	r, err := f.resolveLocked(r)
	if err != nil {
		return err
	}
	if _, taken := f.slotTakenLocked(r.slot()); taken {
		return syscall.EEXIST
	}
	f.routes[r] = true
	f.notifyLocked(Event{Route: &r})
	return nil
}

func (f *FakeKernel) ReplaceRoute(r KernelRoute) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("replace route", r); err != nil {
		return err
	}
	r, err := f.resolveLocked(r)
	if err != nil {
		return err
	}
	if old, taken := f.slotTakenLocked(r.slot()); taken {
		delete(f.routes, old)
		f.notifyLocked(Event{Route: &old, Deleted: true})
	}
	f.routes[r] = true
	f.notifyLocked(Event{Route: &r})
	return nil
}

func (f *FakeKernel) DelRoute(r KernelRoute) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("delete route", r); err != nil {
		return err
	}
	for have := range f.routes {
		if have.slot() != r.slot() || have.Protocol != r.Protocol || have.Type != r.Type ||
			(r.Gateway.IsValid() && have.Gateway != r.Gateway) ||
			(r.LinkIndex != 0 && have.LinkIndex != r.LinkIndex) ||
			(r.Src.IsValid() && have.Src != r.Src) {
			continue
		}
		delete(f.routes, have)
		f.notifyLocked(Event{Route: &have, Deleted: true})
		return nil
	}
	return syscall.ESRCH
}

func (f *FakeKernel) ListRules() ([]KernelRule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Keys(f.rules)), nil
}

func (f *FakeKernel) ruleFamilyLocked(r KernelRule) error {
	if r.Family != FamilyV4 && (r.Family != FamilyV6 || f.noV6Rules) {
		return syscall.EAFNOSUPPORT
	}
	return nil
}

func (f *FakeKernel) AddRule(r KernelRule) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("add rule", r); err != nil {
		return err
	}
	if err := f.ruleFamilyLocked(r); err != nil {
		return err
	}
	for have := range f.rules {
		if have.id() == r.id() {
			return syscall.EEXIST
		}
	}
	f.rules[r] = true
	f.notifyLocked(Event{Rule: &r})
	return nil
}

func (f *FakeKernel) DelRule(r KernelRule) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("delete rule", r); err != nil {
		return err
	}
	if err := f.ruleFamilyLocked(r); err != nil {
		return err
	}
	for have := range f.rules {
		if have.id() == r.id() && (r.Protocol == 0 || have.Protocol == r.Protocol) {
			delete(f.rules, have)
			f.notifyLocked(Event{Rule: &have, Deleted: true})
			return nil
		}
	}
	return syscall.ENOENT
}

func (f *FakeKernel) LinkIndex(name string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx, ok := f.links[name]
	if !ok {
		return 0, fmt.Errorf("link %q: %w", name, errors.New("Link not found"))
	}
	return idx, nil
}

func (f *FakeKernel) Subscribe(done <-chan struct{}) (<-chan Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subscribe++
	if f.subscribeErr != nil {
		return nil, f.subscribeErr
	}
	s := &fakeSub{ch: make(chan Event, 1024)}
	f.subs[s] = true
	go func() {
		<-done
		f.mu.Lock()
		delete(f.subs, s)
		s.close()
		f.mu.Unlock()
	}()
	return s.ch, nil
}

var _ Kernel = (*FakeKernel)(nil)
var _ Kernel = (*netlinkKernel)(nil)
