package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/nodestate"
	"meshd.io/meshd/pkg/probe"
)

// The debug endpoints on --listen (pkg/nodestate): the node's plan, what
// its executors find in the kernel now, its WireGuard peers and probe
// results, and an ICMP echo through the mesh on request. meshctl diagnose
// and meshctl check read them through the API server's node proxy. They
// show nothing secret: no private or preshared key has a field.

// debugRecord keeps what the last reconcile computed, for the endpoints.
type debugRecord struct {
	mu   sync.Mutex
	plan *mesh.Plan
	errs []string
}

func (d *debugRecord) set(plan *mesh.Plan, errs []error) {
	s := make([]string, 0, len(errs))
	for _, e := range errs {
		s = append(s, e.Error())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.plan, d.errs = plan, s
}

func (d *debugRecord) get() (*mesh.Plan, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.plan, slices.Clone(d.errs)
}

// Readers the executors offer for diagnostics (pkg/route, pkg/iptables).
type (
	routeReader interface {
		Current() ([]string, []string, error)
	}
	iptablesReader interface{ Current() ([]string, error) }
)

// debugState collects the node's State now.
func (d *daemon) debugState() nodestate.State {
	r := d.rec
	plan, errs := r.debug.get()
	ready, why := d.readiness()
	r.mu.Lock()
	last := r.lastAttempt
	r.mu.Unlock()
	s := nodestate.State{
		Node: r.node, Version: version, Time: time.Now().UTC(), Ready: ready, Readiness: why,
		Settings: r.settings, LastReconcile: last.UTC(), Errors: errs,
		WireGuard: nodestate.WireGuard{Interface: d.cfg.Interface, Kind: d.device.Kind(), PublicKey: r.publicKey().String(), Peers: []nodestate.WGPeer{}},
		Kernel:    nodestate.Kernel{Routes: []string{}, Rules: []string{}, IPTables: []string{}},
		Probes:    nodestate.Probes{Port: d.cfg.ProbePort, Targets: map[string]string{}},
	}
	names := map[string]string{}
	if plan != nil {
		s.Plan = planState(plan)
		for _, p := range plan.WireGuard.Peers {
			names[p.PublicKey.String()] = p.Name
		}
	}
	if stats, err := d.device.Stats(); err != nil {
		s.WireGuard.Error = err.Error()
	} else {
		for _, p := range stats {
			wp := nodestate.WGPeer{PublicKey: p.PublicKey.String(), Name: names[p.PublicKey.String()], ReceiveBytes: p.ReceiveBytes, TransmitBytes: p.TransmitBytes}
			if p.Endpoint != nil {
				wp.Endpoint = p.Endpoint.String()
			}
			if !p.LastHandshake.IsZero() {
				t := p.LastHandshake.UTC()
				wp.LastHandshake = &t
			}
			s.WireGuard.Peers = append(s.WireGuard.Peers, wp)
		}
		sortPeers(s.WireGuard.Peers)
	}
	s.Kernel = d.kernelState()
	if d.prober != nil {
		for name, st := range d.prober.Results() {
			s.Probes.Targets[name] = st.String()
		}
	}
	if d.tunnel != nil { // tunnel probes: <cluster>/<mesh address>
		for name, st := range d.tunnel.Results() {
			s.Probes.Targets[name] = st.String()
		}
	}
	return s
}

// kernelState asks the route and iptables executors what is in the kernel.
func (d *daemon) kernelState() nodestate.Kernel {
	k := nodestate.Kernel{Routes: []string{}, Rules: []string{}, IPTables: []string{}}
	if rr, ok := any(d.routes).(routeReader); ok {
		routes, rules, err := rr.Current()
		if err != nil {
			k.Errors = append(k.Errors, err.Error())
		}
		k.Routes, k.Rules = append(k.Routes, routes...), append(k.Rules, rules...)
	}
	for _, ipt := range []iptablesSetter{d.rec.ipt4, d.rec.ipt6} {
		if ir, ok := ipt.(iptablesReader); ok && ipt != nil {
			lines, err := ir.Current()
			if err != nil {
				k.Errors = append(k.Errors, err.Error())
			}
			k.IPTables = append(k.IPTables, lines...)
		}
	}
	return k
}

// planState renders a plan for the debug endpoint (preshared keys only
// flagged).
func planState(p *mesh.Plan) *nodestate.Plan {
	out := &nodestate.Plan{
		Location: p.Location, Leader: p.Leader, Leaders: maps.Clone(p.Leaders), MeshIPs: map[string][]string{},
		Addresses: strs(p.WireGuard.Addresses), ListenPort: p.WireGuard.ListenPort, Peers: []nodestate.PlanPeer{},
		Routes: []string{}, Rules: []string{}, Chains: []string{}, Warnings: append([]string{}, p.Warnings...),
	}
	if out.Leaders == nil {
		out.Leaders = map[string]string{}
	}
	for n, ips := range p.MeshIPs {
		out.MeshIPs[n] = strs(ips)
	}
	for _, pp := range p.WireGuard.Peers {
		ps := nodestate.PlanPeer{Name: pp.Name, PublicKey: pp.PublicKey.String(), PersistentKeepalive: int(pp.PersistentKeepalive / time.Second),
			AllowedIPs: strs(pp.AllowedIPs), PresharedKey: pp.PresharedKey != nil}
		if !pp.Endpoint.IsZero() {
			ps.Endpoint = pp.Endpoint.String()
		}
		out.Peers = append(out.Peers, ps)
	}
	for _, r := range p.Routes {
		out.Routes = append(out.Routes, routeString(r))
	}
	for _, r := range p.Rules {
		fam := "ipv4"
		if r.IPv6 {
			fam = "ipv6"
		}
		out.Rules = append(out.Rules, fmt.Sprintf("%s rule pref %d lookup %d", fam, r.Priority, r.Table))
	}
	for fam, f := range map[string]mesh.IPTablesFamily{"ipv4": p.IPTables.V4, "ipv6": p.IPTables.V6} {
		for _, ch := range f.Chains {
			for _, rule := range ch.Rules {
				out.Chains = append(out.Chains, fmt.Sprintf("%s %s %s: %s", fam, ch.Table, ch.Name, strings.Join(rule, " ")))
			}
		}
		for _, j := range f.Jumps {
			out.Chains = append(out.Chains, fmt.Sprintf("%s %s %s: -j %s", fam, j.Table, j.From, j.To))
		}
	}
	slices.Sort(out.Chains)
	return out
}

func routeString(r mesh.Route) string {
	var b strings.Builder
	if r.Type != mesh.RouteUnicast {
		fmt.Fprintf(&b, "%s ", r.Type)
	}
	b.WriteString(r.Dst.String())
	if r.Gateway.IsValid() {
		fmt.Fprintf(&b, " via %s", r.Gateway)
	}
	if r.Device != "" {
		fmt.Fprintf(&b, " dev %s", r.Device)
	}
	if r.Src.IsValid() {
		fmt.Fprintf(&b, " src %s", r.Src)
	}
	fmt.Fprintf(&b, " table %d", r.Table)
	if r.Metric != 0 {
		fmt.Fprintf(&b, " metric %d", r.Metric)
	}
	return b.String()
}

func strs[T fmt.Stringer](xs []T) []string {
	out := make([]string, 0, len(xs))
	for _, x := range xs {
		out = append(out, x.String())
	}
	return out
}

// Limits of the ping endpoint: it answers for mesh addresses of the plan
// only, one ping at a time, a few requests each.
const (
	maxPingCount = 10
	pingInterval = 200 * time.Millisecond
	pingTimeout  = 2 * time.Second
)

// ping sends ICMP echo requests from this node's mesh address to to, which
// must be a mesh address of another node in the current plan.
func (d *daemon) ping(ctx context.Context, to string, count int) (nodestate.Ping, int) {
	out := nodestate.Ping{From: d.rec.node, To: to, RTTs: []float64{}}
	dst, err := netip.ParseAddr(to)
	if err != nil {
		out.Error = fmt.Sprintf("to=%q: not an IP address", to)
		return out, http.StatusBadRequest
	}
	plan, _ := d.rec.debug.get()
	if plan == nil {
		out.Error = "no plan yet"
		return out, http.StatusServiceUnavailable
	}
	if !pingable(plan, d.rec.node, dst) {
		out.Error = fmt.Sprintf("%s is not the mesh address of another node, nor a single address a WireGuard peer of this node carries", dst)
		return out, http.StatusBadRequest
	}
	var src netip.Addr
	for _, a := range plan.MeshIPs[d.rec.node] {
		if a.Is4() == dst.Is4() {
			src = a
		}
	}
	if !src.IsValid() {
		out.Error = fmt.Sprintf("this node has no mesh address of the family of %s", dst)
		return out, http.StatusConflict
	}
	out.Source = src.String()
	d.pingMu.Lock()
	defer d.pingMu.Unlock()
	res, err := probe.Echo(ctx, src, dst, count, pingInterval, pingTimeout)
	out.Sent, out.Received = res.Sent, res.Received
	for _, rtt := range res.RTTs {
		out.RTTs = append(out.RTTs, float64(rtt.Microseconds())/1000)
	}
	if err != nil {
		out.Error = err.Error()
		return out, http.StatusInternalServerError
	}
	return out, http.StatusOK
}

// pingable: dst is the mesh address of another node of the plan, or a
// single address (/32, /128) in a WireGuard peer's allowed IPs (a linked
// cluster's leader, a Peer).
func pingable(plan *mesh.Plan, self string, dst netip.Addr) bool {
	for n, ips := range plan.MeshIPs {
		if n != self && slices.Contains(ips, dst) {
			return true
		}
	}
	for _, p := range plan.WireGuard.Peers {
		if slices.Contains(p.AllowedIPs, netip.PrefixFrom(dst, dst.BitLen())) {
			return true
		}
	}
	return false
}

// debugHandlers adds the debug endpoints to mux.
func (d *daemon) debugHandlers(mux *http.ServeMux) {
	mux.HandleFunc("GET "+nodestate.PathState, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, d.debugState())
	})
	mux.HandleFunc("GET "+nodestate.PathPing, func(w http.ResponseWriter, req *http.Request) {
		count := 3
		if c := req.URL.Query().Get("count"); c != "" {
			n, err := strconv.Atoi(c)
			if err != nil || n < 1 || n > maxPingCount {
				writeJSON(w, http.StatusBadRequest, nodestate.Ping{Error: fmt.Sprintf("count=%q: want 1-%d", c, maxPingCount)})
				return
			}
			count = n
		}
		p, code := d.ping(req.Context(), req.URL.Query().Get("to"), count)
		writeJSON(w, code, p)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// sortPeers orders the device's peers like the plan (by name, then key).
func sortPeers(ps []nodestate.WGPeer) {
	slices.SortFunc(ps, func(a, b nodestate.WGPeer) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.PublicKey, b.PublicKey))
	})
}
