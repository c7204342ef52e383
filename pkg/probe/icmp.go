package probe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// runICMP is Run with Options.ICMP: echo requests to the targets through a
// raw ICMP socket; the targets' kernels answer.
func (p *Prober) runICMP(ctx context.Context) error {
	pc, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		return fmt.Errorf("probe: opening an ICMP socket: %w", err)
	}
	defer pc.Close()
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	p.log.Info("sending ICMP data-plane probes", "interval", p.o.Interval, "down-after", p.o.DownAfter, "up-after", p.o.UpAfter)
	return p.loop(ctx, pc, func() { p.receiveICMP(ctx, pc, id) }, func() { p.sendICMP(pc, id) })
}

func (p *Prober) sendICMP(pc net.PacketConn, id uint16) {
	p.mu.Lock()
	type out struct {
		addr netip.Addr
		seq  uint64
	}
	batch := make([]out, 0, len(p.targets))
	for _, t := range p.targets {
		if !t.addr.Addr().Is4() || !t.due() {
			continue
		}
		p.seq++
		t.seq = p.seq
		batch = append(batch, out{t.addr.Addr(), t.seq})
	}
	p.mu.Unlock()
	for _, o := range batch {
		msg := echoRequest(8, id, uint16(o.seq))
		if _, err := pc.WriteTo(msg, &net.IPAddr{IP: o.addr.AsSlice()}); err != nil {
			p.log.Debug("sending an ICMP probe", "to", o.addr, "error", err)
		}
	}
}

func (p *Prober) receiveICMP(ctx context.Context, pc net.PacketConn, id uint16) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			continue
		}
		ia, ok := from.(*net.IPAddr)
		if !ok || n < 8 || buf[0] != 0 || binary.BigEndian.Uint16(buf[4:]) != id {
			continue
		}
		a, ok := netip.AddrFromSlice(ia.IP)
		if !ok {
			continue
		}
		if p.reply(netip.AddrPortFrom(a.Unmap(), 0), true) {
			p.changed()
		}
	}
}
