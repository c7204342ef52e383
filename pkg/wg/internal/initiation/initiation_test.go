package initiation

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/chacha20poly1305"
	"golang.zx2c4.com/wireguard/tai64n"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/wg/internal/initiation/initiationtest"
)

func newKey(tb testing.TB) wgtypes.Key {
	tb.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// captureInitiation is initiationtest.Capture.
func captureInitiation(tb testing.TB, a, b wgtypes.Key) []byte {
	tb.Helper()
	return initiationtest.Capture(tb, a, b)
}

// withMAC1 returns a copy of msg (148 bytes) whose MAC1 is valid for the
// responder public key pub, computed here from the whitepaper's definition.
func withMAC1(msg []byte, pub wgtypes.Key) []byte {
	out := bytes.Clone(msg)
	key := blake2s.Sum256(append([]byte("mac1----"), pub[:]...))
	h, err := blake2s.New128(key[:])
	if err != nil {
		panic(err)
	}
	h.Write(out[:116])
	h.Sum(out[116:116])
	return out
}

// seal builds an initiation from initiator (a private key) to responder,
// as an initiator would, with the given ephemeral public key and DH result
// DH(ephemeral, responder); its timestamp is sealed with the static-static
// key of prover (the initiator itself, or another key for a forgery).
// The timestamp and MAC2 are random and MAC1 is valid.
func seal(tb testing.TB, responder wgtypes.Key, ephemeral, dh []byte, initiator, prover wgtypes.Key) []byte {
	tb.Helper()
	msg := make([]byte, 148)
	msg[0] = 1
	rand.Read(msg[4:8])
	copy(msg[8:40], ephemeral)
	h := mixHash(mixHash(initialHash, responder[:]), ephemeral)
	ck := kdf1(initialChainKey[:], ephemeral)
	ck, key := kdf2(ck[:], dh)
	aead, err := chacha20poly1305.New(key[:])
	if err != nil {
		tb.Fatal(err)
	}
	claimed := initiator.PublicKey()
	aead.Seal(msg[40:40], make([]byte, 12), claimed[:], h[:])
	h = mixHash(h, msg[40:88])
	priv, err := ecdh.X25519().NewPrivateKey(prover[:])
	if err != nil {
		tb.Fatal(err)
	}
	pub, err := ecdh.X25519().NewPublicKey(responder[:])
	if err != nil {
		tb.Fatal(err)
	}
	ss, err := priv.ECDH(pub)
	if err != nil {
		tb.Fatal(err)
	}
	_, key = kdf2(ck[:], ss)
	if aead, err = chacha20poly1305.New(key[:]); err != nil {
		tb.Fatal(err)
	}
	ts := make([]byte, 12)
	rand.Read(ts)
	aead.Seal(msg[88:88], make([]byte, 12), ts, h[:])
	rand.Read(msg[132:148])
	return withMAC1(msg, responder)
}

// TestSenderMatchesWireGuardGo checks Sender against initiations that
// wireguard-go sends.
func TestSenderMatchesWireGuardGo(t *testing.T) {
	for i := range 4 {
		a, b := newKey(t), newKey(t)
		msg := captureInitiation(t, a, b)
		if !IsInitiation(msg) {
			t.Fatalf("pair %d: IsInitiation(%x) = false for wireguard-go's initiation", i, msg)
		}
		got, ok := NewReader(b).Sender(msg)
		if !ok || got != a.PublicKey() {
			t.Fatalf("pair %d: Sender = %v, %v; want %v, true", i, got, ok, a.PublicKey())
		}
		// A second device with the same keys sends another initiation
		// (new ephemeral key): the same sender.
		msg2 := captureInitiation(t, a, b)
		if bytes.Equal(msg[8:40], msg2[8:40]) {
			t.Fatalf("pair %d: two initiations with the same ephemeral key", i)
		}
		if got, ok := NewReader(b).Sender(msg2); !ok || got != a.PublicKey() {
			t.Fatalf("pair %d, second initiation: Sender = %v, %v; want %v, true", i, got, ok, a.PublicKey())
		}
		// The timestamps: the initiator's clock (TAI64N: 2^62 + 10 + Unix
		// seconds, then nanoseconds), the second not before the first.
		_, ts1, ok1 := NewReader(b).SenderAt(msg)
		_, ts2, ok2 := NewReader(b).SenderAt(msg2)
		if !ok1 || !ok2 || ts1.After(ts2) {
			t.Fatalf("pair %d: timestamps %x, %x (%v, %v): want the second not before the first", i, ts1, ts2, ok1, ok2)
		}
		secs := int64(binary.BigEndian.Uint64(ts2[:8]) - (1<<62 + 10))
		if d := time.Now().Unix() - secs; d < -5 || d > 5 {
			t.Fatalf("pair %d: timestamp %x is %d s away from now", i, ts2, d)
		}
	}
}

func TestSenderRejects(t *testing.T) {
	a, b := newKey(t), newKey(t)
	msg := captureInitiation(t, a, b)
	r := NewReader(b)
	pubB := b.PublicKey()
	if got, ok := r.Sender(msg); !ok || got != a.PublicKey() {
		t.Fatalf("Sender(captured) = %v, %v; want %v, true", got, ok, a.PublicKey())
	}

	reject := func(t *testing.T, r *Reader, msg []byte) {
		t.Helper()
		if got, ok := r.Sender(msg); ok || got != (wgtypes.Key{}) {
			t.Errorf("Sender(%x) = %v, %v; want zero, false", msg, got, ok)
		}
	}

	t.Run("wrong private key", func(t *testing.T) {
		reject(t, NewReader(newKey(t)), msg)
		reject(t, NewReader(a), msg) // the initiator's own key
	})
	t.Run("zero key", func(t *testing.T) {
		reject(t, NewReader(wgtypes.Key{}), msg)
		reject(t, NewReader(wgtypes.Key{}), withMAC1(msg, pubB))
	})
	t.Run("nil Reader", func(t *testing.T) {
		reject(t, nil, msg)
	})
	t.Run("nil and empty", func(t *testing.T) {
		reject(t, r, nil)
		reject(t, r, []byte{})
		reject(t, r, make([]byte, 148))
	})
	t.Run("length", func(t *testing.T) {
		for n := range 148 {
			reject(t, r, msg[:n])
		}
		for n := 149; n <= 300; n++ {
			long := append(bytes.Clone(msg), make([]byte, n-148)...)
			reject(t, r, long)
			// The initiation followed by its own bytes again, in case a
			// parser only reads a 148-byte prefix.
			reject(t, r, append(bytes.Clone(msg), msg[:n-148]...))
		}
	})
	t.Run("type", func(t *testing.T) {
		for _, typ := range []byte{0, 2, 3, 4, 5, 0x81, 0xff} {
			m := bytes.Clone(msg)
			m[0] = typ
			if IsInitiation(m) {
				t.Errorf("IsInitiation with type %d = true", typ)
			}
			reject(t, r, m)
			reject(t, r, withMAC1(m, pubB)) // even with a valid MAC1
		}
	})
	t.Run("reserved", func(t *testing.T) {
		for i := 1; i <= 3; i++ {
			for _, v := range []byte{1, 0x80, 0xff} {
				m := bytes.Clone(msg)
				m[i] = v
				if IsInitiation(m) {
					t.Errorf("IsInitiation with byte %d = %#x: true", i, v)
				}
				reject(t, r, m)
				reject(t, r, withMAC1(m, pubB))
			}
		}
	})
	t.Run("bit flips", func(t *testing.T) {
		// In the ephemeral key, the encrypted static key and MAC1: every
		// flip is caught by MAC1, and in the first two also by the AEAD
		// when MAC1 is made valid again.
		for bit := 8 * 8; bit < 8*132; bit++ {
			if 8*88 <= bit && bit < 8*116 {
				continue // the encrypted timestamp: below
			}
			m := bytes.Clone(msg)
			m[bit/8] ^= 1 << (bit % 8)
			reject(t, r, m)
			if bit < 8*88 {
				reject(t, r, withMAC1(m, pubB))
			}
		}
	})
	t.Run("outside the static key", func(t *testing.T) {
		// MAC1 covers the sender index, which Sender does not read
		// otherwise, and the timestamp, which it authenticates (below);
		// MAC2 is not checked.
		for _, bit := range []int{8 * 88, 8*100 + 3, 8*115 + 7} {
			m := bytes.Clone(msg)
			m[bit/8] ^= 1 << (bit % 8)
			reject(t, r, withMAC1(m, pubB))
		}
		for _, bit := range []int{8 * 4, 8*7 + 7} {
			m := bytes.Clone(msg)
			m[bit/8] ^= 1 << (bit % 8)
			reject(t, r, m)
			if got, ok := r.Sender(withMAC1(m, pubB)); !ok || got != a.PublicKey() {
				t.Errorf("bit %d flipped, MAC1 fixed: Sender = %v, %v; want %v, true", bit, got, ok, a.PublicKey())
			}
		}
		for bit := 8 * 132; bit < 8*148; bit++ {
			m := bytes.Clone(msg)
			m[bit/8] ^= 1 << (bit % 8)
			if got, ok := r.Sender(m); !ok || got != a.PublicKey() {
				t.Errorf("MAC2 bit %d flipped: Sender = %v, %v; want %v, true", bit, got, ok, a.PublicKey())
			}
		}
	})
	t.Run("MAC1 for another key", func(t *testing.T) {
		reject(t, r, withMAC1(msg, newKey(t).PublicKey()))
	})
	t.Run("input not modified", func(t *testing.T) {
		m := bytes.Clone(msg)
		r.Sender(m)
		if !bytes.Equal(m, msg) {
			t.Error("Sender modified its input")
		}
	})
}

// TestLowOrderEphemeral checks that an initiation whose DH result is all
// zeros is rejected even though anyone can seal a static key for it.
func TestLowOrderEphemeral(t *testing.T) {
	b := newKey(t)
	r := NewReader(b)
	initiator := newKey(t)
	claimed := initiator.PublicKey()

	// The control: the same construction with a real ephemeral key is
	// accepted, so seal is right and the rejections below come from the
	// DH result.
	eph, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	bPub := b.PublicKey()
	pubB, err := ecdh.X25519().NewPublicKey(bPub[:])
	if err != nil {
		t.Fatal(err)
	}
	dh, err := eph.ECDH(pubB)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Sender(seal(t, b.PublicKey(), eph.PublicKey().Bytes(), dh, initiator, initiator)); !ok || got != claimed {
		t.Fatalf("control: Sender = %v, %v; want %v, true", got, ok, claimed)
	}
	// A forgery: the same initiation naming the initiator by someone
	// without its private key, who can seal the static key (to b's public
	// key) but not the timestamp.
	if got, ok := r.Sender(seal(t, b.PublicKey(), eph.PublicKey().Bytes(), dh, initiator, newKey(t))); ok {
		t.Fatalf("forged initiation: Sender = %v, true; want false", got)
	}

	// u-coordinates of points of small order (and p, p+1, equal to 0 and 1
	// modulo p): X25519 with any clamped scalar gives zero.
	p := bytes.Repeat([]byte{0xff}, 32)
	p[0], p[31] = 0xed, 0x7f
	pMinus1 := bytes.Clone(p)
	pMinus1[0] = 0xec
	pPlus1 := bytes.Clone(p)
	pPlus1[0] = 0xee
	lowOrder := [][]byte{make([]byte, 32), append([]byte{1}, make([]byte, 31)...), pMinus1, p, pPlus1}
	for _, u := range lowOrder {
		msg := seal(t, b.PublicKey(), u, make([]byte, 32), initiator, initiator)
		if got, ok := r.Sender(msg); ok {
			t.Errorf("ephemeral %x (low order): Sender = %v, true; want false", u, got)
		}
	}
}

func TestConcurrent(t *testing.T) {
	a, b := newKey(t), newKey(t)
	msg := captureInitiation(t, a, b)
	bad := bytes.Clone(msg)
	bad[120] ^= 1
	r := NewReader(b)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if got, ok := r.Sender(msg); !ok || got != a.PublicKey() {
					t.Errorf("Sender = %v, %v; want %v, true", got, ok, a.PublicKey())
					return
				}
				if _, ok := r.Sender(bad); ok {
					t.Error("Sender(bad MAC1) = true")
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestRejectAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	a, b := newKey(t), newKey(t)
	msg := captureInitiation(t, a, b)
	r := NewReader(b)
	badMAC := bytes.Clone(msg)
	badMAC[120] ^= 1
	badType := bytes.Clone(msg)
	badType[0] = 2
	for name, m := range map[string][]byte{"short": msg[:147], "type": badType, "MAC1": badMAC, "nil": nil} {
		if n := testing.AllocsPerRun(1000, func() { r.Sender(m) }); n != 0 {
			t.Errorf("%s: %v allocations per rejection, want 0", name, n)
		}
	}
}

func FuzzSender(f *testing.F) {
	b := newKey(f)
	pubB := b.PublicKey()
	msg := captureInitiation(f, newKey(f), b)
	f.Add(msg)
	f.Add(msg[:100])
	k := newKey(f)
	f.Add(seal(f, pubB, make([]byte, 32), make([]byte, 32), k, k))
	f.Add([]byte{})
	r := NewReader(b)
	zero := NewReader(wgtypes.Key{})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := bytes.Clone(data)
		check := func(m []byte) {
			peer, ok := r.Sender(m)
			if !ok {
				if peer != (wgtypes.Key{}) {
					t.Fatalf("Sender = %v, false: want the zero key with false", peer)
				}
				return
			}
			if !IsInitiation(m) {
				t.Fatalf("Sender accepted %x, which IsInitiation rejects", m)
			}
			if again, ok2 := r.Sender(m); !ok2 || again != peer {
				t.Fatalf("Sender not deterministic: %v, true then %v, %v", peer, again, ok2)
			}
		}
		check(data)
		if !bytes.Equal(data, in) {
			t.Fatal("Sender modified its input")
		}
		// With MAC1 made valid, so that the fuzzer reaches the decryption.
		if len(data) == 148 {
			check(withMAC1(data, pubB))
		}
		if _, ok := zero.Sender(data); ok {
			t.Fatal("the zero-key Reader identified a sender")
		}
	})
}

func BenchmarkSender(b *testing.B) {
	a, k := newKey(b), newKey(b)
	msg := captureInitiation(b, a, k)
	r := NewReader(k)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := r.Sender(msg); !ok {
			b.Fatal("Sender rejected a valid initiation")
		}
	}
}

func BenchmarkSenderReject(b *testing.B) {
	a, k := newKey(b), newKey(b)
	msg := captureInitiation(b, a, k)
	msg[120] ^= 1 // bad MAC1
	r := NewReader(k)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := r.Sender(msg); ok {
			b.Fatal("Sender accepted a bad MAC1")
		}
	}
}

// TestValidMAC1 checks the cheap half of Sender: the shape and MAC1 only.
func TestValidMAC1(t *testing.T) {
	a, b := newKey(t), newKey(t)
	msg := captureInitiation(t, a, b)
	r := NewReader(b)
	if !r.ValidMAC1(msg) {
		t.Fatal("ValidMAC1(captured) = false")
	}
	if NewReader(newKey(t)).ValidMAC1(msg) || NewReader(wgtypes.Key{}).ValidMAC1(msg) || (*Reader)(nil).ValidMAC1(msg) {
		t.Error("ValidMAC1 true for another key, the zero key or a nil Reader")
	}
	bad := bytes.Clone(msg)
	bad[120] ^= 1 // MAC1
	if r.ValidMAC1(bad) || r.ValidMAC1(msg[:147]) {
		t.Error("ValidMAC1 true for a bad MAC1 or a short message")
	}
	forged := bytes.Clone(msg)
	forged[50] ^= 1 // the static key, MAC1 made valid again
	forged = withMAC1(forged, b.PublicKey())
	if !r.ValidMAC1(forged) {
		t.Error("ValidMAC1 false for a valid MAC1")
	}
	if _, ok := r.Sender(forged); ok {
		t.Error("Sender accepted a damaged static key")
	}
}

// TestTimestampAt: TimestampAt encodes a time as wireguard-go stamps an
// initiation then (its whitening rounds the nanoseconds down, by at most
// 2^24 ns).
func TestTimestampAt(t *testing.T) {
	before := time.Now().Add(-20 * time.Millisecond)
	got := Timestamp(tai64n.Now())
	after := time.Now()
	if TimestampAt(before).After(got) || got.After(TimestampAt(after)) {
		t.Fatalf("wireguard-go's %x not between %x and %x", got, TimestampAt(before), TimestampAt(after))
	}
	if !TimestampAt(after).After(TimestampAt(before)) || TimestampAt(before).After(TimestampAt(before)) {
		t.Fatal("After is not a strict order of times")
	}
}
