package wg

import (
	"golang.zx2c4.com/wireguard/conn"
)

// inProcessBatchSize caps how many packets the in-process device reads or
// writes per call, on the UDP socket and on the TUN device.
//
// wireguard-go sizes its batches as the larger of the bind's and the TUN
// device's BatchSize (conn.IdealBatchSize, 128, on Linux), and each UDP
// receive goroutine (IPv4 and IPv6) and the TUN reader hold that many 64 KB
// buffers for the device's life: 24 MB per device whatever the peer count,
// 40 % of the live heap of a device with 1,000 idle peers. Capped at 32,
// they hold 3 × 32 × 64 KB = 6 MB, plus a 1.2 MB receive arena per UDP
// socket (batchReceiver).
//
// Chosen by measurement (2026-11-25, 2 shared cores): the live heap of one
// device with 1,000 peers, idle, in a process of its own
// (`go test -run '^$' -bench InProcessMemory -benchtime=1x ./pkg/wg`), and
// TCP throughput through two in-process devices as a ratio to two
// wireguard-go processes (which keep 128) in the same run, median of paired
// rounds, over 2-3 runs of 5-7 rounds (`ROUNDS=5 hack/wg-throughput.sh`):
//
//	batch  live heap  throughput ratio
//	128    57.6 MB    1.02-1.05
//	64     43.2 MB    1.01-1.05
//	32     35.1 MB    0.91-0.95
//	16     30.9 MB    0.70
//
// 16 costs 30 % of the throughput (TSO packets of 16 segments instead of
// up to 48 at MTU 1420, and fewer segments coalesced per TUN write); 32
// about 5 %, near this machine's noise; 64 nothing measurable, for 8 MB more
// heap than 32.
const inProcessBatchSize = 32

// maxSegment is wireguard-go's largest UDP datagram (device.MaxSegmentSize).
const maxSegment = 1<<16 - 1

// rawSlots is how many of the last receive slots conn.StdNetBind reads raw,
// possibly GRO-coalesced, datagrams into before it splits them into the
// slots before them (IdealBatchSize / udpSegmentMaxDatagrams: 128 / 64).
// They get whole 64 KB buffers of their own.
const rawSlots = 2

// batchBind reports a smaller BatchSize than the bind it wraps, so that the
// device allocates fewer receive buffers, and adapts each receive function:
// conn.StdNetBind on Linux expects exactly its own BatchSize of buffers on
// every receive (it reads up to that many datagrams, and splits UDP GRO
// reads into up to that many), so batchReceiver gives it that many and hands
// the device at most the device's number per call, keeping the rest for the
// next calls.
type batchBind struct {
	conn.Bind
	batch  int        // reported to the device
	stride int        // bytes between batchReceiver's arena slots
	lazy   *lazyPeers // nil: every peer is in the device
}

func (b *batchBind) BatchSize() int { return min(b.batch, b.Bind.BatchSize()) }

// Send sends bufs and then detaches them (see detach): the device's
// per-peer sender passes the same slice array on every call.
func (b *batchBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	err := b.Bind.Send(bufs, ep)
	detach(bufs)
	return err
}

// detached is what a packet slice points at once its send or write
// returned (see detach). Nothing writes it; it is never touched, so it
// takes no memory.
var detached [maxSegment]byte

// detach points every slice of bufs at detached, keeping their lengths.
//
// wireguard-go's sender and receiver goroutines, two per peer, each keep
// one slice array for their batches and only shorten it to zero length
// between batches: its elements still point at the last batch's 64 KB
// message buffers, after those went back to the device's pool. The pool
// lets go of what it does not use within two collections; these slices
// pin the buffers for the peer's life, up to a batch's worth per peer
// (with 1,000 peers each started by a keepalive of its own buffer, 30 MB
// at idle; with traffic up to 2 × 32 buffers, 4 MB, per peer). After the
// call returns the device reads only the lengths (the sender adds them to
// the peer's transmitted bytes), so detaching the slices, on the calling
// goroutine and after the call, changes nothing else.
func detach(bufs [][]byte) {
	for i, b := range bufs {
		if len(b) <= len(detached) {
			bufs[i] = detached[:len(b):len(b)]
		}
	}
}

func (b *batchBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	fns, p, err := b.Bind.Open(port)
	if err != nil {
		return nil, 0, err
	}
	if inner := b.Bind.BatchSize(); inner > b.batch {
		for i, fn := range fns {
			fns[i] = newBatchReceiver(fn, inner, b.stride).receive
		}
	}
	if l := b.lazy; l != nil {
		for i, fn := range fns {
			fns[i] = func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
				n, err := fn(bufs, sizes, eps)
				if n > 0 {
					l.inbound(bufs[:n], sizes[:n])
				}
				return n, err
			}
		}
	}
	return fns, p, nil
}

// batchReceiver calls a receive function that wants n buffers on behalf of
// a caller that passes fewer. The caller's buffers take the first slots; the
// others are wrapper-owned: the last rawSlots are whole 64 KB buffers, the
// ones before them are 64 KB windows into one arena, stride bytes apart, so
// they overlap. Datagrams are written to the slots in increasing order (by
// recvmmsg, or by StdNetBind's GRO split), so a datagram longer than the
// stride is cut only when the next slot is written too: such a datagram is
// dropped (size 0, which the device skips) as the network might drop it.
// With the stride above the mesh's datagram size (MTU + 32) none is.
type batchReceiver struct {
	inner  conn.ReceiveFunc
	bufs   [][]byte // len n: the inner function's slots
	own    [][]byte // the wrapper-owned buffer of each slot
	sizes  []int
	eps    []conn.Endpoint
	stride int
	// Datagrams received in slots next..end-1 not yet handed out.
	next, end int
}

func newBatchReceiver(inner conn.ReceiveFunc, n, stride int) *batchReceiver {
	r := &batchReceiver{
		inner:  inner,
		bufs:   make([][]byte, n),
		own:    make([][]byte, n),
		sizes:  make([]int, n),
		eps:    make([]conn.Endpoint, n),
		stride: stride,
	}
	windows := n - rawSlots
	arena := make([]byte, (windows-1)*stride+maxSegment)
	for i := range n {
		if i < windows {
			r.own[i] = arena[i*stride : i*stride+maxSegment : i*stride+maxSegment]
		} else {
			r.own[i] = make([]byte, maxSegment)
		}
	}
	copy(r.bufs, r.own)
	return r
}

func (r *batchReceiver) receive(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
	if r.next == r.end {
		m := min(len(bufs), len(r.bufs))
		copy(r.bufs, bufs[:m])
		n, err := r.inner(r.bufs, r.sizes, r.eps)
		copy(r.bufs, r.own[:m]) // keep no reference to the caller's buffers
		if err != nil {
			return 0, err
		}
		for i := m; i < n-1; i++ {
			if i+1 < len(r.bufs)-rawSlots && r.sizes[i] > r.stride {
				r.sizes[i] = 0 // overwritten by the next slot's datagram
			}
		}
		k := min(n, m)
		copy(sizes, r.sizes[:k])
		copy(eps, r.eps[:k])
		r.next, r.end = k, n
		clear(r.eps[:k])
		return k, nil
	}
	k := 0
	for ; k < len(bufs) && r.next < r.end; k++ {
		sizes[k] = copy(bufs[k], r.bufs[r.next][:r.sizes[r.next]])
		eps[k] = r.eps[r.next]
		r.eps[r.next] = nil
		r.next++
	}
	return k, nil
}

// receiveStride is batchReceiver's arena stride for a device of this MTU:
// room for a datagram of a peer with the same MTU (MTU + 32 bytes of
// WireGuard header and tag), and at least for one from a peer whose MTU is
// a jumbo frame's (9,000 + 32 bytes): nodes of one mesh may have different
// underlay MTUs, and a datagram longer than the stride is dropped when the
// next slot is written in the same read. The arena then takes about 1.2 MB
// per UDP socket instead of 8 MB.
func receiveStride(mtu int) int {
	return max(jumboStride, (mtu+32+63)&^63)
}

// jumboStride holds a WireGuard datagram of a 9,000-byte MTU, 64-byte
// aligned.
const jumboStride = (9000 + 32 + 63) &^ 63
