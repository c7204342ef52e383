//go:build e2e

// Package testbed builds a throw-away Kubernetes "cluster" out of Linux
// network namespaces on one machine, for meshd's end-to-end tests and for
// `make demo`. See e2e/README.md for the design.
//
// Everything it creates carries Config.Prefix: network namespaces
// (PREFIX+"router", PREFIX+"cp", PREFIX+<node>, PREFIX+<node>-<pod>, ...),
// and lives under Config.Dir. Bridges and veths live inside those
// namespaces, never in the host namespace; the host's routing, addresses and
// sysctls are not touched (the only host-side trace is the empty directory
// /run/wireguard used as a bind-mount target).
//
// Out of scope: test assertions (the e2e tests in e2e/ make them) and any
// change to the host outside the namespaces it creates.
package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Config configures a testbed.
type Config struct {
	// Prefix of every namespace the testbed creates. Default "me2e-".
	Prefix string
	// Dir holds the testbed's files (etcd data, certificates, kubeconfig,
	// logs, per-node directories). It is wiped on Start. Default
	// /tmp/<prefix without dash>.
	Dir string
	// RepoRoot is the meshd repository (for manifests/crds, hack/ and
	// building cmd/meshd). Default: found by walking up from the working
	// directory to go.mod.
	RepoRoot string
	// KubeDir holds kube-apiserver (and kubectl). Default: the output of
	// hack/kube-binaries.sh --print-dir.
	KubeDir string
	// MeshdBinary is the meshd binary. Default Dir/bin/meshd, built by
	// BuildBinaries.
	MeshdBinary string
	// ToolBinary is the e2etool helper. Default Dir/bin/e2etool.
	ToolBinary string
	// Logf receives progress messages. Default: discard.
	Logf func(format string, args ...any)
}

// Fixed addresses of the testbed (see e2e/README.md).
var (
	WANPrefix      = netip.MustParsePrefix("203.0.113.0/24")
	WANPrefix6     = netip.MustParsePrefix("2001:db8:0:ff::/64")
	RouterWAN      = netip.MustParseAddr("203.0.113.1")
	RouterWAN6     = netip.MustParseAddr("2001:db8:0:ff::1")
	APIServerAddr  = netip.MustParseAddr("203.0.113.2")
	APIServerPort  = 6443
	ServiceCIDR    = "10.96.0.0/12"
	MeshCIDR       = "10.4.0.0/16"
	MeshCIDR6      = "fd4d::/64"
	LeaseNamespace = "meshd-system"
	// PeerSecretNamespace holds Peer preshared-key Secrets (meshd
	// --peer-secret-namespace, manifests/namespace.yaml).
	PeerSecretNamespace = "meshd-peers"
)

// Testbed is a running control plane (etcd + kube-apiserver in their own
// network namespace) behind a router namespace, to which locations, nodes,
// pods and external hosts are added.
type Testbed struct {
	Config

	// Kubeconfig is the path of the admin kubeconfig. Its server,
	// https://203.0.113.2:6443, is reachable from every namespace of the
	// testbed; from the host it is reachable only through RESTConfig (which
	// dials inside the control-plane namespace) or `ip netns exec`.
	Kubeconfig string
	// MeshdKubeconfig authenticates as the manifests' meshd ServiceAccount
	// (manifests/rbac.yaml applied as is), so every scenario proves that
	// the shipped RBAC is enough for meshd.
	MeshdKubeconfig string
	Token           string
	RESTConfig      *rest.Config
	Kube            kubernetes.Interface
	Dynamic         dynamic.Interface

	RouterNS string // PREFIX+"router"
	CPNS     string // PREFIX+"cp"

	mu        sync.Mutex
	procs     []*Proc // per scenario (stopped by Reset)
	cpProcs   []*Proc // etcd, kube-apiserver
	locations map[string]*Location
	nodes     map[string]*Node
	externals map[string]*External
	// fakeResponder is the host answering for the fakes
	// (StartFakeResponder; invalid: none, their prefix is blackholed).
	fakeResponder netip.Addr
	clusters      []*Cluster // extra clusters (AddCluster), per scenario
	nextNode      int
	nextExt       int
	lockFile      *os.File
}

func (c *Config) defaults() error {
	if c.Prefix == "" {
		c.Prefix = "me2e-"
	}
	if c.Dir == "" {
		c.Dir = "/tmp/" + strings.TrimSuffix(c.Prefix, "-")
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	if c.RepoRoot == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		for d := wd; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				c.RepoRoot = d
				break
			}
			if d == filepath.Dir(d) {
				return fmt.Errorf("cannot find go.mod above %s", wd)
			}
		}
	}
	// E2E_BIN_DIR: meshd and e2etool are prebuilt there (make e2e-kernel
	// builds them on the host; building inside an emulated VM is slow).
	binDir := filepath.Join(c.Dir, "bin")
	if d := os.Getenv("E2E_BIN_DIR"); d != "" {
		binDir = d
	}
	if c.MeshdBinary == "" {
		c.MeshdBinary = filepath.Join(binDir, "meshd")
	}
	if c.ToolBinary == "" {
		c.ToolBinary = filepath.Join(binDir, "e2etool")
	}
	return nil
}

// New validates cfg and returns a testbed that is not started yet.
func New(cfg Config) (*Testbed, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	quickRaceExit()
	return &Testbed{
		Config:    cfg,
		RouterNS:  cfg.Prefix + "router",
		CPNS:      cfg.Prefix + "cp",
		locations: map[string]*Location{},
		nodes:     map[string]*Node{},
		externals: map[string]*External{},
	}, nil
}

// EnsureTools runs hack/ensure-deps.sh and hack/kube-binaries.sh (both are
// quick no-ops once done) and fills KubeDir.
func (tb *Testbed) EnsureTools(ctx context.Context) error {
	tb.Logf("ensuring Debian packages (hack/ensure-deps.sh)")
	if _, err := run(ctx, "bash", filepath.Join(tb.RepoRoot, "hack", "ensure-deps.sh")); err != nil {
		return err
	}
	if tb.KubeDir == "" {
		tb.Logf("ensuring kube-apiserver and kubectl (hack/kube-binaries.sh; the first build takes minutes)")
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(tb.RepoRoot, "hack", "kube-binaries.sh"), "kube-apiserver", "kubectl")
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("hack/kube-binaries.sh: %w", err)
		}
		tb.KubeDir = strings.TrimSpace(string(out))
	}
	return nil
}

// MeshdSourcePresent reports whether ./cmd/meshd exists in the repository.
func (tb *Testbed) MeshdSourcePresent() bool {
	_, err := os.Stat(filepath.Join(tb.RepoRoot, "cmd", "meshd"))
	return err == nil
}

// quickRaceExit makes the binaries the testbed runs exit at once when built
// with -race: the race runtime otherwise sleeps atexit_sleep_ms (1 s by
// default) before every exit. A meshd stopped for a restart then stayed
// silent 1 s longer than the meshd users run, long enough for its probes'
// 2 s down verdict under load (TestFailoverLeaderKill lost 5 pings across
// b1's restart, 2026-11-29), and every meshctl and e2etool run paid the
// second too. Races are still reported as they happen, and a binary that
// reported one still exits 66. It sets GORACE for this process and what it
// starts, unless GORACE already says atexit_sleep_ms.
func quickRaceExit() {
	g := os.Getenv("GORACE")
	if strings.Contains(g, "atexit_sleep_ms") {
		return
	}
	os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
}

// BuildFlags are the `go build` flags of every binary the e2e suite runs:
// -race unless E2E_RACE=0, so a data race in meshd under real traffic is
// reported in its log and makes it exit 66, which a test that stops meshd
// sees. E2E_RACE=0 is for the timing scenarios the race detector slows too
// much (make e2e runs them in a pass of their own with it).
func BuildFlags() []string {
	if os.Getenv("E2E_RACE") == "0" {
		return nil
	}
	return []string{"-race"}
}

// BuildBinaries builds the e2etool helper and, if withMeshd, meshd into
// Dir/bin (with BuildFlags; with E2E_BIN_DIR set, it only checks the
// prebuilt ones there).
func (tb *Testbed) BuildBinaries(ctx context.Context, withMeshd bool) error {
	if os.Getenv("E2E_BIN_DIR") != "" {
		for _, b := range []string{tb.ToolBinary, tb.MeshdBinary} {
			if _, err := os.Stat(b); err != nil {
				return fmt.Errorf("E2E_BIN_DIR is set but: %w", err)
			}
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Join(tb.Dir, "bin"), 0o755); err != nil {
		return err
	}
	build := func(args ...string) []string {
		return append(append([]string{"go", "build"}, BuildFlags()...), args...)
	}
	builds := [][]string{build("-tags", "e2e", "-o", tb.ToolBinary, "./e2e/cmd/e2etool")}
	if withMeshd {
		builds = append(builds, build("-o", tb.MeshdBinary, "./cmd/meshd"))
	}
	for _, b := range builds {
		tb.Logf("building: %s", strings.Join(b, " "))
		cmd := exec.CommandContext(ctx, b[0], b[1:]...)
		cmd.Dir = tb.RepoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w\n%s", strings.Join(b, " "), err, out)
		}
	}
	return nil
}

// Lock takes an exclusive lock for this prefix so that two runs with the
// same prefix do not tear each other down; it waits up to timeout.
func (tb *Testbed) Lock(timeout time.Duration) error {
	path := "/run/lock/" + tb.Prefix + "testbed.lock"
	_ = os.MkdirAll("/run/lock", 0o755)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			tb.lockFile = f
			return nil
		}
		if time.Now().After(deadline) {
			f.Close()
			return fmt.Errorf("another testbed with prefix %q is running (lock %s held)", tb.Prefix, path)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Unlock releases Lock.
func (tb *Testbed) Unlock() {
	if tb.lockFile != nil {
		tb.lockFile.Close()
		tb.lockFile = nil
	}
}

// Start removes leftovers of earlier runs with the same prefix, then creates
// the router and control-plane namespaces, starts etcd and kube-apiserver,
// writes the kubeconfig, creates the lease namespace and installs the CRDs.
func (tb *Testbed) Start(ctx context.Context) error {
	if err := RemoveLeftovers(ctx, tb.Prefix, tb.Logf); err != nil {
		return err
	}
	// Keep bin/ (built binaries) but wipe everything else.
	if entries, err := os.ReadDir(tb.Dir); err == nil {
		for _, e := range entries {
			if e.Name() != "bin" {
				if err := os.RemoveAll(filepath.Join(tb.Dir, e.Name())); err != nil {
					return err
				}
			}
		}
	}
	for _, d := range []string{"logs", "pids", "nodes"} {
		if err := os.MkdirAll(filepath.Join(tb.Dir, d), 0o755); err != nil {
			return err
		}
	}
	// Bind-mount target for the per-node /var/run/wireguard (an empty
	// directory on the host; wg-quick and wireguard-go use it too).
	if err := os.MkdirAll("/run/wireguard", 0o700); err != nil {
		return err
	}
	if err := tb.setupRouter(ctx); err != nil {
		return err
	}
	if err := tb.startControlPlane(ctx); err != nil {
		return err
	}
	return nil
}

// Stop stops every process this testbed started and removes all of its
// namespaces. The directory is kept (logs).
func (tb *Testbed) Stop(ctx context.Context) error {
	tb.mu.Lock()
	procs := append(append([]*Proc(nil), tb.cpProcs...), tb.procs...)
	tb.mu.Unlock()
	var wg sync.WaitGroup
	for i := len(procs) - 1; i >= 0; i-- {
		wg.Add(1)
		go func(p *Proc) { defer wg.Done(); p.Stop(5 * time.Second) }(procs[i])
	}
	wg.Wait()
	return RemoveLeftovers(ctx, tb.Prefix, tb.Logf)
}

func (tb *Testbed) addProc(p *Proc) {
	tb.mu.Lock()
	tb.procs = append(tb.procs, p)
	tb.mu.Unlock()
}

func (tb *Testbed) startProc(name, logPath string, argv []string) (*Proc, error) {
	p, err := startProc(name, logPath, filepath.Join(tb.Dir, "pids"), argv)
	if err != nil {
		return nil, err
	}
	tb.addProc(p)
	return p, nil
}

// RemoveLeftovers kills every process inside a network namespace whose name
// starts with prefix (by pid, found with `ip netns pids`) and deletes those
// namespaces (pods first, the router last). Bridges and veths live inside
// them and disappear with them.
func RemoveLeftovers(ctx context.Context, prefix string, logf func(string, ...any)) error {
	if prefix == "" || len(prefix) < 3 {
		return fmt.Errorf("refusing to clean up with prefix %q", prefix)
	}
	names, err := listNetns(ctx, prefix)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return nil
	}
	if logf != nil {
		logf("removing %d namespaces with prefix %s", len(names), prefix)
	}
	// Kill processes (twice: a dying parent might have spawned one).
	for round := 0; round < 3; round++ {
		pids := map[int]bool{}
		for _, ns := range names {
			out, _ := run(ctx, "ip", "netns", "pids", ns)
			for _, f := range strings.Fields(out) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
					pids[pid] = true
				}
			}
		}
		if len(pids) == 0 {
			break
		}
		for pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		// Wait for them to vanish (our own children are reaped by their
		// Wait goroutines; others by init).
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			alive := 0
			for pid := range pids {
				if syscall.Kill(pid, 0) == nil && !isZombie(pid) {
					alive++
				}
			}
			if alive == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Delete namespaces: longest names (pods) first, router last.
	sort.Slice(names, func(i, j int) bool {
		ri, rj := names[i] == prefix+"router", names[j] == prefix+"router"
		if ri != rj {
			return rj
		}
		return len(names[i]) > len(names[j])
	})
	var errs []string
	for _, ns := range names {
		if _, err := run(ctx, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing namespaces: %s", strings.Join(errs, "; "))
	}
	return nil
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

func listNetns(ctx context.Context, prefix string) ([]string, error) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// netnsPath is the bind-mounted namespace file of ns.
func netnsPath(ns string) string { return "/run/netns/" + ns }
