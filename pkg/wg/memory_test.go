package wg

import (
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// memReport is one process's memory, in bytes.
type memReport struct {
	RSS         uint64 // VmRSS as found, before any collection
	HeapInuse   uint64 // after two collections (sync.Pool keeps its contents through one)
	HeapAlloc   uint64 // live heap after two collections
	Sys         uint64 // everything the Go runtime got from the OS
	RSSReleased uint64 // VmRSS after the collection and debug.FreeOSMemory
}

func readMem() memReport {
	var m memReport
	m.RSS = vmRSS()
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.HeapInuse, m.HeapAlloc, m.Sys = ms.HeapInuse, ms.HeapAlloc, ms.Sys
	debug.FreeOSMemory()
	m.RSSReleased = vmRSS()
	return m
}

// vmRSS is this process's resident set size from /proc/self/status.
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// BenchmarkInProcessMemory measures the memory of one in-process device
// with 1,000 peers (MESHD_WG_MEMORY_PEERS), as a node of a 1,000-node full
// mesh holds: node a has b and 998 more peers without endpoints, b has a.
// Each device runs in a process of its own (TestThroughputHelper), like a
// daemon. It reports a's memory idle after the handshake, then after a TCP
// stream a→b through the tunnel for MESHD_WG_MEMORY_SECONDS (default 3),
// and that stream's throughput. Needs root; run with -benchtime=1x:
//
//	go test -run '^$' -bench InProcessMemory -benchtime=1x -count=3 ./pkg/wg
func BenchmarkInProcessMemory(b *testing.B) {
	requireRoot(b)
	peers := envInt("MESHD_WG_MEMORY_PEERS", 1000)
	secs := envInt("MESHD_WG_MEMORY_SECONDS", 3)
	lazy := os.Getenv("MESHD_WG_MEMORY_LAZY") == "1" // both helpers with Options.LazyPeers
	mb := func(v uint64) float64 { return float64(v) / 1e6 }
	for range b.N {
		na, nb := nodePair(b, 16)
		for i := 3; i <= peers; i++ {
			k, err := wgtypes.GeneratePrivateKey()
			if err != nil {
				b.Fatal(err)
			}
			ip := netip.AddrFrom4([4]byte{10, 77, byte(i >> 8), byte(i)})
			na.cfg.Peers = append(na.cfg.Peers, Peer{PublicKey: k.PublicKey(), AllowedIPs: []netip.Prefix{netip.PrefixFrom(ip, 32)}})
		}
		ha := startHelper(b, na.ns, na.name, na.cfg)
		hb := startHelper(b, nb.ns, nb.name, nb.cfg)
		if lazy {
			// No handshake before traffic: a ping starts it.
			if out, err := execIn(b, na.ns, "ping", "-c", "1", "-W", "5", "10.77.0.2"); err != nil {
				b.Fatalf("ping through the tunnel: %v\n%s", err, out)
			}
		}
		waitPeerHandshake(b, na, nb.cfg.PrivateKey.PublicKey(), 10*time.Second)
		idle := ha.mem(b)
		mbps := tcpStream(b, na, nb, time.Duration(secs)*time.Second)
		loaded := ha.mem(b)
		ha.stop()
		hb.stop()
		b.ReportMetric(mb(idle.RSS), "idle-rss-MB")
		b.ReportMetric(mb(idle.HeapInuse), "idle-heap-MB")
		b.ReportMetric(mb(loaded.RSS), "loaded-rss-MB")
		b.ReportMetric(mb(loaded.HeapInuse), "loaded-heap-MB")
		b.ReportMetric(mb(loaded.RSSReleased), "loaded-rss-released-MB")
		b.ReportMetric(mbps, "MB/s")
		b.Logf("%d peers: idle %+v; after %d s of TCP at %.0f MB/s %+v", peers, idle, secs, mbps, loaded)
	}
}

// waitPeerHandshake waits, over UAPI, for n's device to complete a
// handshake with the peer key.
func waitPeerHandshake(t testing.TB, n *node, key wgtypes.Key, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, p := range wgDevice(t, n.name).Peers {
			if p.PublicKey == key && !p.LastHandshakeTime.IsZero() {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: no handshake with %s within %v", n.name, key, timeout)
}

// tcpStream sends a TCP stream from a's tunnel address to b's for d and
// returns what b received, in MB/s.
func tcpStream(t testing.TB, a, b *node, d time.Duration) float64 {
	t.Helper()
	var ln net.Listener
	var err error
	inNS(b.ns, func() { ln, err = net.Listen("tcp", "10.77.0.2:5301") })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- 0
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	var c net.Conn
	inNS(a.ns, func() { c, err = net.DialTimeout("tcp", "10.77.0.2:5301", 5*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256<<10)
	start := time.Now()
	for time.Since(start) < d {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	n := <-got
	el := time.Since(start).Seconds()
	if n == 0 {
		t.Fatal("no bytes through the tunnel")
	}
	return float64(n) / el / 1e6
}
