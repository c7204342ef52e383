//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/mesh"
)

// TestBenchLinks is the cluster-link benchmark (make bench-links;
// docs/scale.md, "Linked clusters"). It reports figures and asserts none.
//
// The linked cluster is the testbed's main cluster with BENCH_LINK_REMOTE
// (50) fake Nodes whose heartbeat Leases are renewed every 10 s, linked
// (GrantLink, what `meshctl link` runs) to a cluster of BENCH_LINK_NODES
// (50) nodes. From an outside host, for each mode in turn:
//   - nodes: what main's meshd did, each node of the linking cluster
//     watching the linked one: BENCH_LINK_NODES copies of the node
//     daemon's link watch (e2etool linkload -mode nodes);
//   - controller: the link controller, once for the cluster (e2etool
//     linkload -mode controller);
//   - idle: nothing (the baseline of the testbed itself).
//
// After BENCH_LINK_SETTLE (20s) it reads the linked API server's own
// /metrics at the start and end of a BENCH_LINK_WINDOW (2m) window: the
// open watches (apiserver_longrunning_requests, verb WATCH) on nodes and
// leases, and per minute the read requests (apiserver_request_total, verbs
// LIST, WATCH, GET) and watch events sent (apiserver_watch_events_total)
// for nodes and leases. The setup requests (from the start to the end of
// the settle time) are reported too.
func TestBenchLinks(t *testing.T) {
	if os.Getenv("BENCH_LINKS") == "" {
		t.Skip("the cluster-link benchmark runs with make bench-links (BENCH_LINKS=1)")
	}
	num := func(name string, def int) int {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", name, v)
			}
			return n
		}
		return def
	}
	dur := func(name string, def time.Duration) time.Duration {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				t.Fatalf("%s=%q: want a duration", name, v)
			}
			return d
		}
		return def
	}
	nodes, remote := num("BENCH_LINK_NODES", 50), num("BENCH_LINK_REMOTE", 50)
	settle, window := dur("BENCH_LINK_SETTLE", 20*time.Second), dur("BENCH_LINK_WINDOW", 2*time.Minute)

	s := newScenario(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // longer than a scenario's default
	t.Cleanup(cancel)
	s.ctx = ctx
	hb, err := tb.StartFakeHeartbeats(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hb.Stop)
	fakes, err := testbed.FakeNodesWide("lf", 0, remote, func(i int) string { return fmt.Sprintf("fake-%d", i%5) })
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.CreateFakeNodes(ctx, fakes, 20); err != nil {
		t.Fatal(err)
	}
	if err := hb.Add(fakes, 20); err != nil {
		t.Fatal(err)
	}

	// The link Secret the linking cluster would hold.
	to := &connect.Clients{Kube: fake.NewClientset()}
	settings := clusterlink.LinkSettings{Name: "remote", Granularity: mesh.GranularityLocation, Port: mesh.DefaultPort,
		TopologyLabel: testbed.LabelRegion, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix(testbed.ServiceCIDR)},
		MeshCIDRs: []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}}
	if err := clusterlink.GrantLink(ctx, s.clients(tb.RESTConfig), settings, "", to, "local", testbed.LeaseNamespace); err != nil {
		t.Fatal(err)
	}
	sec, err := to.Kube.CoreV1().Secrets(testbed.LeaseNamespace).Get(ctx, clusterlink.LinkSecretPrefix+"remote", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	host, err := tb.AddExternal(ctx, "linkload")
	if err != nil {
		t.Fatal(err)
	}
	secFile := filepath.Join(host.Dir, "link-secret.json")
	b, _ := json.Marshal(sec)
	if err := os.WriteFile(secFile, b, 0o600); err != nil {
		t.Fatal(err)
	}

	var report []string
	for _, mode := range []string{"idle", "nodes", "controller"} {
		m0 := s.apiMetrics()
		var p *testbed.Proc
		if mode != "idle" {
			p, err = host.Start("linkload-"+mode, tb.ToolBinary, "linkload", "-mode", mode, "-n", strconv.Itoa(nodes),
				"-duration", (settle + window + 30*time.Second).String(), "-namespace", testbed.LeaseNamespace, secFile)
			if err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(settle)
		m1 := s.apiMetrics()
		time.Sleep(window)
		m2 := s.apiMetrics()
		if p != nil {
			p.Stop(10 * time.Second)
			t.Logf("%s: %s", mode, testbed.Tail(p.LogPath, 3))
		}
		setup := readRequests(m1).minus(readRequests(m0))
		steady := readRequests(m2).minus(readRequests(m1))
		events := watchEventCounts(m2).minus(watchEventCounts(m1))
		watches := openWatches(m2)
		perMin := func(v float64) string { return fmt.Sprintf("%.1f", v/window.Minutes()) }
		what := map[string]string{
			"idle":       "nothing linked (the testbed's own traffic)",
			"nodes":      fmt.Sprintf("main: %d nodes, each watching the linked cluster", nodes),
			"controller": "the link controller, once for the cluster",
		}[mode]
		line := fmt.Sprintf("| %s | %s | %.0f / %.0f | %.0f | %s | %s | %s |", mode, what,
			watches["nodes"], watches["leases"], setup.total(), perMin(steady.total()), steady.String(window), perMin(events.total()))
		report = append(report, line)
		t.Log(line)
		time.Sleep(5 * time.Second) // the load's watches close
	}
	out := fmt.Sprintf("Linked cluster: %d fake Nodes (heartbeats every 10 s); linking cluster: %d nodes; settle %s, window %s\n\n"+
		"| mode | who watches the linked cluster | open watches nodes / leases | read requests during setup | read requests / min | by verb and resource / min | watch events sent / min |\n"+
		"|---|---|---|---|---|---|---|\n%s\n", remote, nodes, settle, window, strings.Join(report, "\n"))
	t.Logf("\n%s", out)
	if f := os.Getenv("BENCH_OUT"); f != "" {
		if fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(fh, out)
			fh.Close()
		}
	}
}

// counts are metric values by a key (verb resource, or resource).
type counts map[string]float64

func (c counts) minus(o counts) counts {
	out := counts{}
	for k, v := range c {
		if d := v - o[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func (c counts) total() float64 {
	t := 0.0
	for _, v := range c {
		t += v
	}
	return t
}

// String lists the non-zero counts per minute of window.
func (c counts) String(window time.Duration) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, c[k]/window.Minutes()))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// metricLines calls f with the labels and value of each line of metric.
func metricLines(text []byte, metric string, f func(labels map[string]string, v float64)) {
	for _, l := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(l, metric+"{") {
			continue
		}
		fs := strings.Fields(l)
		if v, err := strconv.ParseFloat(fs[len(fs)-1], 64); err == nil {
			f(promLabels(l), v)
		}
	}
}

// readRequests are apiserver_request_total's reads of nodes and leases, by
// "VERB resource".
func readRequests(text []byte) counts {
	out := counts{}
	metricLines(text, "apiserver_request_total", func(l map[string]string, v float64) {
		switch l["verb"] {
		case "LIST", "WATCH", "GET":
		default:
			return
		}
		if r := l["resource"]; r == "nodes" || r == "leases" {
			out[l["verb"]+" "+r] += v
		}
	})
	return out
}

// watchEventCounts are apiserver_watch_events_total of nodes and leases.
func watchEventCounts(text []byte) counts {
	out := counts{}
	metricLines(text, "apiserver_watch_events_total", func(l map[string]string, v float64) {
		if r := cmpOr(l["resource"], l["kind"]); r == "nodes" || r == "leases" || r == "Node" || r == "Lease" {
			out[strings.ToLower(strings.TrimSuffix(r, "s"))+"s"] += v
		}
	})
	return out
}

// openWatches are apiserver_longrunning_requests of verb WATCH on nodes
// and leases.
func openWatches(text []byte) counts {
	out := counts{}
	metricLines(text, "apiserver_longrunning_requests", func(l map[string]string, v float64) {
		if l["verb"] == "WATCH" && (l["resource"] == "nodes" || l["resource"] == "leases") {
			out[l["resource"]] += v
		}
	})
	return out
}
