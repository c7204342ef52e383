//go:build e2e

// Package e2e holds meshd's end-to-end scenarios. They need root and run
// against the namespace testbed in e2e/testbed (see e2e/README.md):
//
//	go test -tags e2e -v -timeout 20m ./e2e/...
//
// Environment: E2E_PREFIX=xy- runs on a testbed of its own (default me2e-);
// E2E_KEEP=1 leaves the last testbed running (inspect with
// /tmp/me2e/kubectl and /tmp/me2e/nodes/<node>/exec); MESHD_CACHE moves the
// kube binaries cache.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"meshd.io/meshd/e2e/testbed"
)

var (
	tb             *testbed.Testbed
	meshdAvailable bool
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("e2e: skipped, needs root (network namespaces)")
		os.Exit(0)
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	ctx := context.Background()
	var err error
	// E2E_PREFIX lets two runs (say, two worktrees) share this machine:
	// each gets its own namespaces, directory and lock.
	tb, err = testbed.New(testbed.Config{Prefix: os.Getenv("E2E_PREFIX"), Logf: log.Printf})
	if err != nil {
		log.Fatal(err)
	}
	if err := tb.Lock(15 * time.Minute); err != nil {
		log.Fatal(err)
	}
	if err := tb.EnsureTools(ctx); err != nil {
		log.Fatal(err)
	}
	meshdAvailable = tb.MeshdSourcePresent()
	if !meshdAvailable {
		log.Printf("WARNING: ./cmd/meshd does not exist: scenarios that need meshd are skipped")
	}
	if err := tb.BuildBinaries(ctx, meshdAvailable); err != nil {
		log.Fatal(err)
	}
	// Ctrl-C: tear down before dying.
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigc
		log.Printf("interrupted: tearing the testbed down")
		_ = tb.Stop(context.Background())
		os.Exit(2)
	}()
	start := time.Now()
	if err := tb.Start(ctx); err != nil {
		_ = tb.Stop(ctx)
		log.Fatal(err)
	}
	log.Printf("control plane up in %s", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	if os.Getenv("E2E_KEEP") != "" {
		log.Printf("E2E_KEEP set: testbed left running in %s (kubectl: %s/kubectl); remove with: go run -tags e2e ./e2e/cmd/testbed down -prefix %s", tb.Dir, tb.Dir, tb.Prefix)
	} else if err := tb.Stop(ctx); err != nil {
		log.Printf("teardown: %v", err)
		if code == 0 {
			code = 1
		}
	}
	tb.Unlock()
	os.Exit(code)
}

// scenario is the per-test view of the shared testbed. Its cleanup prints
// diagnostics (meshd logs, wg show, routes, rules, iptables) of every node
// when the test failed, then resets the testbed (nodes, pods, objects).
type scenario struct {
	t   *testing.T
	ctx context.Context
	// adminExt is the outside host meshctlAdmin runs meshctl on (check_test.go).
	adminExt *testbed.External
	// noNodeDiagnostics: the test reset its nodes before asserting and its
	// failure message carries what matters, so the nodes' state is not
	// dumped after it (in a CI log's tail, it would hide the message).
	noNodeDiagnostics bool
}

func newScenario(t *testing.T, needMeshd bool) *scenario {
	t.Helper()
	if needMeshd && !meshdAvailable {
		t.Skip("./cmd/meshd does not exist yet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	s := &scenario{t: t, ctx: ctx}
	t.Cleanup(func() {
		if (t.Failed() && !s.noNodeDiagnostics) || os.Getenv("E2E_DIAG") != "" {
			s.dumpNodes(60)
		}
		if os.Getenv("E2E_KEEP") != "" && t.Failed() {
			t.Logf("E2E_KEEP: not resetting after failure; testbed in %s", tb.Dir)
			cancel()
			return
		}
		if err := tb.Reset(context.Background()); err != nil {
			t.Errorf("reset: %v", err)
		}
		cancel()
	})
	return s
}

// dumpNodes logs every node's diagnostics with the last lines of its meshd
// log.
func (s *scenario) dumpNodes(lines int) {
	for _, n := range tb.Nodes() {
		s.t.Logf("\n%s", n.Diagnostics(context.Background(), lines))
	}
}

func (s *scenario) location(name string, nat bool) *testbed.Location {
	s.t.Helper()
	l, err := tb.AddLocation(s.ctx, name, nat)
	if err != nil {
		s.t.Fatal(err)
	}
	return l
}

// node adds a node with one pod "p0".
func (s *scenario) node(o testbed.NodeOptions) *testbed.Node {
	s.t.Helper()
	n, err := tb.AddNode(s.ctx, o)
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := n.AddPod(s.ctx, "p0"); err != nil {
		s.t.Fatal(err)
	}
	return n
}

func pod(n *testbed.Node) *testbed.Pod { return n.Pods()[0] }

// startMeshd starts meshd on every node with args, then waits for all to be
// ready.
func (s *scenario) startMeshd(nodes []*testbed.Node, args ...string) {
	s.t.Helper()
	for _, n := range nodes {
		if err := n.StartMeshd(args...); err != nil {
			s.t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := n.WaitMeshdReady(s.ctx, 60*time.Second); err != nil {
			s.t.Fatal(err)
		}
	}
}

// eventually retries f every interval until it returns nil or timeout
// passes; then it fails the test with f's last error.
func (s *scenario) eventually(timeout, interval time.Duration, what string, f func() error) {
	s.t.Helper()
	if err := poll(s.ctx, timeout, interval, f); err != nil {
		s.t.Fatalf("%s: not true within %s: %v", what, timeout, err)
	}
}

func poll(ctx context.Context, timeout, interval time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(interval):
		}
	}
}

// annotation waits for meshd to publish the annotation on the node.
func (s *scenario) annotation(n *testbed.Node, key string) string {
	s.t.Helper()
	var v string
	s.eventually(30*time.Second, 250*time.Millisecond, fmt.Sprintf("node %s has annotation %s", n.Name, key), func() error {
		obj, err := tb.NodeObject(s.ctx, n.Name)
		if err != nil {
			return err
		}
		v = obj.Annotations[key]
		if v == "" {
			return fmt.Errorf("annotations: %v", obj.Annotations)
		}
		return nil
	})
	return v
}

func (s *scenario) pubKey(n *testbed.Node) string {
	return s.annotation(n, testbed.AnnotationPublicKey)
}

// pingEventually waits until from's pod answers pings to addr.
func (s *scenario) pingEventually(from *testbed.Pod, addr netip.Addr, timeout time.Duration) {
	s.t.Helper()
	s.eventually(timeout, 500*time.Millisecond, fmt.Sprintf("ping %s -> %s", from.NS, addr), func() error {
		return from.Ping(s.ctx, addr, 1)
	})
}

// pingOK pings count times and requires every answer.
func (s *scenario) pingOK(from *testbed.Pod, addr netip.Addr, count int) {
	s.t.Helper()
	if err := from.Ping(s.ctx, addr, count); err != nil {
		s.t.Fatalf("ping %s -> %s: %v", from.NS, addr, err)
	}
}

// pairs calls f for every ordered pair of distinct nodes.
func pairs(nodes []*testbed.Node, f func(a, b *testbed.Node)) {
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				f(a, b)
			}
		}
	}
}

// wgPeerCount returns the number of peers of meshd0 on n; -1 when the
// interface does not exist.
func (s *scenario) wgPeerCount(n *testbed.Node) int {
	d, err := n.WG(s.ctx, "meshd0")
	if err != nil {
		return -1
	}
	return len(d.Peers)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
