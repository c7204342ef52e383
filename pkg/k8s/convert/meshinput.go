package convert

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"meshd.io/meshd/pkg/dnscache"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/secrets"
	"meshd.io/meshd/pkg/mesh"
)

// MeshInputOptions configure NewMeshInput.
type MeshInputOptions struct {
	// Parse configures NodeFromObject (topology label, default port).
	Parse ParseOptions
	// Secret reads a Peer's preshared key; nil makes a Peer that references
	// one unusable (reported as a problem).
	Secret SecretLookup
	// Resolve resolves the DNS name of a Peer's endpoint or a node's
	// meshd.io/force-endpoint; nil uses the default resolver. Each lookup gets ResolveTimeout (default 2s).
	Resolve        func(ctx context.Context, host string) ([]netip.Addr, error)
	ResolveTimeout time.Duration
	// Cached, when set, replaces Resolve: it answers from a cache without
	// blocking (a [dnscache.Resolver]'s Lookup). The daemon uses it so its reconcile
	// never waits on DNS.
	Cached func(host string) (netip.Addr, error)
	// APIServers are the API server's addresses, which no Peer may route
	// (see GuardPeers).
	APIServers []netip.Addr
	// Nodes, when set, converts the Nodes that did not change since the
	// last conversion from its cache (an informer's objects) and keeps of
	// each Node's DiscoveredEndpoints only what the plan reads (see
	// NodeCache): for the planner, not for showing them.
	Nodes *NodeCache
}

// MeshInput is the planner input converted from the cluster's objects, as
// every meshd node computes it (the daemon additionally replaces its own node
// by what it knows locally).
type MeshInput struct {
	Nodes []mesh.Node
	Peers []mesh.Peer
	// Problems maps "node/NAME" and "peer/NAME" to what was wrong with the
	// object: ignored annotations, an unresolvable endpoint, or why a Peer
	// is unusable (then it is not in Peers).
	Problems map[string][]error
}

// NewMeshInput converts Node and Peer objects the way meshd does: every node
// through NodeFromObject (malformed annotations ignored and reported), every
// Peer through PeerFromObject (an invalid Peer is skipped and reported) with
// a DNS endpoint resolved (IPv4 preferred; a failure is reported but the
// Peer kept with its host name).
func NewMeshInput(ctx context.Context, nodes []*corev1.Node, peers []*v1alpha1.Peer, o MeshInputOptions) MeshInput {
	in := MeshInput{
		Nodes:    make([]mesh.Node, 0, len(nodes)),
		Peers:    make([]mesh.Peer, 0, len(peers)),
		Problems: map[string][]error{},
	}
	in.convertNodes(nodes, o)
	// A node's meshd.io/force-endpoint may name a host: resolved like a
	// Peer's (the Node's copy in the input; the NodeCache keeps the name).
	for i := range in.Nodes {
		n := &in.Nodes[i]
		if err := o.resolveEndpoint(ctx, &n.Endpoint); err != nil {
			id := "node/" + n.Name
			in.Problems[id] = append(slices.Clip(in.Problems[id]), fmt.Errorf("annotation %s: %w", AnnotationForceEndpoint, err))
		}
	}
	for _, obj := range peers {
		if obj == nil {
			continue
		}
		// A lookup answering with a last known value (*StaleError) keeps
		// the Peer; the staleness is reported as a problem.
		var stale []error
		lookup := o.Secret
		if lookup != nil {
			lookup = func(ns, name, key string) ([]byte, error) {
				v, err := o.Secret(ns, name, key)
				if se := (*secrets.StaleError)(nil); errors.As(err, &se) {
					stale = append(stale, fmt.Errorf("peer %q: %w", obj.Name, err))
					return v, nil
				}
				return v, err
			}
		}
		p, err := PeerFromObject(obj, lookup)
		if err != nil {
			in.Problems["peer/"+obj.Name] = []error{err}
			continue
		}
		if len(stale) > 0 {
			in.Problems["peer/"+obj.Name] = stale
		}
		if err := o.resolveEndpoint(ctx, &p.Endpoint); err != nil {
			in.Problems["peer/"+obj.Name] = append(in.Problems["peer/"+obj.Name], err)
		}
		in.Peers = append(in.Peers, p)
	}
	GuardPeers(&in, o.APIServers...)
	guardLocationIPs(&in, o.APIServers)
	return in
}

// convertNodes converts the Node objects into in (through o.Nodes when
// set), reporting each one's problems.
func (in *MeshInput) convertNodes(nodes []*corev1.Node, o MeshInputOptions) {
	if o.Nodes != nil {
		var problems [][]error
		in.Nodes, problems = o.Nodes.convert(nodes, o.Parse)
		for i, p := range problems {
			if len(p) > 0 {
				in.Problems["node/"+in.Nodes[i].Name] = p
			}
		}
		return
	}
	for _, obj := range nodes {
		if obj == nil {
			continue
		}
		n, problems := NodeFromObject(obj, o.Parse)
		if len(problems) > 0 {
			in.Problems["node/"+obj.Name] = problems
		}
		in.Nodes = append(in.Nodes, n)
	}
}

// GuardPeers drops every allowed IP of a Peer that covers an address that
// must never go through a tunnel — a node's underlay (internal) address, a
// node's or a Peer's WireGuard endpoint, an API server address — and
// reports it as a problem of that Peer (routing it into the tunnel would
// loop or cut the node off). The Peer keeps its other allowed IPs.
func GuardPeers(in *MeshInput, apiServers ...netip.Addr) {
	protected := mesh.LocalGuard(mesh.Options{}, in.Nodes, apiServers...).Protected
	for _, p := range in.Peers {
		if a := p.Endpoint.Addr.Addr(); a.IsValid() {
			protected = append(protected, mesh.ProtectedAddr{Addr: a.Unmap(), What: "the WireGuard endpoint of Peer " + p.Name})
		}
	}
	if len(protected) == 0 {
		return
	}
	for i := range in.Peers {
		p := &in.Peers[i]
		id := "peer/" + p.Name
		p.AllowedIPs = keepUnprotected(p.AllowedIPs, protected, func(a netip.Prefix, c mesh.ProtectedAddr) {
			in.Problems[id] = append(in.Problems[id], fmt.Errorf("allowed IP %s covers %s (%s): refused, not routed", a, c.What, c.Addr))
		})
	}
}

// keepUnprotected returns the prefixes of ps that cover no protected
// address (ps itself when all do not), calling refused for each other one.
func keepUnprotected(ps []netip.Prefix, protected []mesh.ProtectedAddr, refused func(netip.Prefix, mesh.ProtectedAddr)) []netip.Prefix {
	var kept []netip.Prefix
	for _, p := range ps {
		if c, bad := mesh.CoversProtected(p, protected); bad {
			refused(p, c)
			continue
		}
		kept = append(kept, p)
	}
	if len(kept) == len(ps) {
		return ps
	}
	return kept
}

// guardLocationIPs drops every meshd.io/allowed-location-ips range of a
// Node that covers an API server address, and reports it as a problem of
// that Node: the other locations would route the API server into the
// tunnel to that location, and lose it (and with it their mesh
// configuration) whenever the tunnel is down. The planner checks the
// ranges against the nodes' addresses and endpoints itself; the API
// server's addresses it does not know.
func guardLocationIPs(in *MeshInput, apiServers []netip.Addr) {
	protected := mesh.LocalGuard(mesh.Options{}, nil, apiServers...).Protected
	if len(protected) == 0 {
		return
	}
	for i := range in.Nodes {
		n := &in.Nodes[i] // a copy's field: the NodeCache keeps its own
		id := "node/" + n.Name
		n.AllowedLocationIPs = keepUnprotected(n.AllowedLocationIPs, protected, func(p netip.Prefix, c mesh.ProtectedAddr) {
			// Clipped: the slice may be the NodeCache's own.
			in.Problems[id] = append(slices.Clip(in.Problems[id]), fmt.Errorf("annotation %s: %s covers %s (%s): refused, not routed", AnnotationAllowedLocationIPs, p, c.What, c.Addr))
		})
	}
}

// resolveEndpoint sets the address of an endpoint given by host name
// (from the cache when o.Cached is set); a failure leaves it without one.
func (o MeshInputOptions) resolveEndpoint(ctx context.Context, e *mesh.Endpoint) error {
	if e.Host == "" || e.Addr.Addr().IsValid() {
		return nil
	}
	var a netip.Addr
	var err error
	if o.Cached != nil {
		a, err = o.Cached(e.Host)
	} else {
		a, err = o.resolve(ctx, e.Host)
	}
	if err != nil {
		return fmt.Errorf("resolving endpoint host %q: %w", e.Host, err)
	}
	e.Addr = netip.AddrPortFrom(a, e.Addr.Port())
	return nil
}

func (o MeshInputOptions) resolve(ctx context.Context, host string) (netip.Addr, error) {
	timeout := o.ResolveTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lookup := o.Resolve
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	as, err := lookup(ctx, host)
	if err != nil {
		return netip.Addr{}, err
	}
	return dnscache.PickAddr(as)
}

// APIServerAddrs are the addresses of the API server cfg talks to, when its
// host is an IP address (a name is not resolved: nothing in the reconcile
// reads the network).
func APIServerAddrs(cfg *rest.Config) []netip.Addr {
	if cfg == nil || cfg.Host == "" {
		return nil
	}
	host := cfg.Host
	if u, err := url.Parse(host); err == nil && u.Host != "" {
		host = u.Hostname()
	} else if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a.Unmap()}
	}
	return nil
}
