package probe

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
)

// ICMP probes: the kernel answers for loopback (Up, with OnChange); a
// target that never answers stays Unknown. The Up/Down timing is the
// UDP prober's (TestProber).
func TestProberICMP(t *testing.T) {
	if pc, err := net.ListenPacket("ip4:icmp", "0.0.0.0"); err != nil {
		if errors.Is(err, os.ErrPermission) {
			t.Skip("needs CAP_NET_RAW:", err)
		}
		t.Fatal(err)
	} else {
		pc.Close()
	}
	changed := make(chan struct{}, 8)
	p, err := New(Options{Port: 1, ICMP: true, Interval: 20 * time.Millisecond, DownAfter: time.Second, UpAfter: 1,
		OnChange: func() { changed <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	p.SetTargets([]Target{
		{Name: "lo", Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 7)},
		{Name: "void", Addr: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.77"), 0)},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitState(t, p, "lo", Up, 5*time.Second)
	select {
	case <-changed:
	case <-time.After(time.Second):
		t.Error("OnChange not called when lo came up")
	}
	time.Sleep(200 * time.Millisecond)
	if s, ok := p.Results()["void"]; ok {
		t.Errorf("void: %s, want left out (unknown)", s)
	}
}
