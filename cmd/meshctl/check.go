package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/nodestate"
)

// meshctl check: a connectivity test. For every ordered pair of mesh
// members (and from every leader to the leaders of linked clusters), meshd
// on the source node sends ICMP echo requests from its mesh address to the
// target's mesh address, through the same routes, leaders and WireGuard
// tunnels as pod traffic (pkg/probe.Echo, via meshd's debug endpoint). The
// nodes' states, read before and after, name the hop that fails.

// checkReport is meshctl check's result (-o json|yaml).
type checkReport struct {
	Cluster string      `json:"cluster"`
	Pairs   []checkPair `json:"pairs"`
	Passed  int         `json:"passed"`
	Failed  int         `json:"failed"`
	// Skipped are nodes or clusters not tested, and why.
	Skipped []string `json:"skipped"`
}

type checkPair struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Kind: "location" (both in one location), "locations" (across
	// locations) or "cluster" (to a linked cluster's leader).
	Kind string `json:"kind"`
	// Path is the way the packets take: "->" underlay, "=>" WireGuard.
	Path      string     `json:"path"`
	Address   string     `json:"address"`
	OK        bool       `json:"ok"`
	Sent      int        `json:"sent"`
	Received  int        `json:"received"`
	RTTMillis []float64  `json:"rttMillis"`
	FailedHop string     `json:"failedHop,omitempty"`
	Hops      []checkHop `json:"hops"`
}

type checkHop struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// handshakeFresh is how old a WireGuard handshake may be while the session
// it made is usable (WireGuard's Reject-After-Time).
const handshakeFresh = 180 * time.Second

// maxParallel bounds the nodes read or pinging at once.
const maxParallel = 8

func newCheckCommand(e *env) *cobra.Command {
	var (
		output   string
		port     int
		count    int
		from, to []string
		noLinked bool
	)
	c := &cobra.Command{
		Use:   "check",
		Short: "Test connectivity node to node, across locations and to linked clusters, naming the hop that fails",
		Long: `check proves that the mesh carries traffic. For every ordered pair of mesh
members, meshd on the source node sends ICMP echo requests from its mesh
address to the target node's mesh address: the packets take the same routes,
location leaders and WireGuard tunnels as pod traffic, and the target's
kernel answers. From every location leader the same is done to the leaders
of every linked cluster (meshctl link).

For a pair that fails, check names the first hop that is broken, from what
the nodes report (read through the API server's node proxy before and after
the echo): meshd not reachable or not live, the source's route, the underlay
between a node and its leader (the data-plane probes), the WireGuard tunnel
between the two leaders (peer missing, no fresh handshake, packets sent but
nothing received), the target's route back, or, when all of these look
right, the echo itself.

Needs RBAC "get nodes/proxy" and meshd listening on the node's address (the
manifests' --listen $(HOST_IP):9477). Exit code 1 when a pair fails.

Output formats (-o): table (default), json, yaml.`,
		Example: `  meshctl check
  meshctl check --from node-1 -o json | jq '.pairs[] | select(.ok | not)'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json", "yaml"); err != nil {
				return err
			}
			if count < 1 || count > 10 {
				return usageError{fmt.Errorf("--count %d: want 1-10", count)}
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			r, err := e.check(ctx, checkOptions{port: port, count: count, from: from, to: to, linked: !noLinked})
			if err != nil {
				return err
			}
			if output == "table" {
				_, err = io.WriteString(e.stdout, renderCheck(r))
			} else {
				err = writeStructured(e.stdout, r, output)
			}
			if err != nil {
				return err
			}
			if r.Failed > 0 {
				return fmt.Errorf("check: %d of %d pairs failed", r.Failed, len(r.Pairs))
			}
			if len(r.Pairs) == 0 {
				return fmt.Errorf("check: no pair to test")
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	f.IntVar(&port, "meshd-port", 0, "port of meshd's --listen on the nodes (default: what each node publishes, else 9477)")
	f.IntVar(&count, "count", 3, "echo requests per pair (1-10); a pair passes when one is answered")
	f.StringSliceVar(&from, "from", nil, "test only from these nodes (comma separated, repeatable)")
	f.StringSliceVar(&to, "to", nil, "test only to these nodes (comma separated, repeatable; linked clusters are tested unless --no-linked)")
	f.BoolVar(&noLinked, "no-linked", false, "do not test linked clusters")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

type checkOptions struct {
	port, count int
	from, to    []string
	linked      bool
}

// checkTarget is one pair to test, before the echo.
type checkTarget struct {
	pair checkPair
	// For the hop analysis: the nodes on the way (leaders "" when the pair
	// stays in one location), the WireGuard key the source's leader must
	// have, and the source's mesh address (for the route back).
	src, srcLeader, dstLeader, dst string
	wgKey                          wgtypes.Key
	target, back                   netip.Addr
}

func (e *env) check(ctx context.Context, o checkOptions) (*checkReport, error) {
	m, err := e.load(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range append(slices.Clone(o.from), o.to...) {
		if _, ok := m.Objs[n]; !ok {
			return nil, unknown("node", n, m.nodeNames())
		}
	}
	c, err := e.newClients(e.s.kubeconfig, e.s.context)
	if err != nil {
		return nil, err
	}
	r := &checkReport{Cluster: m.Server, Pairs: []checkPair{}, Skipped: []string{}}
	targets := m.checkTargets(o, r)
	if o.linked {
		lctx, cancel := context.WithTimeout(ctx, e.s.timeout)
		linked, notes := e.linkedClusters(lctx, m)
		cancel()
		r.Skipped = append(r.Skipped, notes...)
		targets = append(targets, m.linkedTargets(linked, o, r)...)
	}
	var nodes []string
	for _, t := range targets {
		for _, n := range []string{t.src, t.srcLeader, t.dstLeader, t.dst} {
			if n != "" && m.Objs[n] != nil && !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	before := e.states(ctx, c, m, nodes, o.port)
	pings := e.pings(ctx, c, m, targets, o, before)
	after := e.states(ctx, c, m, nodes, o.port)
	for i, t := range targets {
		p := analyze(m, t, pings[i], before, after)
		if p.OK {
			r.Passed++
		} else {
			r.Failed++
		}
		r.Pairs = append(r.Pairs, p)
	}
	return r, nil
}

// checkTargets are the pairs of this cluster's members.
func (m *model) checkTargets(o checkOptions, r *checkReport) []checkTarget {
	seg := map[string]int{}
	for i, s := range m.Topo.Segments {
		for _, n := range s.Nodes {
			seg[n] = i
		}
	}
	for _, n := range m.nodeNames() {
		if _, ok := seg[n]; !ok {
			r.Skipped = append(r.Skipped, fmt.Sprintf("node %s: not a mesh member (no public key published: meshd not running there yet)", n))
		}
	}
	var out []checkTarget
	for _, a := range m.nodeNames() {
		sa, ok := seg[a]
		if !ok || len(o.from) > 0 && !slices.Contains(o.from, a) {
			continue
		}
		for _, b := range m.nodeNames() {
			sb, ok := seg[b]
			if !ok || a == b || len(o.to) > 0 && !slices.Contains(o.to, b) {
				continue
			}
			t := checkTarget{src: a, dst: b, target: firstAddr(m.Topo.MeshIPs[b], netip.Addr{}), pair: checkPair{From: a, To: b, Kind: "location"}}
			t.back = firstAddr(m.Topo.MeshIPs[a], t.target)
			if sa != sb {
				la, lb := m.Topo.Segments[sa].Leader, m.Topo.Segments[sb].Leader
				t.srcLeader, t.dstLeader, t.wgKey = la, lb, m.Topo.Segments[sb].PublicKey
				t.pair.Kind = "locations"
			}
			t.pair.Path = pathString(t)
			t.pair.Address = addrString(t.target)
			out = append(out, t)
		}
	}
	return out
}

// linkedTargets are the pairs from this cluster's leaders to the leaders
// of the linked clusters, at their mesh addresses.
func (m *model) linkedTargets(linked []linkedCluster, o checkOptions, r *checkReport) []checkTarget {
	var out []checkTarget
	for _, lc := range linked {
		if lc.Err != nil {
			r.Skipped = append(r.Skipped, fmt.Sprintf("linked cluster %s: %v", orDash(lc.Settings.Name), lc.Err))
			continue
		}
		for _, s := range m.Topo.Segments {
			if len(o.from) > 0 && !slices.Contains(o.from, s.Leader) {
				continue
			}
			for _, p := range lc.Peers {
				addr := netip.Addr{}
				for _, a := range p.AllowedIPs {
					for _, mc := range lc.Settings.MeshCIDRs {
						if a.IsSingleIP() && mc.Contains(a.Addr()) && !addr.IsValid() {
							addr = a.Addr()
						}
					}
				}
				to := "cluster " + lc.Settings.Name + ": " + p.Name
				if !addr.IsValid() {
					r.Skipped = append(r.Skipped, fmt.Sprintf("%s: no mesh address in its allowed IPs", to))
					continue
				}
				t := checkTarget{src: s.Leader, srcLeader: s.Leader, wgKey: p.PublicKey, target: addr,
					pair: checkPair{From: s.Leader, To: to, Kind: "cluster", Address: addr.String()}}
				t.back = firstAddr(m.Topo.MeshIPs[s.Leader], addr)
				t.pair.Path = s.Leader + " => " + p.Name
				out = append(out, t)
			}
		}
	}
	return out
}

// firstAddr is the first of as of like's family (any family when like is
// zero), IPv4 first.
func firstAddr(as []netip.Addr, like netip.Addr) netip.Addr {
	for _, v4 := range []bool{true, false} {
		for _, a := range as {
			if a.Is4() == v4 && (!like.IsValid() || like.Is4() == a.Is4()) {
				return a
			}
		}
	}
	return netip.Addr{}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func pathString(t checkTarget) string {
	if t.srcLeader == "" {
		return t.src + " -> " + t.dst
	}
	var p []string
	p = append(p, t.src)
	if t.srcLeader != t.src {
		p = append(p, "-> "+t.srcLeader)
	}
	p = append(p, "=> "+t.dstLeader)
	if t.dstLeader != t.dst {
		p = append(p, "-> "+t.dst)
	}
	return strings.Join(p, " ")
}

// stateResult is a node's state or why it could not be read.
type stateResult struct {
	s   *nodestate.State
	err error
}

// states reads the nodes' debug states in parallel.
func (e *env) states(ctx context.Context, c *connect.Clients, m *model, nodes []string, port int) map[string]stateResult {
	out := make(map[string]stateResult, len(nodes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallel)
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sctx, cancel := context.WithTimeout(ctx, e.s.timeout)
			defer cancel()
			s, err := e.fetchState(sctx, c, m, n, port)
			mu.Lock()
			out[n] = stateResult{s: s, err: err}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// pingResult is one pair's echo.
type pingResult struct {
	p   nodestate.Ping
	err error
}

// pings runs every pair's echo: sources in parallel, each source's pairs
// one after another (meshd answers one ping at a time).
func (e *env) pings(ctx context.Context, c *connect.Clients, m *model, targets []checkTarget, o checkOptions, before map[string]stateResult) []pingResult {
	out := make([]pingResult, len(targets))
	bySrc := map[string][]int{}
	for i, t := range targets {
		bySrc[t.src] = append(bySrc[t.src], i)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallel)
	for src, idx := range bySrc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			for _, i := range idx {
				if st := before[src]; st.err != nil {
					out[i] = pingResult{err: st.err}
					continue
				}
				if !targets[i].target.IsValid() {
					out[i] = pingResult{err: fmt.Errorf("%s has no mesh address", targets[i].pair.To)}
					continue
				}
				pctx, cancel := context.WithTimeout(ctx, e.s.timeout)
				p, err := e.ping(pctx, c, m, src, o.port, targets[i].target.String(), o.count)
				cancel()
				out[i] = pingResult{p: p, err: err}
			}
		}()
	}
	wg.Wait()
	return out
}

// analyze judges one pair from its echo and the states before and after.
func analyze(m *model, t checkTarget, pr pingResult, before, after map[string]stateResult) checkPair {
	p := t.pair
	p.RTTMillis = []float64{}
	add := func(name string, ok bool, detail string) {
		p.Hops = append(p.Hops, checkHop{Name: name, OK: ok, Detail: detail})
	}
	src := after[t.src]
	if src.err != nil {
		src = before[t.src]
	}
	if src.err != nil {
		add("meshd "+t.src, false, src.err.Error())
	} else {
		add("meshd "+t.src, true, readyDetail(src.s))
	}
	for _, n := range []string{t.src, t.dst} {
		if n != "" && m.Live != nil && m.Leases[n] && !m.Live[n] {
			add("lease "+n, false, "counted dead: its heartbeat Lease is stale (meshd not running, or cut off from the API server), or the other nodes' data-plane probes vote it down")
		}
	}
	if src.s != nil && t.target.IsValid() {
		ok, d := routeCovers(src.s, t.target)
		add("route "+t.src, ok, d)
	}
	podRoutes := true
	if src.s != nil && t.srcLeader != "" && t.dst != "" {
		// Across locations meshd routes the target's pods: without these
		// routes the node answers but its pods do not.
		podRoutes = podRoutesHop(m, src.s, t, add)
	}
	if t.srcLeader != "" && t.srcLeader != t.src {
		add(underlayHop(m, after, t.src, t.srcLeader))
	}
	if t.wgKey != (wgtypes.Key{}) && t.srcLeader != "" {
		if t.dstLeader != "" {
			add(underlayHop(m, after, t.srcLeader, t.dstLeader))
		}
		add(wireguardHop(t, before[t.srcLeader], after[t.srcLeader]))
	}
	if t.srcLeader == "" && t.dst != "" {
		add(underlayHop(m, after, t.src, t.dst))
	}
	if t.dstLeader != "" && t.dstLeader != t.dst {
		add(underlayHop(m, after, t.dstLeader, t.dst))
	}
	if dst := after[t.dst]; t.dst != "" && dst.s != nil && t.back.IsValid() {
		ok, d := routeCovers(dst.s, t.back)
		add("route back "+t.dst, ok, d)
	}
	switch {
	case pr.err != nil:
		add("echo", false, pr.err.Error())
	default:
		p.Sent, p.Received = pr.p.Sent, pr.p.Received
		p.RTTMillis = append(p.RTTMillis, pr.p.RTTs...)
		detail := fmt.Sprintf("%d of %d answered from %s to %s", pr.p.Received, pr.p.Sent, orDash(pr.p.Source), p.Address)
		if pr.p.Error != "" {
			detail += ": " + pr.p.Error
		}
		add("echo", pr.p.Received > 0, detail)
	}
	p.OK = p.Hops[len(p.Hops)-1].OK && podRoutes
	if !p.OK {
		for _, h := range p.Hops {
			if !h.OK {
				p.FailedHop = h.Name
				break
			}
		}
	}
	return p
}

// podRoutesHop adds the hop "pod routes SRC": the source routes every pod
// CIDR of the target into the mesh.
func podRoutesHop(m *model, s *nodestate.State, t checkTarget, add func(string, bool, string)) bool {
	n, ok := m.node(t.dst)
	if !ok || len(n.PodCIDRs) == 0 {
		return true
	}
	var missing, have []string
	for _, c := range n.PodCIDRs {
		if ok, d := routeCovers(s, c.Addr()); ok {
			have = append(have, c.String())
		} else {
			missing = append(missing, d)
		}
	}
	if len(missing) > 0 {
		add("pod routes "+t.src, false, fmt.Sprintf("pods of %s: %s", t.dst, strings.Join(missing, "; ")))
		return false
	}
	add("pod routes "+t.src, true, "pods of "+t.dst+": "+strings.Join(have, ","))
	return true
}

func readyDetail(s *nodestate.State) string {
	if s.Ready {
		return "ready"
	}
	return "not ready: " + s.Readiness
}

// routeCovers tells whether meshd's routes on the node send addr somewhere
// (the most specific covering route is not the fail-closed unreachable).
func routeCovers(s *nodestate.State, addr netip.Addr) (bool, string) {
	best, bestLen, unicast := "", -1, false
	for _, r := range s.Kernel.Routes {
		f := strings.Fields(r)
		if len(f) == 0 {
			continue
		}
		uni := true
		pfx, err := netip.ParsePrefix(f[0])
		if err != nil && len(f) > 1 {
			uni = false
			pfx, err = netip.ParsePrefix(f[1])
		}
		if err != nil || !pfx.Contains(addr) || pfx.Bits() <= bestLen {
			continue
		}
		best, bestLen, unicast = r, pfx.Bits(), uni
	}
	switch {
	case bestLen < 0:
		return false, fmt.Sprintf("no route of meshd covers %s", addr)
	case !unicast:
		return false, fmt.Sprintf("%s meets only the fail-closed route %q: the route through the mesh is missing", addr, best)
	}
	return true, best
}

// underlayHop judges the underlay from a to b by a's data-plane probes:
// as meshd on a reports them, else as a published them on its Lease.
func underlayHop(m *model, after map[string]stateResult, a, b string) (string, bool, string) {
	name := fmt.Sprintf("underlay %s -> %s", a, b)
	st := after[a]
	if st.s == nil {
		rep, ok := m.Reports[a]
		switch {
		case ok && slices.Contains(rep.Down, b):
			return name, false, fmt.Sprintf("%s's Lease reports its probes to %s unanswered (meshd on %s not read)", a, b, a)
		case ok && slices.Contains(rep.Up, b):
			return name, true, fmt.Sprintf("probes up, as %s's Lease reports (meshd on %s not read)", a, a)
		}
		return name, true, "not known (meshd on " + a + " not read)"
	}
	switch v := st.s.Probes.Targets[b]; v {
	case "down":
		return name, false, fmt.Sprintf("%s's probes to %s on UDP %d get no answer, or %s answers that it cannot forward (IPv4 forwarding off)", a, b, st.s.Probes.Port, b)
	case "":
		return name, true, "not probed"
	default:
		return name, true, "probes " + v
	}
}

// wireguardHop judges the tunnel of the source's leader toward the peer
// carrying the target, from its device before and after the echo.
func wireguardHop(t checkTarget, before, after stateResult) (string, bool, string) {
	to := t.dstLeader
	if to == "" {
		to = t.pair.To
	}
	name := fmt.Sprintf("wireguard %s => %s", t.srcLeader, to)
	if after.s == nil {
		if after.err != nil {
			return name, false, "meshd on " + t.srcLeader + " not read: " + after.err.Error()
		}
		return name, false, "meshd on " + t.srcLeader + " not read"
	}
	key := t.wgKey.String()
	find := func(s *nodestate.State) *nodestate.WGPeer {
		if s == nil {
			return nil
		}
		for i := range s.WireGuard.Peers {
			if s.WireGuard.Peers[i].PublicKey == key {
				return &s.WireGuard.Peers[i]
			}
		}
		return nil
	}
	a := find(after.s)
	if a == nil {
		return name, false, fmt.Sprintf("%s's WireGuard device has no peer %s", t.srcLeader, key)
	}
	var hs time.Duration = -1
	if a.LastHandshake != nil {
		hs = after.s.Time.Sub(*a.LastHandshake)
	}
	detail := fmt.Sprintf("endpoint %s, latest handshake %s", orDash(a.Endpoint), durationAgo(hs))
	if b := find(before.s); b != nil {
		tx, rx := a.TransmitBytes-b.TransmitBytes, a.ReceiveBytes-b.ReceiveBytes
		detail += fmt.Sprintf(", during the check %d B sent, %d B received", tx, rx)
		if tx > 0 && rx == 0 {
			return name, false, "packets sent into the tunnel, nothing came back: " + detail
		}
	}
	if hs < 0 || hs > handshakeFresh {
		return name, false, "no fresh handshake: " + detail
	}
	return name, true, detail
}

func durationAgo(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Second).String() + " ago"
}

// renderCheck renders the table.
func renderCheck(r *checkReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Cluster %s: %d pairs, %d passed, %d failed\n\n", r.Cluster, len(r.Pairs), r.Passed, r.Failed)
	w := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "FROM\tTO\tPATH\tADDRESS\tRESULT\tRTT\tFAILED HOP")
	for _, p := range r.Pairs {
		res, rtt := "ok", "-"
		if !p.OK {
			res = "FAIL"
		}
		if len(p.RTTMillis) > 0 {
			rtt = fmt.Sprintf("%.2fms", slices.Min(p.RTTMillis))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.From, p.To, p.Path, orDash(p.Address), res, rtt, orDash(p.FailedHop))
	}
	w.Flush()
	var failed []checkPair
	for _, p := range r.Pairs {
		if !p.OK {
			failed = append(failed, p)
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nFAILURES\n")
		for _, p := range failed {
			fmt.Fprintf(&b, "%s -> %s (%s):\n", p.From, p.To, p.Path)
			for _, h := range p.Hops {
				mark := "ok  "
				if !h.OK {
					mark = "FAIL"
				}
				fmt.Fprintf(&b, "  %s %s: %s\n", mark, h.Name, h.Detail)
			}
		}
	}
	if len(r.Skipped) > 0 {
		b.WriteString("\nNOT TESTED\n")
		for _, s := range r.Skipped {
			fmt.Fprintf(&b, "- %s\n", s)
		}
	}
	return b.String()
}
