package initiationtest

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/conn/bindtest"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Capture runs a wireguard-go device with private key a and one
// peer, b's public key, on a channel bind, and returns the first handshake
// initiation it sends to that peer.
func Capture(tb testing.TB, a, b wgtypes.Key) []byte {
	tb.Helper()
	binds := bindtest.NewChannelBinds()
	dev := device.NewDevice(tuntest.NewChannelTUN().TUN(), binds[0], device.NewLogger(device.LogLevelSilent, ""))
	defer dev.Close()

	// The other end of the channel: what device A sends to endpoint
	// 127.0.0.1:1 (binds[0]'s IPv4 target) arrives on binds[1]'s first
	// receive function.
	fns, _, err := binds[1].Open(0)
	if err != nil {
		tb.Fatal(err)
	}
	defer binds[1].Close()

	pub := b.PublicKey()
	// A persistent keepalive makes the device send a keepalive, hence an
	// initiation, as soon as it is up.
	if err := dev.IpcSet(fmt.Sprintf("private_key=%s\npublic_key=%s\nendpoint=127.0.0.1:1\nallowed_ip=10.9.0.2/32\npersistent_keepalive_interval=1\n",
		hex.EncodeToString(a[:]), hex.EncodeToString(pub[:]))); err != nil {
		tb.Fatal(err)
	}
	if err := dev.Up(); err != nil {
		tb.Fatal(err)
	}

	got := make(chan []byte, 1)
	go func() {
		defer close(got)
		receive(fns[0], got)
	}()
	select {
	case msg, ok := <-got:
		if !ok {
			tb.Fatal("the channel bind closed before an initiation arrived")
		}
		if len(msg) != 148 {
			tb.Fatalf("device sent a type-1 message of %d bytes, want 148", len(msg))
		}
		return msg
	case <-time.After(10 * time.Second):
		binds[1].Close() // ends receive
		tb.Fatal("no handshake initiation from the device within 10s")
		return nil
	}
}

// receive reads packets from fn until one is of type 1 (judged from the
// raw first byte, not by this package) and sends it on got.
func receive(fn conn.ReceiveFunc, got chan<- []byte) {
	bufs := [][]byte{make([]byte, 2048)}
	sizes := make([]int, 1)
	eps := make([]conn.Endpoint, 1)
	for {
		n, err := fn(bufs, sizes, eps)
		if err != nil {
			return
		}
		if n == 1 && sizes[0] > 0 && bufs[0][0] == 1 {
			got <- bytes.Clone(bufs[0][:sizes[0]])
			return
		}
	}
}
