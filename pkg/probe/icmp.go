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
	for _, o := range p.due(func(t *target) bool { return t.addr.Addr().Is4() }) {
		msg := echoRequest(8, id, uint16(o.seq))
		if _, err := pc.WriteTo(msg, &net.IPAddr{IP: o.addr.Addr().AsSlice()}); err != nil {
			p.log.Debug("sending an ICMP probe", "to", o.addr.Addr(), "error", err)
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
		// The target's kernel answers from the address probed.
		if p.reply(uint64(binary.BigEndian.Uint16(buf[6:])), a, true) {
			p.changed()
		}
	}
}
