package wg

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"

	"meshd.io/meshd/internal/testlog"
)

// datagram is a test payload of n bytes that carries its sequence number.
func datagram(seq, n int) []byte {
	b := bytes.Repeat([]byte{byte(seq), byte(seq >> 8), 0x5a}, n/3+1)[:n]
	binary.BigEndian.PutUint32(b, uint32(seq))
	return b
}

// callerBufs is what wireguard-go's receive goroutine passes: n 64 KB buffers.
func callerBufs(n int) ([][]byte, []int, []conn.Endpoint) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, maxSegment)
	}
	return bufs, make([]int, n), make([]conn.Endpoint, n)
}

func TestBatchReceiverHandsOutEveryDatagramInOrder(t *testing.T) {
	const inner, batch, stride = 128, 16, 2048
	// Each inner call writes these datagram sizes into its slots, in order,
	// as recvmmsg or StdNetBind's GRO split do.
	script := [][]int{make([]int, 40), {1452, 60, 1452}, make([]int, 128), make([]int, 16)}
	for _, i := range []int{0, 3} {
		for j := range script[i] {
			script[i][j] = 1452
		}
	}
	for i := range script[2] {
		script[2][i] = 148 + i*10 // up to 1418 bytes
	}
	// Longer than the stride: whole in the last arena slot (the raw slot
	// after it is a buffer of its own), cut in the first arena slot when
	// the next is written, whole in the last slot written.
	script[2][125] = 3000
	script[3] = append(script[3], 3000, 1452, 3000)
	var calls, seq int
	sent := map[int][]byte{}
	ep := &conn.StdNetEndpoint{AddrPort: netip.MustParseAddrPort("192.0.2.1:51820")}
	var callerFirst *byte
	fn := func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		if len(bufs) != inner || len(sizes) != inner || len(eps) != inner {
			t.Fatalf("inner receive got %d buffers, want %d", len(bufs), inner)
		}
		if &bufs[0][0] != callerFirst {
			t.Fatal("the caller's buffers are not the first slots")
		}
		if calls == len(script) {
			return 0, fmt.Errorf("closed")
		}
		for i, n := range script[calls] {
			d := datagram(seq, n)
			sent[seq] = d
			sizes[i] = copy(bufs[i], d)
			eps[i] = ep
			seq++
		}
		calls++
		return len(script[calls-1]), nil
	}
	r := newBatchReceiver(fn, inner, stride)
	var got []int
	dropped := 0
	for {
		bufs, sizes, eps := callerBufs(batch)
		callerFirst = &bufs[0][0]
		n, err := r.receive(bufs, sizes, eps)
		if err != nil {
			break
		}
		if n == 0 || n > batch {
			t.Fatalf("receive returned %d datagrams for %d buffers", n, batch)
		}
		for i := range n {
			if sizes[i] == 0 {
				dropped++
				continue
			}
			s := int(binary.BigEndian.Uint32(bufs[i]))
			if !bytes.Equal(bufs[i][:sizes[i]], sent[s]) {
				t.Fatalf("datagram %d: %d bytes differ from the %d sent", s, sizes[i], len(sent[s]))
			}
			if eps[i] != ep {
				t.Fatalf("datagram %d: endpoint %v", s, eps[i])
			}
			got = append(got, s)
		}
		for _, b := range r.bufs {
			if &b[0] == &bufs[0][0] {
				t.Fatal("the receiver kept a reference to the caller's buffer")
			}
		}
	}
	// Every datagram in order, except the cut one.
	var want []int
	for s := range seq {
		if s != 40+3+128+16 {
			want = append(want, s)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || dropped != 1 {
		t.Fatalf("got datagrams %v (%d dropped), want %v (1 dropped)", got, dropped, want)
	}
}

// TestBatchBindStdNetGRO sends bursts of 64 datagrams as one UDP GSO send,
// which the receiving socket reads GRO-coalesced, through conn.StdNetBind
// wrapped to hand out 16 per call, and checks that every datagram arrives
// whole, once and in order.
func TestBatchBindStdNetGRO(t *testing.T) {
	const mtu = 1420
	size := mtu + 32
	rx := &batchBind{Bind: conn.NewStdNetBind(), batch: inProcessBatchSize, stride: receiveStride(mtu)}
	if rx.BatchSize() != inProcessBatchSize {
		t.Fatalf("BatchSize %d, want %d", rx.BatchSize(), inProcessBatchSize)
	}
	// As rx.Open, with the inner receive functions counted.
	fns, port, err := rx.Bind.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	var most atomic.Int64 // most datagrams one inner call returned
	for i, fn := range fns {
		counted := func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
			n, err := fn(bufs, sizes, eps)
			if int64(n) > most.Load() {
				most.Store(int64(n))
			}
			return n, err
		}
		fns[i] = newBatchReceiver(counted, rx.Bind.BatchSize(), rx.stride).receive
	}
	tx := conn.NewStdNetBind()
	if _, _, err := tx.Open(0); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	dst, err := tx.ParseEndpoint(fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}

	const bursts, per = 20, 64
	got := make(chan []byte, bursts*per)
	for _, fn := range fns {
		go func() {
			bufs, sizes, eps := callerBufs(rx.BatchSize())
			for {
				n, err := fn(bufs, sizes, eps)
				if err != nil {
					return
				}
				for i := range n {
					got <- bytes.Clone(bufs[i][:sizes[i]])
				}
			}
		}()
	}
	seq := 0
	for range bursts {
		var bufs [][]byte
		for range per {
			// With room behind, as wireguard-go's: StdNetBind coalesces a
			// burst into one UDP GSO send only then.
			b := make([]byte, size, maxSegment)
			copy(b, datagram(seq, size))
			bufs = append(bufs, b)
			seq++
		}
		if err := tx.Send(bufs, dst); err != nil {
			t.Fatal(err)
		}
		// Wait for the burst before the next: the socket's buffer, not the
		// wrapper, would drop a flood.
		for i := seq - per; i < seq; i++ {
			select {
			case d := <-got:
				if !bytes.Equal(d, datagram(i, size)) {
					t.Fatalf("datagram %d: got %d bytes, seq %d", i, len(d), binary.BigEndian.Uint32(d))
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("datagram %d did not arrive", i)
			}
		}
	}
	// A burst sent at once is read at once (GRO-coalesced, or recvmmsg).
	if most.Load() <= inProcessBatchSize {
		t.Fatalf("no inner read returned more than %d datagrams (most %d): the wrapper was not exercised", inProcessBatchSize, most.Load())
	}
	t.Logf("most datagrams per inner read: %d", most.Load())
}

func TestRootInProcessBatchSize(t *testing.T) {
	requireRoot(t)
	ns := newNSHandle(t)
	name := uniqueName(t)
	d := mustOpenIn(t, ns, Options{Name: name, Mode: ModeUserspace, Logger: testLogger(t)})
	if d.Kind() != KindUserspaceInProcess {
		t.Fatalf("kind %s", d.Kind())
	}
	if got := d.inproc.dev.BatchSize(); got != inProcessBatchSize {
		t.Fatalf("in-process device BatchSize %d, want %d", got, inProcessBatchSize)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Attrs().GSOMaxSegs; got != inProcessBatchSize {
		t.Fatalf("TUN link gso_max_segs %d, want %d (else the kernel hands the device more segments than a batch holds)", got, inProcessBatchSize)
	}
}

// TestRootInProcessBatchStream sends a TCP stream through two in-process
// devices with capped batches and checks that wireguard-go never dropped
// segments of a TSO packet for want of batch buffers.
func TestRootInProcessBatchStream(t *testing.T) {
	requireRoot(t)
	logs := &testlog.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, b := twoNodes(t, log)
	start := time.Now()
	mustSet(t, a.dev, a.cfg)
	mustSet(t, b.dev, b.cfg)
	waitHandshake(t, a.dev, start, 5*time.Second)
	mbps := tcpStream(t, a, b, time.Second)
	if strings.Contains(logs.String(), "multi-segment") {
		t.Fatalf("wireguard-go dropped segments (%.0f MB/s):\n%s", mbps, logs.String())
	}
	t.Logf("%.0f MB/s", mbps)
}

// The receive arena's slots hold a jumbo-frame peer's datagrams whatever
// this node's MTU, and this node's own at any MTU.
func TestReceiveStride(t *testing.T) {
	for _, mtu := range []int{576, 1280, 1420, 8921, 9000, 9400} {
		s := receiveStride(mtu)
		if s < 9000+32 || s < mtu+32 || s%64 != 0 {
			t.Errorf("receiveStride(%d) = %d: want a multiple of 64 holding %d and %d bytes", mtu, s, 9000+32, mtu+32)
		}
	}
}

func TestDetachKeepsLengthsNotBuffers(t *testing.T) {
	bufs := [][]byte{make([]byte, maxSegment), make([]byte, 10), {}, nil, make([]byte, maxSegment+1)}
	orig := slices.Clone(bufs)
	lens := []int{maxSegment, 10, 0, 0, maxSegment + 1}
	detach(bufs)
	for i, b := range bufs {
		if len(b) != lens[i] {
			t.Errorf("slice %d: length %d after detach, want %d", i, len(b), lens[i])
		}
	}
	if &bufs[0][0] == &orig[0][0] || &bufs[1][0] == &orig[1][0] {
		t.Error("detach left a slice on its buffer")
	}
	if &bufs[4][0] != &orig[4][0] {
		t.Error("a slice longer than detached must keep its buffer (its length is what counts)")
	}
}

// recordingBind is a conn.Bind whose Send copies what it is given.
type recordingBind struct {
	conn.Bind
	sent [][]byte
}

func (r *recordingBind) Send(bufs [][]byte, _ conn.Endpoint) error {
	for _, b := range bufs {
		r.sent = append(r.sent, slices.Clone(b))
	}
	return nil
}

// recordingTUN is a tun.Device whose Write copies what it is given.
type recordingTUN struct {
	tun.Device
	written [][]byte
}

func (r *recordingTUN) Write(bufs [][]byte, offset int) (int, error) {
	n := 0
	for _, b := range bufs {
		r.written = append(r.written, slices.Clone(b[offset:]))
		n += len(b) - offset
	}
	return n, nil
}

// pinned reports whether a 64 KB buffer stays reachable while only the
// slice array passed to send is kept, as wireguard-go's per-peer sender
// and receiver keep theirs between batches.
func pinned(t *testing.T, send func(bufs [][]byte), wantLen int) bool {
	t.Helper()
	buf := new([maxSegment]byte)
	copy(buf[:], "payload")
	w := weak.Make(buf)
	bufs := make([][]byte, 0, inProcessBatchSize)
	bufs = append(bufs, buf[:wantLen])
	buf = nil
	send(bufs)
	if len(bufs[0]) != wantLen {
		t.Errorf("length %d after the call, want %d (the device adds it to its byte counters)", len(bufs[0]), wantLen)
	}
	bufs = bufs[:0] // what the device does before its next batch
	runtime.GC()
	runtime.GC()
	p := w.Value() != nil
	runtime.KeepAlive(bufs)
	return p
}

func TestSendAndWriteLetGoOfMessageBuffers(t *testing.T) {
	inner := &recordingBind{}
	if !pinned(t, func(bufs [][]byte) { _ = inner.Send(bufs, nil) }, 100) {
		t.Fatal("control: a plain Send should leave the buffer pinned by the caller's slice array (the test would prove nothing)")
	}
	b := &batchBind{Bind: inner, batch: inProcessBatchSize}
	if pinned(t, func(bufs [][]byte) { _ = b.Send(bufs, nil) }, 100) {
		t.Error("batchBind.Send: the caller's slice array still pins the 64 KB message buffer it sent")
	}
	tdev := &recordingTUN{}
	pt := &pumpedTUN{Device: tdev}
	if pinned(t, func(bufs [][]byte) { _, _ = pt.Write(bufs, 16) }, 100) {
		t.Error("pumpedTUN.Write: the caller's slice array still pins the 64 KB message buffer it wrote")
	}
	if len(inner.sent) != 2 || string(inner.sent[1][:7]) != "payload" || len(inner.sent[1]) != 100 {
		t.Errorf("the bind was sent %q..., want the 100-byte payload", inner.sent)
	}
	if len(tdev.written) != 1 || len(tdev.written[0]) != 84 {
		t.Errorf("the TUN device was written %d packets, want one of 84 bytes after the offset", len(tdev.written))
	}
}
