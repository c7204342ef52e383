package wg

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Tests of the kernel WireGuard device (Debian's wireguard.ko, as users run
// it). The development host has no wireguard module, so they skip there;
// `make e2e-kernel` (hack/e2e-kernel.sh) boots a real kernel in qemu and
// runs them with MESHD_WG_KERNEL=1, which turns the skip into a failure.

var kernelWG struct {
	once sync.Once
	err  error
}

// requireKernelWG skips (fails with MESHD_WG_KERNEL=1) unless a kernel
// WireGuard link can be created.
func requireKernelWG(t testing.TB) {
	t.Helper()
	requireRoot(t)
	kernelWG.once.Do(func() {
		var ns netns.NsHandle
		var nerr error
		if err := inNS(mustCurNS(t), func() { ns, nerr = netns.New() }); err != nil || nerr != nil {
			kernelWG.err = fmt.Errorf("new namespace: %v %v", err, nerr)
			return
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
		if err != nil {
			kernelWG.err = fmt.Errorf("opening netlink: %w", err)
			return
		}
		defer h.Close()
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "wgprobe0"
		kernelWG.err = h.LinkAdd(&netlink.Wireguard{LinkAttrs: attrs})
	})
	if kernelWG.err == nil {
		return
	}
	msg := fmt.Sprintf("no kernel WireGuard here (ip link add type wireguard: %v); `make e2e-kernel` runs this test on a real kernel in qemu", kernelWG.err)
	if os.Getenv("MESHD_WG_KERNEL") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func linkIn(t testing.TB, ns netns.NsHandle, name string) netlink.Link {
	t.Helper()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l
}

// The kernel device's whole life: created as a "wireguard" link with the
// MTU asked for, configured, left alone by an unchanged Set, one changed
// peer written as one call, MTU changed, kept with its configuration by
// Close (a daemon restart), adopted again without a single write, deleted,
// and restored by the next Open and Set.
func TestKernelLifecycle(t *testing.T) {
	requireKernelWG(t)
	ns := lockedNewNS(t) // wgctrl (generic netlink) talks to this thread's namespace
	name := uniqueName(t)
	log := testLogger(t)

	// auto picks the kernel when the module is there.
	d := mustOpenIn(t, ns, Options{Name: name, MTU: 1400, Logger: log})
	if d.Kind() != KindKernel {
		t.Fatalf("mode auto with a wireguard module: kind %q, want %q", d.Kind(), KindKernel)
	}
	l := linkIn(t, ns, name)
	if l.Type() != "wireguard" || l.Attrs().MTU != 1400 {
		t.Fatalf("created link: type %q MTU %d", l.Type(), l.Attrs().MTU)
	}
	cfg := rootConfig(t)
	mustSet(t, d, cfg)
	w := d.Writes()
	mustSet(t, d, cfg)
	if d.Writes() != w {
		t.Fatalf("re-applying an unchanged config made %d writes", d.Writes()-w)
	}
	dev := wgDevice(t, name)
	if dev.Type.String() != "Linux kernel" || dev.PublicKey != cfg.PrivateKey.PublicKey() || dev.ListenPort != 51820 || len(dev.Peers) != 3 {
		t.Fatalf("device %+v", dev)
	}
	checkPeers(t, dev, cfg.Peers)
	if l := linkIn(t, ns, name); l.Attrs().Flags&1 == 0 { // IFF_UP
		t.Fatal("link not up after Set")
	}

	// One changed peer: one write, only that peer.
	cfg.Peers[2].AllowedIPs = append(cfg.Peers[2].AllowedIPs, netip.MustParsePrefix("10.244.5.0/24"))
	mustSet(t, d, cfg)
	if d.Writes() != w+1 {
		t.Fatalf("one changed peer made %d writes", d.Writes()-w)
	}
	checkPeers(t, wgDevice(t, name), cfg.Peers)
	// A removed peer: one write.
	removed := cfg.Peers[1]
	cfg.Peers = append(cfg.Peers[:1:1], cfg.Peers[2])
	mustSet(t, d, cfg)
	if d.Writes() != w+2 {
		t.Fatalf("one removed peer made %d writes", d.Writes()-w-1)
	}
	dev = wgDevice(t, name)
	checkPeers(t, dev, cfg.Peers)
	for _, p := range dev.Peers {
		if p.PublicKey == removed.PublicKey {
			t.Fatal("removed peer still configured")
		}
	}
	// MTU: one netlink write.
	cfg.MTU = 1380
	mustSet(t, d, cfg)
	if d.Writes() != w+3 {
		t.Fatalf("changing the MTU made %d writes", d.Writes()-w-2)
	}
	if mtu := linkIn(t, ns, name).Attrs().MTU; mtu != 1380 {
		t.Fatalf("MTU %d, want 1380", mtu)
	}

	out, err := exec.Command("wg", "show", name).CombinedOutput()
	if err != nil || !strings.Contains(string(out), cfg.Peers[0].PublicKey.String()) {
		t.Fatalf("wg show: %v\n%s", err, out)
	}
	out, _ = exec.Command("ip", "-d", "link", "show", name).CombinedOutput()
	if !strings.Contains(string(out), "wireguard") {
		t.Fatalf("ip -d link show lacks wireguard:\n%s", out)
	}

	// Daemon restart: Close leaves the kernel link and its configuration;
	// the next Open adopts it and the same config writes nothing.
	index := d.LinkIndex()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if !linkExists(t, ns, name) {
		t.Fatal("Close removed the kernel interface")
	}
	if dev := wgDevice(t, name); dev.PublicKey != cfg.PrivateKey.PublicKey() || len(dev.Peers) != 2 {
		t.Fatalf("kernel device lost its configuration on Close: %+v", dev)
	}
	d2 := mustOpenIn(t, ns, Options{Name: name, Mode: ModeKernel, MTU: 1380, Logger: log})
	if d2.Kind() != KindKernel || d2.LinkIndex() != index {
		t.Fatalf("adopted: kind %q index %d, want %q %d", d2.Kind(), d2.LinkIndex(), KindKernel, index)
	}
	mustSet(t, d2, cfg)
	if d2.Writes() != 0 {
		t.Fatalf("adopted kernel device with the same config: %d writes", d2.Writes())
	}
	// userspace mode refuses a kernel link.
	if _, err := openIn(t, ns, Options{Name: name, Mode: ModeUserspace, Logger: log}); err == nil || !strings.Contains(err.Error(), "mode is userspace") {
		t.Fatalf("userspace mode over a kernel link: %v", err)
	}

	// Delete, then restore: a new link with the same key and peers.
	if err := d2.Delete(); err != nil {
		t.Fatal(err)
	}
	if linkExists(t, ns, name) {
		t.Fatal("interface survived Delete")
	}
	d3 := mustOpenIn(t, ns, Options{Name: name, Mode: ModeKernel, MTU: 1380, Logger: log})
	mustSet(t, d3, cfg)
	dev = wgDevice(t, name)
	if dev.PublicKey != cfg.PrivateKey.PublicKey() || dev.ListenPort != 51820 {
		t.Fatalf("restored device %+v", dev)
	}
	checkPeers(t, dev, cfg.Peers)
	if mtu := linkIn(t, ns, name).Attrs().MTU; mtu != 1380 {
		t.Fatalf("restored MTU %d", mtu)
	}
	if err := d3.Delete(); err != nil {
		t.Fatal(err)
	}
}

// WatchLink on a kernel WireGuard link: deleting it, re-creating it and
// taking it down each call changed; configuring it does not.
func TestKernelWatchLink(t *testing.T) {
	requireKernelWG(t)
	ns := newNSHandle(t)
	log := testLogger(t)
	calls := make(chan struct{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- watchLink(ctx, log, &ns, "meshd0", func() { calls <- struct{}{} }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watchLink: %v", err)
		}
	})
	drain := func() {
		time.Sleep(200 * time.Millisecond)
		for len(calls) > 0 {
			<-calls
		}
	}
	expect := func(what string) {
		t.Helper()
		select {
		case <-calls:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: changed not called", what)
		}
		drain()
	}
	none := func(what string) {
		t.Helper()
		select {
		case <-calls:
			t.Fatalf("%s: changed called", what)
		case <-time.After(500 * time.Millisecond):
		}
	}
	// The subscription starts asynchronously: open (create) until seen.
	var d *Device
	deadline := time.Now().Add(10 * time.Second)
	for {
		d = mustOpenIn(t, ns, Options{Name: "meshd0", Mode: ModeKernel, Logger: log})
		select {
		case <-calls:
		case <-time.After(300 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no call for a created kernel interface")
			}
			d.Delete()
			drain()
			continue
		}
		break
	}
	drain()
	cfg := rootConfig(t)
	mustSet(t, d, cfg) // up, addresses, peers
	none("configured and set up")
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkSetDown(linkIn(t, ns, "meshd0")); err != nil {
		t.Fatal(err)
	}
	expect("set down")
	if err := h.LinkDel(linkIn(t, ns, "meshd0")); err != nil {
		t.Fatal(err)
	}
	expect("deleted")
	d.Close()
	d = mustOpenIn(t, ns, Options{Name: "meshd0", Mode: ModeKernel, Logger: log})
	expect("created again")
	d.Delete()
	expect("deleted by Delete")
}

// kernelPair is two namespaces joined by a veth, each with a kernel device
// (or, for mixed, a userspace one on b).
func kernelPair(t testing.TB, log *slog.Logger, bMode Mode) (a, b *node) {
	t.Helper()
	a = &node{ns: newNSHandle(t), name: uniqueName(t)}
	b = &node{ns: newNSHandle(t), name: uniqueName(t)}
	veth(t, a.ns, b.ns, "198.51.100.1/24", "198.51.100.2/24")
	a.cfg = Config{PrivateKey: privKey(t), ListenPort: 51820, Addresses: pfx("10.77.0.1/24")}
	b.cfg = Config{PrivateKey: privKey(t), ListenPort: 51820, Addresses: pfx("10.77.0.2/24")}
	a.cfg.Peers = []Peer{{PublicKey: b.cfg.PrivateKey.PublicKey(), Endpoint: udp("198.51.100.2:51820"), AllowedIPs: pfx("10.77.0.2/32")}}
	b.cfg.Peers = []Peer{{PublicKey: a.cfg.PrivateKey.PublicKey(), Endpoint: udp("198.51.100.1:51820"), AllowedIPs: pfx("10.77.0.1/32")}}
	a.dev = mustOpenIn(t, a.ns, Options{Name: a.name, Mode: ModeKernel, MTU: 1420, Logger: log})
	b.dev = mustOpenIn(t, b.ns, Options{Name: b.name, Mode: bMode, MTU: 1420, Logger: log})
	t.Cleanup(func() { a.dev.Delete(); b.dev.Delete() })
	return a, b
}

// Traffic through kernel devices, kernel to kernel and kernel to the
// in-process userspace device: the first handshake starts without traffic
// (the keepalive nudge works on the kernel too), then ping and TCP; a
// restart (Close and Open) of the kernel side keeps the session: no new
// handshake is needed and traffic flows at once.
func TestKernelTunnel(t *testing.T) {
	requireKernelWG(t)
	for _, mode := range []Mode{ModeKernel, ModeUserspace} {
		t.Run("kernel-"+string(mode), func(t *testing.T) {
			log := testLogger(t)
			a, b := kernelPair(t, log, mode)
			wantB := KindKernel
			if mode == ModeUserspace {
				wantB = KindUserspaceInProcess
			}
			if a.dev.Kind() != KindKernel || b.dev.Kind() != wantB {
				t.Fatalf("kinds %s, %s", a.dev.Kind(), b.dev.Kind())
			}
			start := time.Now()
			mustSet(t, a.dev, a.cfg)
			mustSet(t, b.dev, b.cfg)
			waitHandshake(t, a.dev, start, 10*time.Second)
			if out, err := execIn(t, a.ns, "ping", "-c", "2", "-i", "0.2", "-W", "2", "10.77.0.2"); err != nil {
				t.Fatalf("ping through the tunnel: %v\n%s", err, out)
			}
			tcpEcho(t, a.ns, b.ns, "10.77.0.2:7777")
			tcpEcho(t, b.ns, a.ns, "10.77.0.1:7777")

			// Restart the kernel side's daemon: the device outlives it.
			st, _ := a.dev.Stats()
			hs := st[0].LastHandshake
			a.dev.Close()
			a.dev = mustOpenIn(t, a.ns, Options{Name: a.name, Mode: ModeAuto, MTU: 1420, Logger: log})
			mustSet(t, a.dev, a.cfg)
			if a.dev.Writes() != 0 {
				t.Fatalf("restart: %d writes to an unchanged kernel device", a.dev.Writes())
			}
			if out, err := execIn(t, a.ns, "ping", "-c", "1", "-W", "2", "10.77.0.2"); err != nil {
				t.Fatalf("ping after restart: %v\n%s", err, out)
			}
			st, _ = a.dev.Stats()
			if !st[0].LastHandshake.Equal(hs) {
				t.Fatalf("the restart needed a new handshake (%v, before %v)", st[0].LastHandshake, hs)
			}
		})
	}
}

// checkPeers asserts the device has exactly the desired peers: keys,
// endpoints where desired, keepalive and allowed IPs.
func checkPeers(t testing.TB, dev *wgtypes.Device, want []Peer) {
	t.Helper()
	if len(dev.Peers) != len(want) {
		t.Fatalf("device has %d peers, want %d", len(dev.Peers), len(want))
	}
	for _, w := range want {
		i := slices.IndexFunc(dev.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == w.PublicKey })
		if i < 0 {
			t.Fatalf("peer %s missing", w.PublicKey)
		}
		p := dev.Peers[i]
		if w.Endpoint != nil && udpToAddrPort(p.Endpoint) != udpToAddrPort(w.Endpoint) {
			t.Errorf("peer %s: endpoint %v, want %v", w.PublicKey, p.Endpoint, w.Endpoint)
		}
		if p.PersistentKeepaliveInterval != w.PersistentKeepalive.Truncate(time.Second) {
			t.Errorf("peer %s: keepalive %v, want %v", w.PublicKey, p.PersistentKeepaliveInterval, w.PersistentKeepalive)
		}
		wantIPs, _ := normalizePrefixes(w.AllowedIPs)
		if got := normalizeIPNets(p.AllowedIPs); !slices.Equal(got, wantIPs) {
			t.Errorf("peer %s: allowed IPs %v, want %v", w.PublicKey, got, wantIPs)
		}
	}
}

// TestKernelThroughput compares TCP throughput (iperf3) through a pair of
// kernel devices with a pair of in-process userspace devices (each in a
// process of its own, like a node's daemon), in the same run over the same
// veth, rounds alternating. It reports the ratio kernel/userspace; under
// qemu's software emulation (TCG) the absolute figures say little about real
// hardware. It runs only with MESHD_WG_THROUGHPUT=1 (make e2e-kernel sets it
// in the guest); MESHD_WG_THROUGHPUT_SECONDS and MESHD_WG_THROUGHPUT_ROUNDS
// tune it.
func TestKernelThroughput(t *testing.T) {
	if os.Getenv("MESHD_WG_THROUGHPUT") != "1" {
		t.Skip("set MESHD_WG_THROUGHPUT=1 to measure throughput")
	}
	requireKernelWG(t)
	iperf, err := exec.LookPath("iperf3")
	if err != nil {
		t.Fatal("iperf3 not installed (hack/ensure-deps.sh installs it)")
	}
	secs := envInt("MESHD_WG_THROUGHPUT_SECONDS", 5)
	rounds := envInt("MESHD_WG_THROUGHPUT_ROUNDS", 3)
	log := testLoggerAt(t, slog.LevelInfo)
	a := &node{ns: newNSHandle(t)}
	b := &node{ns: newNSHandle(t)}
	veth(t, a.ns, b.ns, "198.51.100.1/24", "198.51.100.2/24")
	a.cfg = Config{PrivateKey: privKey(t), ListenPort: 51820, Addresses: pfx("10.77.0.1/24")}
	b.cfg = Config{PrivateKey: privKey(t), ListenPort: 51820, Addresses: pfx("10.77.0.2/24")}
	a.cfg.Peers = []Peer{{PublicKey: b.cfg.PrivateKey.PublicKey(), Endpoint: udp("198.51.100.2:51820"), AllowedIPs: pfx("10.77.0.2/32")}}
	b.cfg.Peers = []Peer{{PublicKey: a.cfg.PrivateKey.PublicKey(), Endpoint: udp("198.51.100.1:51820"), AllowedIPs: pfx("10.77.0.1/32")}}

	userspace := func() float64 {
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
		defer func() { a.dev.Close(); b.dev.Close() }()
		waitHandshake(t, a.dev, time.Time{}, 10*time.Second)
		return iperfGbps(t, iperf, a.ns, b.ns, secs)
	}
	kernel := func() float64 {
		for _, n := range []*node{a, b} {
			n.name = uniqueName(t)
			n.dev = mustOpenIn(t, n.ns, Options{Name: n.name, Mode: ModeKernel, MTU: 1420, Logger: log})
			if n.dev.Kind() != KindKernel {
				t.Fatalf("kind %s", n.dev.Kind())
			}
			mustSet(t, n.dev, n.cfg)
		}
		defer func() { a.dev.Delete(); b.dev.Delete() }()
		waitHandshake(t, a.dev, time.Time{}, 10*time.Second)
		return iperfGbps(t, iperf, a.ns, b.ns, secs)
	}
	var ks, us, ratios []float64
	for i := range rounds {
		var k, u float64
		if i%2 == 0 {
			k, u = kernel(), userspace()
		} else {
			u, k = userspace(), kernel()
		}
		ks, us, ratios = append(ks, k), append(us, u), append(ratios, k/u)
	}
	t.Logf("kernel WireGuard     Gbit/s: median %.3f (rounds %.3f)", median(ks), ks)
	t.Logf("userspace in-process Gbit/s: median %.3f (rounds %.3f)", median(us), us)
	if median(us) == 0 {
		t.Fatalf("userspace throughput median 0 (rounds %.3f)", us)
	}
	t.Logf("ratio kernel/userspace: of medians %.2f, paired rounds %.2f (%s; under emulation the absolute figures say little)",
		median(ks)/median(us), ratios, kernelVersion())
}

func kernelVersion() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "kernel ?"
	}
	return "kernel " + strings.TrimSpace(string(b))
}

// TestKernelKeyRotationLosesNothing is TestRootKeyRotationLosesNothing on
// kernel WireGuard: the kernel, too, keeps receiving on the old sessions and
// queues the rotated side's packets until the peer follows.
func TestKernelKeyRotationLosesNothing(t *testing.T) {
	requireKernelWG(t)
	a, b := kernelPair(t, testLoggerAt(t, 0), ModeKernel)
	keyRotationLosesNothing(t, a, b)
}
