//go:build e2e

package main

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash"
	"log"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/chacha20poly1305"
	"golang.org/x/crypto/curve25519"
)

// wgfakes is what meshd on many fake nodes would answer, in one process:
// on each fake's WireGuard endpoint, the responder's half of WireGuard's
// handshake (Noise_IKpsk2 without a preshared key, as in the WireGuard
// paper, section 5.4), with the cookies of section 5.4.7 (a real node under
// load, with a thousand handshakes at once, answers a response without a
// valid mac2 with a cookie reply, and takes the next response only with
// it), so real nodes establish sessions with fakes as they do with real
// peers; on the probe port of each fake address, meshd's data-plane probe
// echo (pkg/probe's wire format: "mshp", version 1, kind, two zero bytes, a
// big-endian sequence number; the reply kind 2, healthy). Transport data is
// dropped: the fakes carry no traffic.
//
//	e2etool wgfakes [-probe-port 51821] FILE
//
// FILE has one fake per line: its base64 private key and its endpoint
// (ADDR:PORT). Every address must be local to the namespace.
func wgfakes(args []string) error {
	fs := flag.NewFlagSet("wgfakes", flag.ContinueOnError)
	probePort := fs.Int("probe-port", 51821, "UDP port of meshd's data-plane probes on every fake address (0: none)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return errors.New("usage: e2etool wgfakes [-probe-port N] FILE")
	}
	fakes, err := readFakes(fs.Arg(0))
	if err != nil {
		return err
	}
	var handshakes, probes atomic.Int64
	// One socket per address and port: a fake's endpoint may be on the
	// probe port, and the packets tell themselves apart ("mshp" or a
	// WireGuard message type).
	sockets := map[netip.AddrPort]*wgResponder{}
	for _, f := range fakes {
		sockets[f.endpoint] = f.responder
		if *probePort != 0 {
			p := netip.AddrPortFrom(f.endpoint.Addr(), uint16(*probePort))
			if _, ok := sockets[p]; !ok {
				sockets[p] = nil // probes only
			}
		}
	}
	for ap, r := range sockets {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return fmt.Errorf("listening on %s: %w", ap, err)
		}
		go serveFake(c, r, &handshakes, &probes)
	}
	log.Printf("wgfakes: %d fakes answer handshakes and probes on %d sockets", len(fakes), len(sockets))
	for range time.Tick(30 * time.Second) {
		log.Printf("wgfakes: %d handshakes answered, %d probes", handshakes.Load(), probes.Load())
	}
	return nil
}

type fakePeer struct {
	endpoint  netip.AddrPort
	responder *wgResponder
}

func readFakes(path string) ([]fakePeer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []fakePeer
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s: want KEY ADDR:PORT, got %q", path, s.Text())
		}
		key, err := base64.StdEncoding.DecodeString(fields[0])
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("%s: bad private key in %q", path, s.Text())
		}
		ep, err := netip.ParseAddrPort(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		r, err := newWGResponder([32]byte(key))
		if err != nil {
			return nil, err
		}
		out = append(out, fakePeer{endpoint: ep, responder: r})
	}
	return out, s.Err()
}

// serveFake answers on one socket: meshd's probes, and WireGuard handshake
// initiations for r (nil: probes only).
func serveFake(c *net.UDPConn, r *wgResponder, handshakes, probes *atomic.Int64) {
	buf := make([]byte, 2048)
	for {
		k, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			log.Printf("wgfakes: %v", err)
			return
		}
		var reply []byte
		count := handshakes
		if p := buf[:k]; len(p) >= 16 && string(p[:4]) == "mshp" {
			reply, count = probeReply(p), probes
		} else if r != nil {
			reply, _ = r.respond(p) // nil for transport data, cookies, garbage
		}
		if reply == nil {
			continue
		}
		// Counted before it is sent: whoever reads the answer sees it
		// counted (the test checks the count right after the reply).
		count.Add(1)
		if _, err := c.WriteToUDPAddrPort(reply, from); err != nil {
			count.Add(-1)
		}
	}
}

// probeReply answers a probe request (version 1, kind 1) with a healthy
// reply (kind 2) carrying its sequence number; nil for anything else.
func probeReply(p []byte) []byte {
	if p[4] != 1 || p[5] != 1 {
		return nil
	}
	reply := append([]byte(nil), p[:16]...)
	reply[5] = 2
	return reply
}

// WireGuard's handshake, responder side (the WireGuard paper, 5.4.2-5.4.3).
const (
	noiseConstruction = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s"
	wgIdentifier      = "WireGuard v1 zx2c4 Jason@zx2c4.com"
	wgLabelMAC1       = "mac1----"
	wgInitiationSize  = 148
	wgResponseSize    = 92
)

type wgResponder struct {
	priv, pub [32]byte
	// chain0 and hash0 are the chaining key and hash after the static
	// part: HASH(CONSTRUCTION), HASH(HASH(chain0 || IDENTIFIER) || pub).
	chain0, hash0 [32]byte
	mac1Key       [32]byte // HASH(LABEL_MAC1 || pub): checks initiations
	// sent are the responses sent lately, by our index: a cookie reply
	// names one and is sealed with its mac1 and its initiator's key.
	// cookies are the cookies the initiators gave, by their key. One
	// goroutine serves a responder: no lock.
	sent    map[uint32]sentResponse
	cookies map[[32]byte]cookie
}

type sentResponse struct {
	initiator [32]byte
	mac1      [16]byte
}

type cookie struct {
	value [16]byte
	at    time.Time
}

// wgCookieLife is how long a cookie is good (COOKIE_SECRET_MAX_AGE).
const wgCookieLife = 120 * time.Second

func newWGResponder(priv [32]byte) (*wgResponder, error) {
	pub, err := curve25519.X25519(priv[:], curve25519.Basepoint)
	if err != nil {
		return nil, err
	}
	r := &wgResponder{priv: priv, pub: [32]byte(pub), sent: map[uint32]sentResponse{}, cookies: map[[32]byte]cookie{}}
	r.chain0 = wgHash([]byte(noiseConstruction))
	h := wgHash(r.chain0[:], []byte(wgIdentifier))
	r.hash0 = wgHash(h[:], pub)
	r.mac1Key = wgHash([]byte(wgLabelMAC1), pub)
	return r, nil
}

func wgHash(parts ...[]byte) [32]byte {
	h, _ := blake2s.New256(nil)
	for _, p := range parts {
		h.Write(p)
	}
	return [32]byte(h.Sum(nil))
}

func wgHMAC(key []byte, parts ...[]byte) [32]byte {
	m := hmac.New(func() hash.Hash { h, _ := blake2s.New256(nil); return h }, key)
	for _, p := range parts {
		m.Write(p)
	}
	return [32]byte(m.Sum(nil))
}

// wgKDF is KDF_n: τ0 = HMAC(key, input), τi = HMAC(τ0, τ(i-1) || i).
func wgKDF(key, input []byte, n int) [][32]byte {
	t0 := wgHMAC(key, input)
	out := make([][32]byte, n)
	var prev []byte
	for i := range n {
		out[i] = wgHMAC(t0[:], prev, []byte{byte(i + 1)})
		prev = out[i][:]
	}
	return out
}

func wgMAC(key [32]byte, msg []byte) [16]byte {
	h, _ := blake2s.New128(key[:])
	h.Write(msg)
	return [16]byte(h.Sum(nil))
}

var zeroNonce [chacha20poly1305.NonceSize]byte // counter 0

func wgOpen(key [32]byte, sealed, ad []byte) ([]byte, error) {
	a, err := chacha20poly1305.New(key[:])
	if err != nil {
		return nil, err
	}
	return a.Open(nil, zeroNonce[:], sealed, ad)
}

func wgSeal(key [32]byte, plain, ad []byte) []byte {
	a, _ := chacha20poly1305.New(key[:])
	return a.Seal(nil, zeroNonce[:], plain, ad)
}

// respond answers a handshake initiation with a response and takes a
// cookie reply's cookie; anything else (or an initiation not for this key)
// gets nil.
func (r *wgResponder) respond(msg []byte) ([]byte, error) {
	if len(msg) == wgCookieReplySize && binary.LittleEndian.Uint32(msg[:4]) == 3 {
		return nil, r.takeCookie(msg)
	}
	if len(msg) != wgInitiationSize || binary.LittleEndian.Uint32(msg[:4]) != 1 {
		return nil, nil
	}
	if mac := wgMAC(r.mac1Key, msg[:116]); !hmac.Equal(mac[:], msg[116:132]) {
		return nil, errors.New("bad mac1")
	}
	ei := msg[8:40]
	c := wgKDF(r.chain0[:], ei, 1)[0]
	h := wgHash(r.hash0[:], ei)
	dh, err := curve25519.X25519(r.priv[:], ei)
	if err != nil {
		return nil, err
	}
	ck := wgKDF(c[:], dh, 2)
	c = ck[0]
	si, err := wgOpen(ck[1], msg[40:88], h[:])
	if err != nil {
		return nil, err
	}
	h = wgHash(h[:], msg[40:88])
	if dh, err = curve25519.X25519(r.priv[:], si); err != nil {
		return nil, err
	}
	ck = wgKDF(c[:], dh, 2)
	c = ck[0]
	if _, err := wgOpen(ck[1], msg[88:116], h[:]); err != nil {
		return nil, err
	}
	h = wgHash(h[:], msg[88:116])
	return r.response(c, h, ei, si, msg[4:8])
}

// response builds the handshake response from the initiation's chaining key
// c, hash h, the initiator's ephemeral ei and static si, and its index.
func (r *wgResponder) response(c, h [32]byte, ei, si, initiatorIndex []byte) ([]byte, error) {
	var er [32]byte
	if _, err := rand.Read(er[:]); err != nil {
		return nil, err
	}
	erPub, err := curve25519.X25519(er[:], curve25519.Basepoint)
	if err != nil {
		return nil, err
	}
	resp := make([]byte, wgResponseSize)
	binary.LittleEndian.PutUint32(resp[0:4], 2)
	if _, err := rand.Read(resp[4:8]); err != nil { // our index: any
		return nil, err
	}
	copy(resp[8:12], initiatorIndex)
	copy(resp[12:44], erPub)
	c = wgKDF(c[:], erPub, 1)[0]
	h = wgHash(h[:], erPub)
	for _, pub := range [][]byte{ei, si} {
		dh, err := curve25519.X25519(er[:], pub)
		if err != nil {
			return nil, err
		}
		c = wgKDF(c[:], dh, 1)[0]
	}
	var psk [32]byte // no preshared key
	t := wgKDF(c[:], psk[:], 3)
	h = wgHash(h[:], t[1][:])
	copy(resp[44:60], wgSeal(t[2], nil, h[:]))
	mac := wgMAC(wgHash([]byte(wgLabelMAC1), si), resp[:60])
	copy(resp[60:76], mac[:])
	if c, ok := r.cookies[[32]byte(si)]; ok && time.Since(c.at) < wgCookieLife {
		h, _ := blake2s.New128(c.value[:])
		h.Write(resp[:76])
		copy(resp[76:92], h.Sum(nil))
	}
	if len(r.sent) >= 64 { // a few in flight is all a cookie reply can name
		clear(r.sent)
	}
	r.sent[binary.LittleEndian.Uint32(resp[4:8])] = sentResponse{initiator: [32]byte(si), mac1: mac}
	return resp, nil
}

// wgCookieReplySize: type, receiver index, 24-byte nonce, sealed cookie.
const wgCookieReplySize = 64

// takeCookie reads a cookie reply to one of our responses: the cookie is
// sealed (XChaCha20Poly1305) with HASH(LABEL_COOKIE || the sender's key),
// with the mac1 of our response as additional data.
func (r *wgResponder) takeCookie(msg []byte) error {
	sent, ok := r.sent[binary.LittleEndian.Uint32(msg[4:8])]
	if !ok {
		return errors.New("a cookie reply to no response of ours")
	}
	key := wgHash([]byte("cookie--"), sent.initiator[:])
	a, err := chacha20poly1305.NewX(key[:])
	if err != nil {
		return err
	}
	v, err := a.Open(nil, msg[8:32], msg[32:64], sent.mac1[:])
	if err != nil {
		return err
	}
	r.cookies[sent.initiator] = cookie{value: [16]byte(v), at: time.Now()}
	return nil
}
