package dnscache

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// ErrNotResolved is what [Resolver.Lookup] returns for a host name it has not
// resolved yet (the lookup runs in the background).
var ErrNotResolved = errors.New("not resolved yet")

// ResolverOptions configure a Resolver. Zero values take the defaults.
type ResolverOptions struct {
	// Lookup resolves one name; default: the system resolver.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// Timeout bounds one lookup; default 2s.
	Timeout time.Duration
	// Interval is how often every name in use is resolved again; default 30s.
	Interval time.Duration
	// OnChange is called (from Run's goroutine) when a name's address changes,
	// including its first resolution.
	OnChange func()
	Logger   *slog.Logger
}

// Resolver resolves Peer endpoint host names in the background into a cache,
// so the reconcile never waits on DNS: Lookup answers from the cache at once,
// a name seen for the first time is resolved right away, every name in use is
// resolved again each Interval, and a failed lookup keeps the last known
// address. Names not looked up for three intervals are forgotten.
type Resolver struct {
	o    ResolverOptions
	log  *slog.Logger
	kick chan struct{}

	mu    sync.Mutex
	hosts map[string]*dnsEntry
}

type dnsEntry struct {
	addr     netip.Addr // last known address; invalid: never resolved
	err      error      // last lookup's error
	tried    bool
	lastUsed time.Time
}

// NewResolver returns a Resolver; call Run to start resolving.
func NewResolver(o ResolverOptions) *Resolver {
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Interval <= 0 {
		o.Interval = 30 * time.Second
	}
	if o.Lookup == nil {
		o.Lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Resolver{o: o, log: log, kick: make(chan struct{}, 1), hosts: map[string]*dnsEntry{}}
}

// Lookup returns host's cached address (IPv4 preferred). It never blocks on
// DNS: an unknown name is queued for resolution and ErrNotResolved returned.
// After a failed lookup the last known address, if any, is still returned.
func (r *Resolver) Lookup(host string) (netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.hosts[host]
	if e == nil {
		e = &dnsEntry{}
		r.hosts[host] = e
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	e.lastUsed = time.Now()
	switch {
	case e.addr.IsValid():
		return e.addr, nil
	case e.err != nil:
		return netip.Addr{}, e.err
	default:
		return netip.Addr{}, ErrNotResolved
	}
}

// Run resolves until ctx ends.
func (r *Resolver) Run(ctx context.Context) error {
	t := time.NewTicker(r.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
			r.resolve(ctx, false)
		case <-t.C:
			r.resolve(ctx, true)
		}
	}
}

// resolve looks up the names never tried, or all of them, in parallel.
func (r *Resolver) resolve(ctx context.Context, all bool) {
	r.mu.Lock()
	var names []string
	for h, e := range r.hosts {
		if all && time.Since(e.lastUsed) > 3*r.o.Interval {
			delete(r.hosts, h)
			continue
		}
		if all || !e.tried {
			names = append(names, h)
		}
	}
	r.mu.Unlock()
	if len(names) == 0 {
		return
	}
	type result struct {
		host string
		addr netip.Addr
		err  error
	}
	results := make(chan result, len(names))
	sem := make(chan struct{}, 8)
	for _, h := range names {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			a, err := r.lookup(ctx, h)
			results <- result{h, a, err}
		}()
	}
	changed := false
	for range names {
		res := <-results
		r.mu.Lock()
		e := r.hosts[res.host]
		if e == nil {
			r.mu.Unlock()
			continue
		}
		first := !e.tried
		e.tried = true
		if res.err != nil {
			if e.err == nil || first {
				r.log.Warn("resolving peer endpoint failed; keeping the last known address", "host", res.host, "last", e.addr, "error", res.err)
			}
			changed = changed || (first || e.err == nil) && !e.addr.IsValid()
			e.err = res.err
		} else {
			if e.addr != res.addr {
				r.log.Info("peer endpoint resolved", "host", res.host, "address", res.addr, "was", e.addr)
				changed = true
			}
			e.addr, e.err = res.addr, nil
		}
		r.mu.Unlock()
	}
	if changed && r.o.OnChange != nil {
		r.o.OnChange()
	}
}

func (r *Resolver) lookup(ctx context.Context, host string) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	as, err := r.o.Lookup(ctx, host)
	if err != nil {
		return netip.Addr{}, err
	}
	return PickAddr(as)
}

// PickAddr prefers IPv4.
func PickAddr(as []netip.Addr) (netip.Addr, error) {
	if len(as) == 0 {
		return netip.Addr{}, errors.New("no addresses")
	}
	for _, a := range as {
		if a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	return as[0].Unmap(), nil
}
