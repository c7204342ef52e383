package wg

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// TestThroughput compares TCP throughput (iperf3) through two in-process
// meshd devices with two standalone wireguard-go processes, in the same run,
// over the same pair of namespaces joined by a veth. It runs only with
// MESHD_WG_THROUGHPUT=1 (see hack/wg-throughput.sh); MESHD_WG_THROUGHPUT_SECONDS
// and MESHD_WG_THROUGHPUT_ROUNDS tune it (default 5 s, 3 rounds each,
// alternating).
func TestThroughput(t *testing.T) {
	if os.Getenv("MESHD_WG_THROUGHPUT") != "1" {
		t.Skip("set MESHD_WG_THROUGHPUT=1 to measure throughput")
	}
	requireRoot(t)
	iperf, err := exec.LookPath("iperf3")
	if err != nil {
		t.Skip("iperf3 not installed")
	}
	secs := envInt("MESHD_WG_THROUGHPUT_SECONDS", 5)
	rounds := envInt("MESHD_WG_THROUGHPUT_ROUNDS", 3)

	bin := filepath.Join(t.TempDir(), "wireguard-go")
	build := exec.Command("go", "build", "-o", bin, "golang.zx2c4.com/wireguard")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building wireguard-go: %v\n%s", err, out)
	}
	log := testLoggerAt(t, slog.LevelInfo) // as in production: no per-event formatting
	a := &node{ns: newNSHandle(t)}
	b := &node{ns: newNSHandle(t)}
	veth(t, a.ns, b.ns, "198.51.100.1/24", "198.51.100.2/24")
	a.cfg = Config{PrivateKey: privKey(t), ListenPort: 51820, Addresses: pfx("10.77.0.1/24")}
	b.cfg = Config{PrivateKey: privKey(t), ListenPort: 51820, Addresses: pfx("10.77.0.2/24")}
	a.cfg.Peers = []Peer{{PublicKey: b.cfg.PrivateKey.PublicKey(), Endpoint: udp("198.51.100.2:51820"), AllowedIPs: pfx("10.77.0.2/32")}}
	b.cfg.Peers = []Peer{{PublicKey: a.cfg.PrivateKey.PublicKey(), Endpoint: udp("198.51.100.1:51820"), AllowedIPs: pfx("10.77.0.1/32")}}

	measure := func() float64 { return iperfGbps(t, iperf, a.ns, b.ns, secs) }

	// Each meshd device runs in a process of its own, like each node's
	// daemon (and like each wireguard-go below): this test binary re-run as
	// TestThroughputHelper, started inside the node's namespace.
	runMeshd := func() float64 {
		var stops []func()
		defer func() {
			for _, stop := range stops {
				stop()
			}
		}()
		for _, n := range []*node{a, b} {
			n.name = uniqueName(t)
			stops = append(stops, startHelper(t, n.ns, n.name, n.cfg).stop)
		}
		for _, n := range []*node{a, b} {
			n.dev = mustOpenIn(t, n.ns, Options{Name: n.name, Mode: ModeUserspace, Logger: log})
		}
		waitHandshake(t, a.dev, time.Time{}, 5*time.Second)
		defer func() { a.dev.Close(); b.dev.Close() }()
		return measure()
	}
	runWireguardGo := func() float64 {
		var procs []*exec.Cmd
		defer func() {
			for _, p := range procs {
				p.Process.Signal(syscall.SIGTERM)
				p.Wait()
			}
		}()
		for _, n := range []*node{a, b} {
			n.name = uniqueName(t)
			cmd := exec.Command(bin, "-f", n.name) // foreground, never WG_PROCESS_FOREGROUND=0
			cmd.Env = append(os.Environ(), "LOG_LEVEL=error")
			inNS(n.ns, func() { err = cmd.Start() })
			if err != nil {
				t.Fatal(err)
			}
			procs = append(procs, cmd)
			deadline := time.Now().Add(5 * time.Second)
			for !linkExists(t, n.ns, n.name) || socketGone(n.name) {
				if time.Now().After(deadline) {
					t.Fatal("wireguard-go did not start")
				}
				time.Sleep(20 * time.Millisecond)
			}
			// Configure it with the same code (it is adopted as external).
			n.dev = mustOpenIn(t, n.ns, Options{Name: n.name, Mode: ModeUserspace, MTU: 1420, Logger: log})
			if n.dev.Kind() != KindUserspaceExternal {
				t.Fatalf("wireguard-go device opened as %s", n.dev.Kind())
			}
		}
		for _, n := range []*node{a, b} {
			mustSet(t, n.dev, n.cfg)
		}
		waitHandshake(t, a.dev, time.Time{}, 5*time.Second)
		defer func() { a.dev.Delete(); b.dev.Delete() }()
		return measure()
	}

	var meshd, wggo, ratios []float64
	for i := range rounds {
		// Alternate which goes first: the machine is shared and noisy.
		var m, w float64
		if i%2 == 0 {
			m, w = runMeshd(), runWireguardGo()
		} else {
			w, m = runWireguardGo(), runMeshd()
		}
		meshd, wggo, ratios = append(meshd, m), append(wggo, w), append(ratios, m/w)
	}
	t.Logf("meshd in-process Gbit/s: median %.2f (rounds %.2f)", median(meshd), meshd)
	t.Logf("wireguard-go     Gbit/s: median %.2f (rounds %.2f)", median(wggo), wggo)
	t.Logf("ratio meshd/wireguard-go: median of paired rounds %.3f (rounds %.2f), of medians %.3f (target >= 0.95)",
		median(ratios), ratios, median(meshd)/median(wggo))
}

// TestThroughputHelper is the meshd side of TestThroughput and
// BenchmarkInProcessMemory: an in-process device configured from
// MESHD_WG_HELPER_CONFIG, run until stdin closes. Each line "mem" on stdin is
// answered with one line of JSON: the process's memory (memReport).
func TestThroughputHelper(t *testing.T) {
	name := os.Getenv("MESHD_WG_HELPER_NAME")
	if name == "" {
		t.Skip("helper process for TestThroughput")
	}
	js, err := os.ReadFile(os.Getenv("MESHD_WG_HELPER_CONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	if err := json.Unmarshal(js, &cfg); err != nil {
		t.Fatal(err)
	}
	d, err := Open(context.Background(), Options{Name: name, Mode: ModeUserspace, MTU: 1420, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), LazyPeers: os.Getenv("MESHD_WG_MEMORY_LAZY") == "1"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Delete()
	if d.Kind() != KindUserspaceInProcess {
		t.Fatalf("kind %s", d.Kind())
	}
	if err := d.Set(cfg); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("ready\n")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "mem" {
			js, _ := json.Marshal(readMem())
			os.Stdout.Write(append(js, '\n'))
		}
	}
}

// helperProc is a running TestThroughputHelper.
type helperProc struct {
	stop  func()
	stdin io.Writer
	out   *bufio.Reader
}

// mem asks the helper for its memory figures.
func (h *helperProc) mem(t testing.TB) memReport {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "mem\n"); err != nil {
		t.Fatal(err)
	}
	line, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var m memReport
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatalf("helper memory report %q: %v", line, err)
	}
	return m
}

func startHelper(t testing.TB, ns netns.NsHandle, name string, cfg Config) *helperProc {
	t.Helper()
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestThroughputHelper$", "-test.count=1")
	file := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(file, js, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "MESHD_WG_HELPER_NAME="+name, "MESHD_WG_HELPER_CONFIG="+file, "MESHD_WG_THROUGHPUT=")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	inNS(ns, func() { err = cmd.Start() }) // the whole process lives in ns
	if err != nil {
		t.Fatal(err)
	}
	stop := func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil || line != "ready\n" {
		stop()
		t.Fatalf("helper did not start: %q %v", line, err)
	}
	return &helperProc{stop: stop, stdin: stdin, out: out}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// iperfGbps measures TCP throughput (iperf3, secs seconds) from ns a to
// 10.77.0.2 served in ns b, in Gbit/s.
func iperfGbps(t *testing.T, iperf string, a, b netns.NsHandle, secs int) float64 {
	var err error
	srv := exec.Command(iperf, "-s", "-1", "-B", "10.77.0.2")
	inNS(b, func() { err = srv.Start() })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	var out []byte
	for try := 0; try < 50; try++ { // wait for the server
		time.Sleep(100 * time.Millisecond)
		var c net.Conn
		inNS(a, func() { c, err = net.DialTimeout("tcp", "10.77.0.2:5201", time.Second) })
		if err == nil {
			c.Close()
			break
		}
	}
	// The probe connection used up "-1"; restart the server.
	srv.Process.Kill()
	srv.Wait()
	srv = exec.Command(iperf, "-s", "-1", "-B", "10.77.0.2")
	inNS(b, func() { err = srv.Start() })
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	inNS(a, func() {
		out, err = exec.Command(iperf, "-c", "10.77.0.2", "-t", strconv.Itoa(secs), "-J").Output()
	})
	if err != nil {
		t.Fatalf("iperf3: %v\n%s", err, out)
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("iperf3 output: %v", err)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9
}
