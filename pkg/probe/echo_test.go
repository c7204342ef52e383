package probe

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"
)

func TestEchoChecksum(t *testing.T) {
	b := echoRequest(8, 0x1234, 1)
	if checksum(b) != 0 {
		t.Errorf("a packet with its checksum sums to %#x, want 0", checksum(b))
	}
}

// TestEchoLoopback sends real echo requests to the loopback address (root
// only: raw sockets).
func TestEchoLoopback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (raw ICMP socket)")
	}
	lo := netip.MustParseAddr("127.0.0.1")
	res, err := Echo(context.Background(), lo, lo, 3, 10*time.Millisecond, time.Second)
	if err != nil || res.Sent != 3 || res.Received != 3 || len(res.RTTs) != 3 {
		t.Fatalf("echo to loopback: %+v, %v", res, err)
	}
	if _, err := Echo(context.Background(), lo, netip.MustParseAddr("::1"), 1, 0, time.Second); err == nil {
		t.Error("mixed families accepted")
	}
}
