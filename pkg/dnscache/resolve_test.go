package dnscache

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"
)

type fakeDNS struct {
	mu    sync.Mutex
	addrs map[string][]netip.Addr
	calls int
}

func (f *fakeDNS) lookup(_ context.Context, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if as, ok := f.addrs[host]; ok {
		return as, nil
	}
	return nil, errors.New("no such host")
}

func (f *fakeDNS) set(host string, as ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(as) == 0 {
		delete(f.addrs, host)
		return
	}
	var out []netip.Addr
	for _, a := range as {
		out = append(out, netip.MustParseAddr(a))
	}
	f.addrs[host] = out
}

func TestResolverCachesAndKeepsLastKnown(t *testing.T) {
	dns := &fakeDNS{addrs: map[string][]netip.Addr{}}
	dns.set("vpn.example", "2001:db8::1", "203.0.113.7")
	changes := 0
	r := NewResolver(ResolverOptions{Lookup: dns.lookup, Interval: time.Hour, OnChange: func() { changes++ }})
	ctx := context.Background()

	if _, err := r.Lookup("vpn.example"); !errors.Is(err, ErrNotResolved) {
		t.Fatalf("first Lookup err %v, want ErrNotResolved (no blocking on DNS)", err)
	}
	if dns.calls != 0 {
		t.Fatalf("Lookup itself queried DNS %d times", dns.calls)
	}
	r.resolve(ctx, false)
	if a, err := r.Lookup("vpn.example"); err != nil || a != netip.MustParseAddr("203.0.113.7") {
		t.Fatalf("Lookup = %v, %v; want 203.0.113.7 (IPv4 preferred)", a, err)
	}
	if changes != 1 {
		t.Errorf("first resolution: %d changes, want 1", changes)
	}
	r.resolve(ctx, false) // nothing new to resolve
	if dns.calls != 1 || changes != 1 {
		t.Errorf("calls %d changes %d after a kick with nothing new", dns.calls, changes)
	}

	dns.set("vpn.example") // DNS fails: keep the last known address
	r.resolve(ctx, true)
	if a, err := r.Lookup("vpn.example"); err != nil || a != netip.MustParseAddr("203.0.113.7") {
		t.Errorf("after a failed lookup: %v, %v; want the last known address", a, err)
	}
	if changes != 1 {
		t.Errorf("a failed lookup with a known address signalled a change")
	}

	dns.set("vpn.example", "203.0.113.8")
	r.resolve(ctx, true)
	if a, _ := r.Lookup("vpn.example"); a != netip.MustParseAddr("203.0.113.8") || changes != 2 {
		t.Errorf("changed address: %v, changes %d", a, changes)
	}

	if _, err := r.Lookup("gone.example"); !errors.Is(err, ErrNotResolved) {
		t.Fatal(err)
	}
	r.resolve(ctx, false)
	if _, err := r.Lookup("gone.example"); err == nil || errors.Is(err, ErrNotResolved) {
		t.Errorf("unresolvable name: err %v, want the lookup's error", err)
	}
}

func TestResolverRunSignalsChange(t *testing.T) {
	dns := &fakeDNS{addrs: map[string][]netip.Addr{}}
	dns.set("vpn.example", "203.0.113.7")
	changed := make(chan struct{}, 1)
	r := NewResolver(ResolverOptions{Lookup: dns.lookup, OnChange: func() { changed <- struct{}{} }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	r.Lookup("vpn.example")
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no change signalled after a new name was looked up")
	}
	if a, err := r.Lookup("vpn.example"); err != nil || a != netip.MustParseAddr("203.0.113.7") {
		t.Errorf("Lookup = %v, %v", a, err)
	}
}
