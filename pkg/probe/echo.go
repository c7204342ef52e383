package probe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// EchoResult is the outcome of Echo.
type EchoResult struct {
	Sent, Received int
	// RTTs of the answered requests, in order.
	RTTs []time.Duration
}

// Echo sends count ICMP echo requests from src to dst, one every interval,
// and waits up to timeout after the last for the replies. Unlike the UDP
// probes (which take the underlay on purpose), the requests are unmarked and
// follow the routing of any traffic from src: sent from a node's mesh
// address to another node's, they cross the same routes, leaders and
// WireGuard tunnels as the nodes' traffic, and the remote kernel answers.
// It needs CAP_NET_RAW. It is for diagnostics on request (meshd's debug
// endpoint), never part of a reconcile.
func Echo(ctx context.Context, src, dst netip.Addr, count int, interval, timeout time.Duration) (EchoResult, error) {
	var res EchoResult
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return res, fmt.Errorf("echo from %s to %s: want two addresses of one family", src, dst)
	}
	network, reqType, replyType := "ip4:icmp", byte(8), byte(0)
	if dst.Is6() {
		network, reqType, replyType = "ip6:ipv6-icmp", 128, 129
	}
	pc, err := net.ListenPacket(network, src.String())
	if err != nil {
		return res, fmt.Errorf("opening an ICMP socket on %s: %w", src, err)
	}
	defer pc.Close()
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	sent := map[uint16]time.Time{}
	done := make(chan struct{})
	type reply struct {
		seq uint16
		at  time.Time
	}
	replies := make(chan reply, count)
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			a, ok := netip.AddrFromSlice(from.(*net.IPAddr).IP)
			if !ok || a.Unmap() != dst || n < 8 || buf[0] != replyType || binary.BigEndian.Uint16(buf[4:]) != id {
				continue
			}
			replies <- reply{seq: binary.BigEndian.Uint16(buf[6:]), at: time.Now()}
		}
	}()
	to := &net.IPAddr{IP: dst.AsSlice()}
	var werr error
	for i := range count {
		if i > 0 {
			select {
			case <-ctx.Done():
				werr = ctx.Err()
			case <-time.After(interval):
			}
			if werr != nil {
				break
			}
		}
		seq := uint16(i + 1)
		msg := echoRequest(reqType, id, seq)
		sent[seq] = time.Now()
		if _, err := pc.WriteTo(msg, to); err != nil {
			werr = fmt.Errorf("sending an echo request to %s: %w", dst, err)
			break
		}
		res.Sent++
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := map[uint16]bool{}
	for res.Received < res.Sent {
		select {
		case r := <-replies:
			if t, ok := sent[r.seq]; ok && !seen[r.seq] {
				seen[r.seq] = true
				res.Received++
				res.RTTs = append(res.RTTs, r.at.Sub(t))
			}
			continue
		case <-deadline.C:
		case <-ctx.Done():
		}
		break
	}
	pc.Close()
	<-done
	if werr != nil && !errors.Is(werr, context.Canceled) {
		return res, werr
	}
	return res, nil
}

// echoRequest builds an ICMP (or ICMPv6) echo request. The ICMPv6 checksum
// is left to the kernel (it covers a pseudo-header only the kernel knows).
func echoRequest(typ byte, id, seq uint16) []byte {
	b := make([]byte, 8+16)
	b[0] = typ
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	copy(b[8:], "meshctl check...")
	if typ == 8 {
		binary.BigEndian.PutUint16(b[2:], checksum(b))
	}
	return b
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
