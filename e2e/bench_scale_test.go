//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/nodestate"
)

// sinceLastCreate says when the slowest daemon had its full peer set,
// relative to the burst's last create: in location mesh that can come
// first, since only the new locations' leaders are new peers.
func sinceLastCreate(d time.Duration) string {
	if d < 0 {
		return fmt.Sprintf("%d ms before the last create", (-d).Milliseconds())
	}
	return fmt.Sprintf("%d ms after the last create", d.Milliseconds())
}

// TestBenchScale is the scale benchmark (make bench-scale; docs/scale.md).
// It reports figures and asserts none of them: it fails only when the mesh
// does not converge at all (then there is no figure to report).
//
// Per mode (full mesh, location mesh): 3 real nodes (n1, n2 in location a,
// n3 in b; in-process WireGuard, meshd's default --resync-period 30s and
// --log-level info) and
// BENCH_NODES-3 fake Nodes whose heartbeat Leases the benchmark renews every
// 10 s for the whole run (meshd's own rate: --lease-duration 40s / 4), the
// leader candidates' labelled as meshd labels them (FakeHeartbeats).
//  1. BENCH_NODES-3-BENCH_BURST fakes exist, meshd starts on the real nodes
//     and converges; then BENCH_BURST fakes join at once (50 parallel
//     creates, each with the Node's status, as a kubelet registers; then
//     their Leases): time until every real node has its full peer set.
//  2. meshd on n1 restarts (SIGTERM, start; meshd0 is recreated): time from
//     the start to the full peer set.
//  3. BENCH_CHANGES times, one fake Node's meshd.io/endpoint changes: time
//     until each real node's WireGuard has the new endpoint (p50, p99),
//     polled over the UAPI socket every 20 ms.
//  4. After BENCH_SETTLE, a steady window of BENCH_STEADY: per daemon,
//     reconciles, executor writes, API requests, CPU seconds and RSS; and
//     the API server's write requests (apiserver_request_total) per node
//     per minute, by resource.
//
// Fakes are spread over BENCH_LOCATIONS locations: the first ones over the
// first half of them, the burst over the second half (so, in location
// mesh, the burst adds new location leaders as peers). In location mesh
// only leaders have WireGuard peers; the peer-set times are theirs. A
// daemon watches the leader candidates' Leases of every location (4 per
// location), whatever the size of its own: the real nodes' small locations
// change nothing of what they receive.
//
// Environment: BENCH_SCALE=1 (required), BENCH_NODES (1000), BENCH_BURST
// (500, at most half the fakes), BENCH_LOCATIONS (10), BENCH_STEADY (5m),
// BENCH_SETTLE (2m: the steady window starts after the burst's and the
// restart's handshakes and probes settled), BENCH_CHANGES (20), BENCH_MODES ("full,location"),
// BENCH_SILENT_FAKES (1: the fakes answer nothing, as before the fake
// responder: wireguard-go then retries the handshake with each for about
// 90 s after the peer is created or n1 restarts, keeping a 64 KB buffer per
// peer meanwhile, and the real nodes' probes of fake candidates go
// unanswered),
// BENCH_FAKE_DISCOVERED (64: in full mesh, every fake Node carries the
// meshd.io/discovered-endpoints of that many peers, as a real node that
// talked to them publishes: meshd publishes at most 64 besides those of
// nodes behind NAT; earlier versions one per peer it talked to, up to
// BENCH_NODES-1; 0: none),
// BENCH_LAZY (empty: meshd's default --wireguard-lazy-peers=auto, lazy in
// a full mesh of more than 256 peers; 1: --wireguard-lazy-peers; 0:
// --wireguard-lazy-peers=false),
// BENCH_MESHD (another meshd binary, e.g. an older build, to compare),
// BENCH_LOG_LEVEL (meshd's --log-level, default info as in the DaemonSet),
// BENCH_OUT (a file the summary is appended to), BENCH_PROFILE (a
// directory: meshd runs with --debug-pprof and the benchmark saves CPU
// profiles of n2 over the burst's first 15 s and of n2 (or
// BENCH_PROFILE_NODE) over the steady window, and every
// daemon's heap profile, mappings (smaps) and metrics at its end;
// profiling adds a little CPU to that node).
func TestBenchScale(t *testing.T) {
	if os.Getenv("BENCH_SCALE") == "" {
		t.Skip("the scale benchmark runs with make bench-scale (BENCH_SCALE=1)")
	}
	cfg := benchConfigFromEnv(t)
	for _, mode := range cfg.modes {
		t.Run(mode, func(t *testing.T) { benchScale(t, cfg, mode) })
	}
}

type benchConfig struct {
	nodes, burst, locations, changes int
	steady, settle                   time.Duration
	modes                            []string
	meshd, out, profile              string
	// silent: the fakes answer no handshake and no probe
	// (BENCH_SILENT_FAKES=1); else a responder answers for them.
	silent bool
	// discovered: how many discovered endpoints each fake publishes in
	// full mesh (BENCH_FAKE_DISCOVERED).
	discovered int
	// lazy: BENCH_LAZY; empty leaves --wireguard-lazy-peers at its
	// default (auto), 1 turns it on, 0 off.
	lazy string
	// debugPeers (set per mode): the device holds only the peers with
	// traffic (lazy on, or auto in a full mesh of more than 256 peers), so
	// the peer sets are read from meshd's /debug/meshd.
	debugPeers bool
}

func benchConfigFromEnv(t *testing.T) benchConfig {
	num := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("%s=%q: want a whole number", name, v)
		}
		return n
	}
	dur := func(name string, def time.Duration) time.Duration {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			t.Fatalf("%s=%q: want a duration such as 5m", name, v)
		}
		return d
	}
	c := benchConfig{
		nodes:     num("BENCH_NODES", 1000),
		locations: num("BENCH_LOCATIONS", 10),
		changes:   num("BENCH_CHANGES", 20),
		steady:    dur("BENCH_STEADY", 5*time.Minute),
		settle:    dur("BENCH_SETTLE", 2*time.Minute),
		meshd:     os.Getenv("BENCH_MESHD"),
		out:       os.Getenv("BENCH_OUT"),
		profile:   os.Getenv("BENCH_PROFILE"),
		silent:    os.Getenv("BENCH_SILENT_FAKES") == "1",
		lazy:      os.Getenv("BENCH_LAZY"),
		// What meshd publishes at most for peers not behind NAT
		// (convert.DiscoveredLimit).
		discovered: num("BENCH_FAKE_DISCOVERED", 64),
		modes:      strings.Split(cmpOr(os.Getenv("BENCH_MODES"), "full,location"), ","),
	}
	fakes := c.nodes - 3
	if fakes < 4 || fakes > testbed.MaxWideFakeNodes {
		t.Fatalf("BENCH_NODES=%d: want 7 to %d", c.nodes, testbed.MaxWideFakeNodes+3)
	}
	c.burst = min(num("BENCH_BURST", 500), fakes/2)
	if c.locations < 2 {
		c.locations = 2
	}
	if c.lazy != "" && c.lazy != "0" && c.lazy != "1" {
		t.Fatalf("BENCH_LAZY=%q: want 0, 1 or nothing (meshd's default, auto)", c.lazy)
	}
	for _, m := range c.modes {
		if m != "full" && m != "location" {
			t.Fatalf("BENCH_MODES: unknown mode %q (want full, location)", m)
		}
	}
	return c
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func benchScale(t *testing.T, cfg benchConfig, mode string) {
	s := newScenario(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	t.Cleanup(cancel)
	s.ctx = ctx
	if cfg.meshd != "" {
		old := tb.MeshdBinary
		tb.MeshdBinary = cfg.meshd
		t.Cleanup(func() { tb.MeshdBinary = old })
	}
	answer := "answering handshakes and probes"
	if cfg.silent {
		answer = "silent"
	}
	rep := &benchReport{t: t, title: fmt.Sprintf("%s mesh, %d nodes (3 real, %d fake %s, %d locations of fakes), meshd %s%s",
		mode, cfg.nodes, cfg.nodes-3, answer, cfg.locations, cmpOr(cfg.meshd, "of this tree"), raceNote(tb.MeshdBinary))}
	nodes := s.scaleMesh()
	n1 := nodes[0]
	// The DaemonSet's defaults: --resync-period 30s and --log-level info
	// (the testbed's debug level logs every wireguard-go handshake attempt,
	// which at 1,000 peers is a cost of the benchmark, not of meshd).
	args := []string{"--mesh-granularity", mode, "--resync-period", "30s", "--log-level", cmpOr(os.Getenv("BENCH_LOG_LEVEL"), "info")}
	if cfg.profile != "" {
		args = append(args, "--debug-pprof", benchPprofAddr)
	}
	// meshd's --wireguard-lazy-peers=auto is lazy above 256 peers
	// (cmd/meshd's lazyPeersAutoAbove).
	switch cfg.lazy {
	case "1":
		args = append(args, "--wireguard-lazy-peers")
		rep.title += ", --wireguard-lazy-peers"
		cfg.debugPeers = true
	case "0":
		args = append(args, "--wireguard-lazy-peers=false")
		rep.title += ", --wireguard-lazy-peers=false"
	default:
		cfg.debugPeers = mode == "full" && cfg.nodes-1 > 256
		if cfg.debugPeers {
			rep.title += ", lazy peers (auto)"
		}
	}

	hb, err := tb.StartFakeHeartbeats(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hb.Stop) // before the scenario's Reset deletes the Leases

	fakes := cfg.nodes - 3
	pre := fakes - cfg.burst
	half := cfg.locations / 2
	region := func(i int) string {
		if i < pre {
			return fmt.Sprintf("fake-%d", i%half)
		}
		return fmt.Sprintf("fake-%d", half+i%(cfg.locations-half))
	}
	all, err := testbed.FakeNodesWide("f", 0, fakes, region)
	if err != nil {
		t.Fatal(err)
	}
	if mode == "full" {
		// What a real node publishes after talking to its peers (in
		// location mesh only leaders have peers, a few each).
		if err := testbed.WithDiscovered(all, cfg.discovered); err != nil {
			t.Fatal(err)
		}
	}
	before, burst := all[:pre], all[pre:]
	if !cfg.silent {
		// The fakes answer as real nodes do: handshakes (on each one's
		// endpoint, with its key) and probes.
		stop, err := tb.StartFakeResponder(ctx, all, 51821)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}

	// 0. The first fakes, then meshd on the real nodes.
	t0 := time.Now()
	if err := tb.CreateFakeNodes(ctx, before, 50); err != nil {
		t.Fatal(err)
	}
	if err := hb.Add(before, 50); err != nil {
		t.Fatal(err)
	}
	rep.add("setup", fmt.Sprintf("%d fake Nodes and their Leases created in %.1f s", len(before), time.Since(t0).Seconds()))
	t0 = time.Now()
	s.startMeshd(nodes, args...)
	keys := map[string]string{}
	for _, n := range nodes {
		keys[n.Name] = s.pubKey(n)
	}
	leaders := func() []*testbed.Node {
		if mode == "full" {
			return nodes
		}
		var ls []*testbed.Node
		s.eventually(60*time.Second, 200*time.Millisecond, "a leader in locations a and b", func() error {
			ls = nil
			for _, n := range nodes {
				text, err := n.Metrics(ctx)
				if err != nil {
					return err
				}
				if metricSum(text, "meshd_leader") == 1 {
					ls = append(ls, n)
				}
			}
			if len(ls) != 2 {
				return fmt.Errorf("%d real leaders", len(ls))
			}
			return nil
		})
		return ls
	}()
	want := func(fs []testbed.FakeNode) keySet {
		ks := keySet{}
		for _, n := range leaders {
			ks[n.Name] = map[string]bool{}
			for _, o := range leaders {
				if o != n {
					ks[n.Name][keys[o.Name]] = true
				}
			}
		}
		if mode == "full" {
			for _, f := range fs {
				ks.add(f.PublicKey.String())
			}
			return ks
		}
		// Location mesh: per location, the live keyed node first in name
		// order leads (no fake prefers leadership or has a public IP).
		first := map[string]testbed.FakeNode{}
		for _, f := range fs {
			if cur, ok := first[f.Region]; !ok || f.Name < cur.Name {
				first[f.Region] = f
			}
		}
		for _, f := range first {
			ks.add(f.PublicKey.String())
		}
		return ks
	}
	wantBefore := want(before)
	took := benchWaitPeers(t, ctx, cfg, leaders, wantBefore, 120*time.Second, t0)
	rep.add("cold start", fmt.Sprintf("meshd started on 3 nodes among %d: full peer set (%d peers on leaders) after %s",
		3+len(before), len(wantBefore[leaders[0].Name]), fmtTook(took)))

	// 1. The burst.
	wantAll := want(all)
	r0 := s.reconciles(nodes)
	t0 = time.Now()
	created := make(chan error, 1)
	burstProfiled := make(chan error, 1)
	if cfg.profile != "" { // a CPU profile of n2 over the burst: what the daemons compete with the API server for
		go func() {
			burstProfiled <- benchProfile(ctx, nodes[1], "profile?seconds=15",
				filepath.Join(cfg.profile, fmt.Sprintf("%s-%d-%s.burst.cpu.pprof", mode, cfg.nodes, nodes[1].Name)), time.Minute)
		}()
	}
	var createdIn time.Duration
	go func() {
		err := tb.CreateFakeNodes(ctx, burst, 50)
		createdIn = time.Since(t0)
		if err == nil {
			err = hb.Add(burst, 50)
		}
		created <- err
	}()
	took = benchWaitPeers(t, ctx, cfg, leaders, wantAll, 120*time.Second, t0)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	r1 := s.reconciles(nodes)
	if cfg.profile != "" {
		if err := <-burstProfiled; err != nil {
			t.Errorf("CPU profile of the burst: %v", err)
		}
	}
	var rs []string
	for _, n := range nodes {
		rs = append(rs, fmt.Sprintf("%s %d", n.Name, r1[n.Name]-r0[n.Name]))
	}
	// The API server's pace bounds the burst: say also how long after the
	// last create the slowest daemon had the full peer set.
	last := slices.Max(slices.Collect(maps.Values(took)))
	rep.add("burst", fmt.Sprintf("%d Nodes join (creates with status in %.1f s, then Leases): full peer set (%d peers) after %s, the last %s; reconciles until then: %s (goal <= 10 s)",
		len(burst), createdIn.Seconds(), len(wantAll[leaders[0].Name]), fmtTook(took), sinceLastCreate(last-createdIn), strings.Join(rs, ", ")))

	// 2. Restart of meshd on n1 (a leader in both modes: first in name order).
	tStop := time.Now()
	if err := n1.StopMeshd(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(tStop)
	tStart := time.Now()
	if err := n1.StartMeshd(args...); err != nil {
		t.Fatal(err)
	}
	back := benchWaitPeers(t, ctx, cfg, []*testbed.Node{n1}, wantAll, 120*time.Second, tStart)[n1.Name]
	rep.add("restart", fmt.Sprintf("meshd on n1 among %d Nodes: SIGTERM to exit %d ms, start to full peer set (%d peers, new meshd0) %d ms (goal <= 5 s)",
		cfg.nodes, stopped.Milliseconds(), len(wantAll[n1.Name]), back.Milliseconds()))

	// 3. Propagation of one Node change.
	target := burst[0]
	if mode == "location" {
		for _, f := range all {
			if wantAll[n1.Name][f.PublicKey.String()] {
				target = f
				break
			}
		}
	}
	var lat []time.Duration
	perNode := map[string][]time.Duration{}
	for k := 0; k < cfg.changes; k++ {
		ep := netip4Port(target.Endpoint.Addr().String(), 40000+k)
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, testbed.AnnotationEndpoint, ep)
		t0 := time.Now()
		if _, err := tb.Kube.CoreV1().Nodes().Patch(ctx, target.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, n := range leaders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := poll(ctx, 60*time.Second, 20*time.Millisecond, func() error {
					ps, err := cfg.peers(ctx, n)
					if err != nil {
						return err
					}
					if got := ps[target.PublicKey.String()]; got != ep {
						return fmt.Errorf("endpoint of %s is %q, want %s", target.Name, got, ep)
					}
					return nil
				})
				d := time.Since(t0)
				if err != nil {
					t.Errorf("change %d on %s: %v", k, n.Name, err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				perNode[n.Name] = append(perNode[n.Name], d)
				mu.Unlock()
			}()
		}
		wg.Wait()
		time.Sleep(1500 * time.Millisecond) // let the coalescer idle again
	}
	if t.Failed() {
		t.FailNow()
	}
	rep.add("propagation", fmt.Sprintf("%d changes of %s's endpoint to %d real nodes: p50 %d ms, p99 %d ms, max %d ms (20 ms polling)",
		cfg.changes, target.Name, len(leaders), pct(lat, 50).Milliseconds(), pct(lat, 99).Milliseconds(), pct(lat, 100).Milliseconds()))

	// 4. Steady state.
	time.Sleep(cfg.settle)
	a0, w0, d0, h0 := s.apiWrites(), s.watchEvents(), s.daemonStats(nodes), time.Now()
	hbR0, hbF0 := hb.Counts()
	profiled := make(chan error, 1)
	if cfg.profile != "" { // a CPU profile of n2 over the window
		go func() {
			pn := nodes[1]
			for _, n := range nodes {
				if n.Name == os.Getenv("BENCH_PROFILE_NODE") {
					pn = n
				}
			}
			profiled <- benchProfile(ctx, pn, fmt.Sprintf("profile?seconds=%d", int(cfg.steady.Seconds())),
				filepath.Join(cfg.profile, fmt.Sprintf("%s-%d-%s.cpu.pprof", mode, cfg.nodes, pn.Name)), cfg.steady+time.Minute)
		}()
	}
	time.Sleep(cfg.steady)
	a1, w1, d1, elapsed := s.apiWrites(), s.watchEvents(), s.daemonStats(nodes), time.Since(h0)
	hbR1, hbF1 := hb.Counts()
	mins := elapsed.Minutes()
	if cfg.profile != "" {
		if err := <-profiled; err != nil {
			t.Errorf("CPU profile: %v", err)
		}
		for _, n := range nodes {
			base := filepath.Join(cfg.profile, fmt.Sprintf("%s-%d-%s", mode, cfg.nodes, n.Name))
			// What the RSS is made of: the mappings (before the heap
			// profile, whose symbolization faults in the executable's
			// tables), and the Go runtime's own figures (heap, stacks,
			// released pages).
			if err := copyFile(fmt.Sprintf("/proc/%d/smaps", n.Meshd().Pid()), base+".smaps"); err != nil {
				t.Errorf("smaps: %v", err)
			}
			if err := benchProfile(ctx, n, "heap", base+".heap.pprof", time.Minute); err != nil {
				t.Errorf("heap profile: %v", err)
			}
			if err := os.WriteFile(base+".metrics", []byte(d1[n.Name].metrics), 0o644); err != nil {
				t.Errorf("metrics: %v", err)
			}
		}
		rep.add("profiles", "CPU (n2, the steady window) and heap profiles, smaps and metrics (end of the window) in "+cfg.profile)
	}
	rep.add("steady", fmt.Sprintf("window %.0f s after %.0f s of settling; fake Lease renewals %d (%d failed)", elapsed.Seconds(), cfg.settle.Seconds(), hbR1-hbR0, hbF1-hbF0))
	for _, n := range nodes {
		x, y := d0[n.Name], d1[n.Name]
		cpu := (y.cpu - x.cpu).Seconds()
		rep.add("steady "+n.Name, fmt.Sprintf("reconciles %s (resync alone: %.0f), writes wireguard %s routes+rules %s iptables %s, API requests %s (writes %s), CPU %.2f s = %.2f%% of a core, RSS %.1f MB (anonymous %.1f, file %.1f; Go heap %.1f MB); WireGuard peers with a session: %s",
			y.delta(x, "meshd_reconciles_total", ""), elapsed.Seconds()/30,
			y.delta(x, "meshd_executor_writes_total", "wireguard"), y.delta(x, "meshd_executor_writes_total", "routes"), y.delta(x, "meshd_executor_writes_total", "iptables"),
			y.delta(x, "meshd_api_requests_total", ""), y.delta(x, "meshd_api_requests_total", "write"),
			cpu, 100*cpu/elapsed.Seconds(), float64(y.rss.total)/1e6, float64(y.rss.anon)/1e6, float64(y.rss.file)/1e6, y.heap/1e6,
			sessions(ctx, n)))
	}
	// What the real nodes publish for the others to cache and parse.
	var pubs []string
	for _, n := range nodes {
		obj, err := n.Object(ctx)
		if err != nil {
			t.Errorf("reading Node %s: %v", n.Name, err)
			continue
		}
		v := obj.Annotations[testbed.AnnotationDiscovered]
		var eps map[string]string
		if v != "" {
			if err := json.Unmarshal([]byte(v), &eps); err != nil {
				t.Errorf("%s: %s: %v", n.Name, testbed.AnnotationDiscovered, err)
			}
		}
		b, _ := json.Marshal(obj)
		pubs = append(pubs, fmt.Sprintf("%s %d (%.1f KB; its Node %.1f KB)", n.Name, len(eps), float64(len(v))/1e3, float64(len(b))/1e3))
	}
	fakeEps := 0
	if mode == "full" {
		fakeEps = min(cfg.discovered, len(all)-1)
	}
	rep.add("published", fmt.Sprintf("discovered endpoints on the real nodes' Nodes: %s; every fake's Node carries %d", strings.Join(pubs, ", "), fakeEps))
	var total float64
	var byRes []string
	for _, res := range slices.Sorted(maps.Keys(a1)) {
		d := a1[res] - a0[res]
		if d == 0 {
			continue
		}
		total += d
		byRes = append(byRes, fmt.Sprintf("%s %.2f", res, d/mins/float64(cfg.nodes)))
	}
	rep.add("API writes", fmt.Sprintf("cluster-wide %.2f per node per minute (goal <= 6, the Lease rate; by resource: %s); Node writes %.0f in the window (goal 0)",
		total/mins/float64(cfg.nodes), strings.Join(byRes, ", "), a1["nodes"]-a0["nodes"]))
	var watch []string
	for _, res := range slices.Sorted(maps.Keys(w1)) {
		if rate := (w1[res] - w0[res]) / elapsed.Seconds(); rate >= 0.05 {
			watch = append(watch, fmt.Sprintf("%s %.1f/s", res, rate))
		}
	}
	rep.add("watch events", fmt.Sprintf("sent by the API server (apiserver_watch_events_total; 3 real daemons watching): %s", strings.Join(watch, ", ")))
	rep.flush(cfg.out)
}

// raceNote warns in the report when meshd was built with the race
// detector (E2E_RACE unset): it multiplies CPU and memory several times
// (at 1,000 nodes in full mesh: 940 MB of RSS instead of 260-290 MB), so its figures
// are not meshd's. make bench-scale sets E2E_RACE=0.
func raceNote(bin string) string {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return " (BUILT WITH -race: CPU and RSS are the race detector's, not meshd's; run with E2E_RACE=0)"
		}
	}
	return ""
}

// benchPprofAddr is where meshd serves profiles in its node's namespace
// when BENCH_PROFILE is set.
const benchPprofAddr = "127.0.0.1:6060"

// benchProfile saves /debug/pprof/<what> of meshd on n to file.
func benchProfile(ctx context.Context, n *testbed.Node, what, file string, timeout time.Duration) error {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: testbed.NetnsDialer("/run/netns/" + n.NS), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+benchPprofAddr+"/debug/pprof/"+what, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s on %s: HTTP %d", what, n.Name, resp.StatusCode)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// copyFile copies src (a /proc file: read whole) to dst.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// benchReport collects the figures of one run and logs them together.
type benchReport struct {
	t     *testing.T
	title string
	lines []string
}

func (r *benchReport) add(what, text string) {
	line := fmt.Sprintf("%-12s %s", what+":", text)
	r.lines = append(r.lines, line)
	r.t.Log(line)
}

func (r *benchReport) flush(path string) {
	text := fmt.Sprintf("## %s (%s)\n\n```\n%s\n```\n\n", r.title, time.Now().UTC().Format(time.RFC3339), strings.Join(r.lines, "\n"))
	r.t.Logf("SUMMARY\n%s", text)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		r.t.Errorf("BENCH_OUT: %v", err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		r.t.Errorf("BENCH_OUT: %v", err)
	}
}

func fmtTook(took map[string]time.Duration) string {
	var ps []string
	for _, n := range slices.Sorted(maps.Keys(took)) {
		ps = append(ps, fmt.Sprintf("%s %d ms", n, took[n].Milliseconds()))
	}
	return strings.Join(ps, ", ")
}

func netip4Port(addr string, port int) string { return net.JoinHostPort(addr, strconv.Itoa(port)) }

// pct is the p-th percentile (nearest rank) of ds; p=100 is the maximum.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// benchWaitPeers is waitPeers over the UAPI socket (no process per poll:
// at 1,000 peers `wg show` in a loop would load the machine it measures).
func benchWaitPeers(t *testing.T, ctx context.Context, cfg benchConfig, nodes []*testbed.Node, want keySet, timeout time.Duration, t0 time.Time) map[string]time.Duration {
	t.Helper()
	var mu sync.Mutex
	took := map[string]time.Duration{}
	errs := map[string]error{}
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := poll(ctx, timeout, 50*time.Millisecond, func() error {
				ps, err := cfg.peers(ctx, n)
				if err != nil {
					return err
				}
				w := want[n.Name]
				for k := range ps {
					if !w[k] {
						return fmt.Errorf("unexpected peer %s", k)
					}
				}
				if len(ps) != len(w) {
					return fmt.Errorf("%d of %d peers", len(ps), len(w))
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			took[n.Name] = time.Since(t0)
			errs[n.Name] = err
		}()
	}
	wg.Wait()
	for _, n := range nodes {
		if errs[n.Name] != nil {
			t.Fatalf("%s: WireGuard peers not as expected within %s: %v", n.Name, timeout, errs[n.Name])
		}
	}
	return took
}

// peers reads the peers of a node's meshd0 (public key → endpoint): over
// UAPI, or with lazy peers from meshd's /debug/meshd, which lists every
// configured peer (the device holds the active ones only).
func (c benchConfig) peers(ctx context.Context, n *testbed.Node) (map[string]string, error) {
	if !c.debugPeers {
		return uapiPeers(n)
	}
	code, body, err := n.HTTPGet(ctx, "http://127.0.0.1:9477/debug/meshd")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("/debug/meshd: HTTP %d", code)
	}
	var st nodestate.State
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return nil, fmt.Errorf("/debug/meshd: %w", err)
	}
	if st.WireGuard.Error != "" {
		return nil, fmt.Errorf("/debug/meshd: %s", st.WireGuard.Error)
	}
	out := make(map[string]string, len(st.WireGuard.Peers))
	for _, p := range st.WireGuard.Peers {
		out[p.PublicKey] = p.Endpoint
	}
	return out, nil
}

// uapiPeers reads the peers of a node's meshd0 (public key → endpoint) over
// its WireGuard UAPI socket, which the node's private /run/wireguard puts
// under the node's directory.
func uapiPeers(n *testbed.Node) (map[string]string, error) {
	c, err := net.DialTimeout("unix", filepath.Join(n.Dir, "run", "wireguard", "meshd0.sock"), time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("get=1\n\n")); err != nil {
		return nil, err
	}
	out := map[string]string{}
	cur := ""
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "public_key":
			b, err := hex.DecodeString(v)
			if err != nil {
				return nil, fmt.Errorf("UAPI public_key %q: %w", v, err)
			}
			key, err := wgtypes.NewKey(b)
			if err != nil {
				return nil, err
			}
			cur = key.String()
			out[cur] = ""
		case "endpoint":
			if cur != "" {
				out[cur] = v
			}
		case "errno":
			if v != "0" {
				return nil, fmt.Errorf("UAPI errno %s", v)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("UAPI: no errno line: %v", sc.Err())
}

// daemonSample is one reading of a daemon: its /metrics and /proc figures.
type daemonSample struct {
	metrics string
	cpu     time.Duration // utime+stime, with waited-for children
	rss     rss
	heap    float64 // go_memstats_heap_inuse_bytes
}

// sessions says how many of n's WireGuard peers ever completed a handshake
// (wg show dump): a peer without one holds its first packet queued, a
// 64 KB buffer, until WireGuard gives up.
func sessions(ctx context.Context, n *testbed.Node) string {
	d, err := n.WG(ctx, "meshd0")
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	done := 0
	for _, p := range d.Peers {
		if !p.LatestHandshake.IsZero() {
			done++
		}
	}
	return fmt.Sprintf("%d of %d", done, len(d.Peers))
}

func (s *scenario) daemonStats(nodes []*testbed.Node) map[string]daemonSample {
	s.t.Helper()
	out := map[string]daemonSample{}
	cpu := s.procCPU(nodes)
	for _, n := range nodes {
		text, err := n.Metrics(s.ctx)
		if err != nil {
			s.t.Fatalf("metrics of %s: %v", n.Name, err)
		}
		out[n.Name] = daemonSample{metrics: text, cpu: cpu[n.Name].meshd.all(), rss: procRSS(n.Meshd().Pid()), heap: metricSum(text, "go_memstats_heap_inuse_bytes")}
	}
	return out
}

// delta is the growth of a counter between two samples: all series, or
// those with the label value sel ("write": methods POST, PUT, PATCH,
// DELETE), or "n/a" when this meshd does not export it.
func (y daemonSample) delta(x daemonSample, name, sel string) string {
	if !strings.Contains(y.metrics, "\n"+name) {
		return "n/a"
	}
	sum := func(text string) float64 {
		v := 0.0
		for _, l := range strings.Split(text, "\n") {
			if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
				continue
			}
			switch {
			case sel == "write":
				if !strings.Contains(l, `method="POST"`) && !strings.Contains(l, `method="PUT"`) && !strings.Contains(l, `method="PATCH"`) && !strings.Contains(l, `method="DELETE"`) {
					continue
				}
			case sel != "":
				if !strings.Contains(l, `="`+sel+`"`) {
					continue
				}
			}
			f := strings.Fields(l)
			if n, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				v += n
			}
		}
		return v
	}
	return strconv.FormatFloat(sum(y.metrics)-sum(x.metrics), 'f', -1, 64)
}

// rss is a process's resident set: VmRSS, and its anonymous (heap, stacks)
// and file-backed (the executable's pages) parts, in bytes.
type rss struct{ total, anon, file int64 }

func procRSS(pid int) rss {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return rss{}
	}
	var r rss
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			r.total = kb * 1024
		case "RssAnon:":
			r.anon = kb * 1024
		case "RssFile:":
			r.file = kb * 1024
		}
	}
	return r
}

// apiWrites reads the API server's apiserver_request_total and sums the
// write requests (POST, PUT, PATCH, DELETE, APPLY) by resource.
func (s *scenario) apiWrites() map[string]float64 {
	s.t.Helper()
	b := s.apiMetrics()
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "apiserver_request_total{") {
			continue
		}
		labels := promLabels(l)
		switch labels["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		default:
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			res := labels["resource"]
			if sub := labels["subresource"]; sub != "" {
				res += "/" + sub
			}
			out[res] += v
		}
	}
	return out
}

// watchEvents reads the API server's apiserver_watch_events_total by
// resource (kind on older servers).
func (s *scenario) watchEvents() map[string]float64 {
	s.t.Helper()
	b := s.apiMetrics()
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "apiserver_watch_events_total{") {
			continue
		}
		labels := promLabels(l)
		res := cmpOr(labels["resource"], labels["kind"])
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			out[res] += v
		}
	}
	return out
}

// apiMetrics reads the API server's /metrics, retrying: on a loaded
// machine one request may time out.
func (s *scenario) apiMetrics() []byte {
	s.t.Helper()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var b []byte
		if b, err = tb.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(s.ctx); err == nil {
			return b
		}
		time.Sleep(2 * time.Second)
	}
	s.t.Fatalf("API server metrics: %v", err)
	return nil
}

// promLabels parses the labels of one Prometheus text line.
func promLabels(line string) map[string]string {
	out := map[string]string{}
	start, end := strings.IndexByte(line, '{'), strings.LastIndexByte(line, '}')
	if start < 0 || end < start {
		return out
	}
	for _, kv := range splitLabels(line[start+1 : end]) {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			out[k], _ = strconv.Unquote(v)
		}
	}
	return out
}

func splitLabels(s string) []string {
	var out []string
	inQ, esc, from := false, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case esc:
			esc = false
		case c == '\\':
			esc = true
		case c == '"':
			inQ = !inQ
		case c == ',' && !inQ:
			out = append(out, s[from:i])
			from = i + 1
		}
	}
	if from < len(s) {
		out = append(out, s[from:])
	}
	sort.Strings(out)
	return out
}
