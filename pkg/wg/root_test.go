package wg

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/internal/testlog"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (network namespaces, TUN); skipped by -short (make unit)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("no /dev/net/tun")
	}
}

// lockedNewNS moves the test's (locked) thread into a fresh network
// namespace and restores it in cleanup.
func lockedNewNS(t testing.TB) netns.NsHandle {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			t.Errorf("restoring network namespace: %v", err)
			return // keep the thread locked: Go discards it
		}
		orig.Close()
		ns.Close()
		runtime.UnlockOSThread()
	})
	return ns
}

// newNSHandle makes another fresh namespace without moving the test thread.
func newNSHandle(t testing.TB) netns.NsHandle {
	t.Helper()
	var ns netns.NsHandle
	var nerr error
	if err := inNS(mustCurNS(t), func() { ns, nerr = netns.New() }); err != nil || nerr != nil {
		t.Fatal(err, nerr)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func mustCurNS(t testing.TB) netns.NsHandle {
	ns, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func uniqueName(t testing.TB) string {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	name := "mwgt" + hex.EncodeToString(b)
	t.Cleanup(func() {
		if _, err := os.Stat(socketPath(name)); err == nil {
			t.Errorf("UAPI socket %s left behind", socketPath(name))
			os.Remove(socketPath(name))
		}
	})
	return name
}

// testLogger collects logs and prints them only if the test fails.
func testLogger(t testing.TB) *slog.Logger { return testLoggerAt(t, slog.LevelDebug) }

func testLoggerAt(t testing.TB, level slog.Level) *slog.Logger {
	buf := &testlog.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: level}))
}

func openIn(t testing.TB, ns netns.NsHandle, opts Options) (*Device, error) {
	t.Helper()
	var d *Device
	var oerr error
	if err := inNS(ns, func() { d, oerr = Open(context.Background(), opts) }); err != nil {
		t.Fatal(err)
	}
	return d, oerr
}

func mustOpenIn(t testing.TB, ns netns.NsHandle, opts Options) *Device {
	t.Helper()
	d, err := openIn(t, ns, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func linkExists(t testing.TB, ns netns.NsHandle, name string) bool {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	_, err = h.LinkByName(name)
	return err == nil
}

func wgDevice(t testing.TB, name string) *wgtypes.Device {
	t.Helper()
	c, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d, err := c.Device(name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func rootConfig(t testing.TB) Config {
	return Config{
		PrivateKey: privKey(t),
		ListenPort: 51820,
		Addresses:  pfx("10.77.0.1/24", "2001:db8:77::1/128"),
		Peers: []Peer{
			{PublicKey: privKey(t).PublicKey(), Endpoint: udp("198.51.100.11:51820"), AllowedIPs: pfx("10.77.0.2/32", "10.244.2.0/24")},
			{PublicKey: privKey(t).PublicKey(), Endpoint: udp("[2001:db8::12]:51820"), PersistentKeepalive: 25 * time.Second, AllowedIPs: pfx("10.77.0.3/32")},
			{PublicKey: privKey(t).PublicKey(), AllowedIPs: pfx("10.244.4.0/24", "2001:db8:77::4/128")},
		},
	}
}

func TestRootInProcessLifecycle(t *testing.T) {
	requireRoot(t)
	ns := lockedNewNS(t)
	name := uniqueName(t)
	log := testLogger(t)

	// Userspace mode: with auto, a kernel with the wireguard module gives a
	// kernel link, which (by design) outlives Close; TestKernelLifecycle
	// covers that device.
	d := mustOpenIn(t, ns, Options{Name: name, Mode: ModeUserspace, MTU: 1400, Logger: log})
	if d.Kind() != KindUserspaceInProcess {
		t.Fatalf("kind %q, want %q", d.Kind(), KindUserspaceInProcess)
	}
	if d.LinkIndex() == 0 || d.Name() != name {
		t.Fatalf("index %d name %s", d.LinkIndex(), d.Name())
	}
	cfg := rootConfig(t)
	mustSet(t, d, cfg)
	w := d.Writes()
	mustSet(t, d, cfg)
	if d.Writes() != w {
		t.Fatalf("re-applying an unchanged config made %d writes", d.Writes()-w)
	}
	dev := wgDevice(t, name)
	if dev.PublicKey != cfg.PrivateKey.PublicKey() || dev.ListenPort != 51820 || len(dev.Peers) != 3 {
		t.Fatalf("device %+v", dev)
	}
	h, _ := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil || l.Attrs().MTU != 1400 || l.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("link %+v %v", l, err)
	}
	addrs, _ := h.AddrList(l, netlink.FAMILY_ALL)
	var got []string
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			got = append(got, a.IPNet.String())
		}
	}
	if strings.Join(got, ",") != "10.77.0.1/24,2001:db8:77::1/128" {
		t.Fatalf("addresses %v", got)
	}

	// One changed peer: exactly one write, and only that peer.
	cfg.Peers[2].AllowedIPs = append(cfg.Peers[2].AllowedIPs, netip.MustParsePrefix("10.244.5.0/24"))
	mustSet(t, d, cfg)
	if d.Writes() != w+1 {
		t.Fatalf("one changed peer made %d writes", d.Writes()-w)
	}
	for _, p := range wgDevice(t, name).Peers {
		if p.PublicKey == cfg.Peers[2].PublicKey && len(p.AllowedIPs) != 3 {
			t.Fatalf("peer not updated: %v", p.AllowedIPs)
		}
	}
	// An address meshd no longer wants is removed.
	cfg.Addresses = cfg.Addresses[:1]
	mustSet(t, d, cfg)
	if d.Writes() != w+2 {
		t.Fatalf("removing an address made %d writes", d.Writes()-w-1)
	}

	// wg(8) sees it like a kernel device.
	out, err := exec.Command("wg", "show", name, "peers").CombinedOutput()
	if err != nil {
		t.Fatalf("wg show: %v: %s", err, out)
	}
	for _, p := range cfg.Peers {
		if !strings.Contains(string(out), p.PublicKey.String()) {
			t.Fatalf("wg show lacks peer %s:\n%s", p.PublicKey, out)
		}
	}
	stats, err := d.Stats()
	if err != nil || len(stats) != 3 {
		t.Fatalf("stats %v %v", stats, err)
	}
	for _, s := range stats {
		if s.PublicKey == cfg.Peers[0].PublicKey && s.Endpoint.String() != "198.51.100.11:51820" {
			t.Fatalf("endpoint %v", s.Endpoint)
		}
	}

	// In-process restart: the interface goes with the process and comes
	// back with the same key and peers on the next Set.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if linkExists(t, ns, name) {
		t.Fatal("in-process interface survived Close")
	}
	d2 := mustOpenIn(t, ns, Options{Name: name, Mode: ModeUserspace, MTU: 1400, Logger: log})
	mustSet(t, d2, cfg)
	dev = wgDevice(t, name)
	if dev.PublicKey != cfg.PrivateKey.PublicKey() || len(dev.Peers) != 3 {
		t.Fatalf("after restart: %+v", dev)
	}
	if err := d2.Delete(); err != nil {
		t.Fatal(err)
	}
	if linkExists(t, ns, name) {
		t.Fatal("interface survived Delete")
	}
}

// runDeviceIn runs RunDevice in ns as `meshd device` would, returning a stop
// function that waits for it.
func runDeviceIn(t testing.TB, ns netns.NsHandle, name string, log *slog.Logger) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- RunDevice(ctx, log, name, 1420)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := net.Dial("unix", socketPath(name)); err == nil {
			c.Close()
			break
		}
		select {
		case err := <-errc:
			cancel()
			t.Fatalf("RunDevice: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("RunDevice's UAPI socket did not appear")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				err = errors.New("RunDevice did not stop")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func TestRootAdoptExternalDevice(t *testing.T) {
	requireRoot(t)
	ns := lockedNewNS(t)
	name := uniqueName(t)
	log := testLogger(t)
	stop := runDeviceIn(t, ns, name, log)

	if _, err := openIn(t, ns, Options{Name: name, Mode: ModeKernel, Logger: log}); err == nil || !strings.Contains(err.Error(), "mode is kernel") {
		t.Fatalf("kernel mode over a userspace device: %v", err)
	}
	d := mustOpenIn(t, ns, Options{Name: name, Logger: log})
	if d.Kind() != KindUserspaceExternal {
		t.Fatalf("kind %q, want %q", d.Kind(), KindUserspaceExternal)
	}
	cfg := rootConfig(t)
	mustSet(t, d, cfg)
	if d.Writes() == 0 {
		t.Fatal("no writes for a fresh device")
	}
	d.Close()
	if !linkExists(t, ns, name) {
		t.Fatal("Close removed an external interface")
	}

	// Daemon restart: adopt again; the same config writes nothing, even
	// though the new Device has no memory of what it wrote.
	d2 := mustOpenIn(t, ns, Options{Name: name, Mode: ModeUserspace, Logger: log})
	if d2.Kind() != KindUserspaceExternal {
		t.Fatalf("kind %q", d2.Kind())
	}
	mustSet(t, d2, cfg)
	if d2.Writes() != 0 {
		t.Fatalf("adopted device with the same config: %d writes", d2.Writes())
	}
	if dev := wgDevice(t, name); dev.PublicKey != cfg.PrivateKey.PublicKey() || len(dev.Peers) != 3 {
		t.Fatalf("device %+v", dev)
	}
	// Delete stops the sidecar device and removes the interface.
	if err := d2.Delete(); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatalf("RunDevice after Delete: %v", err)
	}
	if linkExists(t, ns, name) {
		t.Fatal("interface survived Delete")
	}
}

func TestRootModesAndForeignLinks(t *testing.T) {
	requireRoot(t)
	ns := lockedNewNS(t)
	name := uniqueName(t)
	log := testLogger(t)
	if _, err := Open(context.Background(), Options{Name: name, Mode: "fast"}); err == nil {
		t.Fatal("bad mode accepted")
	}
	d, err := openIn(t, ns, Options{Name: name, Mode: ModeKernel, Logger: log})
	if err == nil {
		if d.Kind() != KindKernel {
			t.Fatalf("kernel mode gave %q", d.Kind())
		}
		d.Delete()
	} else if !strings.Contains(err.Error(), "kernel WireGuard") {
		t.Fatalf("kernel mode error not clear: %v", err)
	}
	if linkExists(t, ns, name) {
		t.Fatal("failed kernel Open left a link")
	}
	// A non-WireGuard link of the same name is never taken over.
	h, _ := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	defer h.Close()
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: name + "p"}); err != nil {
		t.Fatal(err)
	}
	if _, err := openIn(t, ns, Options{Name: name, Logger: log}); err == nil || !strings.Contains(err.Error(), "not WireGuard") {
		t.Fatalf("Open over a dummy link: %v", err)
	}
	// Userspace mode builds in-process.
	name2 := uniqueName(t)
	d2 := mustOpenIn(t, ns, Options{Name: name2, Mode: ModeUserspace, Logger: log})
	if d2.Kind() != KindUserspaceInProcess {
		t.Fatalf("kind %q", d2.Kind())
	}
	// The same name in another namespace: its socket path is taken.
	other := newNSHandle(t)
	if _, err := openIn(t, other, Options{Name: name2, Mode: ModeUserspace, Logger: log}); err == nil {
		t.Fatal("second device with a live socket name opened")
	}
	d2.Close()
}

// twoNodes joins two fresh namespaces by a veth (198.51.100.1/.2) and opens
// an in-process device in each with mesh addresses 10.77.0.1/.2.
type node struct {
	ns   netns.NsHandle
	dev  *Device
	cfg  Config
	name string
}

func twoNodes(t testing.TB, log *slog.Logger) (a, b *node) {
	t.Helper()
	a, b = nodePair(t, 24)
	for _, n := range []*node{a, b} {
		n.dev = mustOpenIn(t, n.ns, Options{Name: n.name, Mode: ModeUserspace, MTU: 1420, Logger: log})
	}
	return a, b
}

// nodePair joins two fresh namespaces by a veth (198.51.100.1/.2) and
// gives each a Config with the mesh address 10.77.0.1 or .2 (prefix length
// bits) and the other as its peer; it opens no device.
func nodePair(t testing.TB, bits int) (a, b *node) {
	t.Helper()
	a = &node{ns: newNSHandle(t), name: uniqueName(t)}
	b = &node{ns: newNSHandle(t), name: uniqueName(t)}
	veth(t, a.ns, b.ns, "198.51.100.1/24", "198.51.100.2/24")
	a.cfg = Config{PrivateKey: privKey(t), ListenPort: 51820, Addresses: pfx(fmt.Sprintf("10.77.0.1/%d", bits))}
	b.cfg = Config{PrivateKey: privKey(t), ListenPort: 51820, Addresses: pfx(fmt.Sprintf("10.77.0.2/%d", bits))}
	a.cfg.Peers = []Peer{{PublicKey: b.cfg.PrivateKey.PublicKey(), Endpoint: udp("198.51.100.2:51820"), AllowedIPs: pfx("10.77.0.2/32")}}
	b.cfg.Peers = []Peer{{PublicKey: a.cfg.PrivateKey.PublicKey(), Endpoint: udp("198.51.100.1:51820"), AllowedIPs: pfx("10.77.0.1/32")}}
	return a, b
}

func veth(t testing.TB, nsA, nsB netns.NsHandle, addrA, addrB string) {
	t.Helper()
	ha, err := netlink.NewHandleAt(nsA, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	hb, err := netlink.NewHandleAt(nsB, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "veth-a"
	if err := ha.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "veth-b"}); err != nil {
		t.Fatal(err)
	}
	peer, err := ha.LinkByName("veth-b")
	if err != nil {
		t.Fatal(err)
	}
	if err := ha.LinkSetNsFd(peer, int(nsB)); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		h    *netlink.Handle
		name string
		addr string
	}{{ha, "veth-a", addrA}, {hb, "veth-b", addrB}} {
		l, err := x.h.LinkByName(x.name)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(x.addr)
		if err := x.h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
		if err := x.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		lo, _ := x.h.LinkByName("lo")
		x.h.LinkSetUp(lo)
	}
}

func waitHandshake(t testing.TB, d *Device, after time.Time, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		st, err := d.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if len(st) == 1 && st[0].LastHandshake.After(after) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: no handshake within %v", d.Name(), timeout)
}

func execIn(t testing.TB, ns netns.NsHandle, name string, args ...string) (string, error) {
	var out []byte
	var err error
	if e := inNS(ns, func() { out, err = exec.Command(name, args...).CombinedOutput() }); e != nil {
		t.Fatal(e)
	}
	return string(out), err
}

// tcpEcho checks a TCP round trip from ns a to addr served in ns b.
func tcpEcho(t testing.TB, a, b netns.NsHandle, addr string) {
	t.Helper()
	var ln net.Listener
	var lerr error
	inNS(b, func() { ln, lerr = net.Listen("tcp", addr) })
	if lerr != nil {
		t.Fatal(lerr)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	var c net.Conn
	var derr error
	inNS(a, func() { c, derr = net.DialTimeout("tcp", addr, 5*time.Second) })
	if derr != nil {
		t.Fatal(derr)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := bytes.Repeat([]byte("meshd"), 20000) // 100 kB, several segments
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("TCP echo through the tunnel: %v", err)
	}
}

func TestRootTwoNamespacesTunnel(t *testing.T) {
	requireRoot(t)
	log := testLogger(t)
	a, b := twoNodes(t, log)
	start := time.Now()
	mustSet(t, a.dev, a.cfg)
	mustSet(t, b.dev, b.cfg)
	// No traffic yet: the handshake nudge alone must complete a handshake.
	waitHandshake(t, a.dev, start, 5*time.Second)
	if out, err := execIn(t, a.ns, "ping", "-c", "2", "-i", "0.2", "-W", "2", "10.77.0.2"); err != nil {
		t.Fatalf("ping through the tunnel: %v\n%s", err, out)
	}
	tcpEcho(t, a.ns, b.ns, "10.77.0.2:7777")
	// b received the 100 kB echoed and sent them back: the counters add
	// the lengths of the packets sent and written, which outlive detach.
	st, _ := b.dev.Stats()
	if st[0].ReceiveBytes < 100000 || st[0].TransmitBytes < 100000 || st[0].Endpoint.String() != "198.51.100.1:51820" {
		t.Fatalf("stats %+v", st[0])
	}

	// Restart node a's daemon (in-process device): key and peers are back
	// at once and it handshakes again without waiting for traffic.
	a.dev.Close()
	restart := time.Now()
	a.dev = mustOpenIn(t, a.ns, Options{Name: a.name, Mode: ModeUserspace, MTU: 1420, Logger: log})
	mustSet(t, a.dev, a.cfg)
	waitHandshake(t, b.dev, restart, 5*time.Second)
	tcpEcho(t, a.ns, b.ns, "10.77.0.2:7778")
	a.dev.Delete()
	b.dev.Delete()
}

// TestRootAddressPrefixLengthChange: on a real link in a fresh namespace,
// an address present with another prefix length than the wanted one ends
// up with the wanted one. IPv6 keeps one entry per address (a second add
// is EEXIST), which once left the link without the address at all.
func TestRootAddressPrefixLengthChange(t *testing.T) {
	requireRoot(t)
	ns := lockedNewNS(t)
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	const name = "mwg0" // a veth stands in for the WireGuard link: setLink is the same
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"fd00:4::1/64", "10.4.0.1/24"} {
		ipn, err := netlink.ParseIPNet(a)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipn, Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
	}
	c := NewFakeClient()
	c.AddDevice(name)
	links := netlinkOps{h}
	d := NewWithClient(name, c, links, 0, testLogger(t))
	// The kernel adds an fe80:: address once the link is up; Set leaves it.
	global := func() []netip.Prefix {
		t.Helper()
		st, err := links.Link(name)
		if err != nil {
			t.Fatal(err)
		}
		var out []netip.Prefix
		for _, p := range st.Addrs {
			if !p.Addr().IsLinkLocalUnicast() {
				out = append(out, p)
			}
		}
		return sortCompact(out)
	}
	for _, want := range [][]netip.Prefix{
		pfx("fd00:4::1/128", "10.4.0.1/32"),
		pfx("fd00:4::1/64", "10.4.0.1/24"),
	} {
		cfg := Config{Addresses: want}
		mustSet(t, d, cfg)
		if got := global(); !slices.Equal(got, sortCompact(slices.Clone(want))) {
			t.Fatalf("addresses on %s after Set(%v) = %v, want exactly those", name, want, got)
		}
		w := d.Writes()
		mustSet(t, d, cfg)
		if d.Writes() != w {
			t.Fatalf("a repeated Set(%v) made %d writes, want 0", want, d.Writes()-w)
		}
	}
}
