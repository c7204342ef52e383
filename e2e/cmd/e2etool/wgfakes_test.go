//go:build e2e

package main

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// A real WireGuard device (wireguard-go, the initiator) completes its
// handshake with a fake served by wgfakes, and a probe is echoed: the
// responder speaks the protocol, not an imitation of it.
func TestWGFakesHandshake(t *testing.T) {
	fakeKey, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	r, err := newWGResponder(fakeKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var answered, probes atomic.Int64
	go serveFake(c, r, &answered, &probes)

	ourKey, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	tn := tuntest.NewChannelTUN()
	dev := device.NewDevice(tn.TUN(), conn.NewDefaultBind(), device.NewLogger(device.LogLevelError, "wg: "))
	defer dev.Close()
	ep := c.LocalAddr().(*net.UDPAddr).AddrPort()
	cfg := fmt.Sprintf("private_key=%s\nlisten_port=0\npublic_key=%s\nendpoint=%s\npersistent_keepalive_interval=1\nallowed_ip=10.99.0.0/24\n",
		hex.EncodeToString(ourKey[:]), hex.EncodeToString(r.pub[:]), ep)
	if err := dev.IpcSet(cfg); err != nil {
		t.Fatal(err)
	}
	if err := dev.Up(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		state, err := dev.IpcGet()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(state, "last_handshake_time_sec=") && !strings.Contains(state, "last_handshake_time_sec=0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no handshake within 10 s (%d responses sent):\n%s", answered.Load(), state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if answered.Load() == 0 {
		t.Fatal("a handshake without a response: not ours")
	}

	// A probe of meshd's wire format, on the same socket, is echoed as a
	// healthy reply.
	cl, err := net.DialUDP("udp", nil, c.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := []byte{'m', 's', 'h', 'p', 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 42}
	if _, err := cl.Write(req); err != nil {
		t.Fatal(err)
	}
	_ = cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := cl.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), req...)
	want[5] = 2
	if got := buf[:n]; string(got) != string(want) || probes.Load() != 1 {
		t.Errorf("probe reply %v (%d probes counted), want %v", got, probes.Load(), want)
	}

	// A node under load answers our response with a cookie reply
	// (wireguard-go's own CookieChecker, keyed with the initiator's key);
	// the next response carries the mac2 it then checks.
	c2, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	pub := ourKey.PublicKey()
	cfg = fmt.Sprintf("public_key=%s\nremove=true\npublic_key=%s\nendpoint=%s\npersistent_keepalive_interval=1\nallowed_ip=10.99.0.0/24\n",
		hex.EncodeToString(r.pub[:]), hex.EncodeToString(r.pub[:]), c2.LocalAddr())
	if err := dev.IpcSet(cfg); err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	initiation := make([]byte, 2048)
	n, err = c2.Read(initiation)
	if err != nil || n != wgInitiationSize {
		t.Fatalf("no initiation captured: %d bytes, %v", n, err)
	}
	initiation = initiation[:n]
	resp, err := r.respond(initiation)
	if err != nil || resp == nil {
		t.Fatalf("respond: %v", err)
	}
	var cc device.CookieChecker
	cc.Init(device.NoisePublicKey(pub))
	src := []byte{127, 0, 0, 1, 0, 1}
	if cc.CheckMAC2(resp, src) {
		t.Fatal("a response with a valid mac2 before any cookie")
	}
	reply, err := cc.CreateReply(resp, binary.LittleEndian.Uint32(resp[4:8]), src)
	if err != nil {
		t.Fatal(err)
	}
	var wire bytes.Buffer
	if err := binary.Write(&wire, binary.LittleEndian, reply); err != nil {
		t.Fatal(err)
	}
	if out, err := r.respond(wire.Bytes()); out != nil || err != nil {
		t.Fatalf("cookie reply: %v %v", out, err)
	}
	resp, err = r.respond(initiation)
	if err != nil || !cc.CheckMAC2(resp, src) {
		t.Fatalf("the response after the cookie has no valid mac2 (%v)", err)
	}
}
