package initiation

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hmac"
	"encoding/binary"
	"hash"
	"sync"
	"time"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/chacha20poly1305"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// The layout of a handshake initiation: type (1), reserved (3), sender
// index (4), ephemeral (32), encrypted static (32 + 16), encrypted
// timestamp (12 + 16), mac1 (16), mac2 (16).
const (
	messageType  = 1
	size         = 148
	offEphemeral = 8
	offStatic    = offEphemeral + 32
	offTimestamp = offStatic + 32 + chacha20poly1305.Overhead
	offMAC1      = offTimestamp + 12 + chacha20poly1305.Overhead
	offMAC2      = offMAC1 + blake2s.Size128
)

// The protocol's constant strings.
const (
	construction = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s"
	identifier   = "WireGuard v1 zx2c4 Jason@zx2c4.com"
	labelMAC1    = "mac1----"
)

var (
	// initialChainKey is Ci = HASH(Construction).
	initialChainKey = blake2s.Sum256([]byte(construction))
	// initialHash is Hi = HASH(Ci || Identifier).
	initialHash = mixHash(initialChainKey, []byte(identifier))
)

// Reader reads the sender of handshake initiations addressed to one private key.
//
// A Reader is safe for concurrent use; it must not be copied.
type Reader struct {
	priv *ecdh.PrivateKey // nil: the Reader identifies nothing
	// hash is Hi = HASH(HASH(Ci || Identifier) || Spub_responder), the
	// handshake hash before the initiator's ephemeral key is mixed in.
	hash [blake2s.Size]byte
	// mac1Key is HASH("mac1----" || Spub_responder).
	mac1Key [blake2s.Size]byte
	// macs holds *macState keyed with mac1Key, so that checking MAC1
	// allocates nothing.
	macs sync.Pool
}

// macState is a keyed BLAKE2s-128 and room for its sum.
type macState struct {
	h   hash.Hash
	sum [blake2s.Size128]byte
}

// NewReader returns a Reader for the device whose private key is priv (a zero key: a Reader that identifies nothing).
func NewReader(priv wgtypes.Key) *Reader {
	r := &Reader{}
	if priv == (wgtypes.Key{}) {
		return r
	}
	// crypto/ecdh clamps the scalar as X25519 does. Keeping the parsed key
	// saves a scalar multiplication per message over curve25519.X25519,
	// which computes the public key again on every call. It fails only in
	// FIPS 140-only mode, where wireguard-go cannot run either.
	k, err := ecdh.X25519().NewPrivateKey(priv[:])
	if err != nil {
		return r
	}
	pub := k.PublicKey().Bytes()
	r.priv = k
	r.hash = mixHash(initialHash, pub)
	r.mac1Key = blake2s.Sum256(append([]byte(labelMAC1), pub...))
	r.macs.New = func() any {
		h, err := blake2s.New128(r.mac1Key[:])
		if err != nil {
			panic("initiation: " + err.Error()) // a 32-byte key is always valid
		}
		return &macState{h: h}
	}
	return r
}

// Sender returns the static public key of the peer that sent msg, a whole
// UDP payload, if msg is a WireGuard handshake initiation (message type 1,
// exactly 148 bytes, the 3 reserved bytes zero) whose MAC1 is valid for
// this Reader's public key, whose encrypted static key decrypts with this
// Reader's private key and whose encrypted timestamp opens with the key the
// two static keys share (proof that the sender holds its private key);
// otherwise ok is false. It never panics on any input, and it allocates
// nothing on the fast reject paths (wrong length/type, bad MAC1). MAC2, the
// sender index and the timestamp's value are not looked at.
func (r *Reader) Sender(msg []byte) (peer wgtypes.Key, ok bool) {
	peer, _, ok = r.SenderAt(msg)
	return peer, ok
}

// Timestamp is an initiation's TAI64N timestamp: the initiator's clock
// when it made the message, big-endian (seconds, then nanoseconds), so
// that a later one compares greater byte by byte. A responder takes an
// initiation from a peer only when its timestamp is after the last one it
// took from that peer: that is what refuses replays.
type Timestamp [12]byte

// TimestampAt is the timestamp an initiator whose clock reads t puts in an
// initiation (TAI64N: 2^62 + 10 + the Unix seconds, then the
// nanoseconds), as wireguard-go writes it but without its whitening.
func TimestampAt(t time.Time) Timestamp {
	var ts Timestamp
	binary.BigEndian.PutUint64(ts[:8], uint64(1<<62+10+t.Unix()))
	binary.BigEndian.PutUint32(ts[8:], uint32(t.Nanosecond()))
	return ts
}

// After reports whether t is later than u.
func (t Timestamp) After(u Timestamp) bool { return bytes.Compare(t[:], u[:]) > 0 }

// SenderAt is Sender that also returns the message's decrypted timestamp,
// for a caller that must refuse replays itself.
func (r *Reader) SenderAt(msg []byte) (peer wgtypes.Key, ts Timestamp, ok bool) {
	if r == nil || r.priv == nil || !IsInitiation(msg) || !r.validMAC1(msg) {
		return wgtypes.Key{}, Timestamp{}, false
	}
	return r.decryptStatic(msg)
}

// ValidMAC1 reports whether msg has the shape of an initiation (see
// IsInitiation) and a MAC1 valid for this Reader's public key: the cheap
// part of Sender (no Diffie-Hellman), which a caller can use to rate-limit
// only the rest.
func (r *Reader) ValidMAC1(msg []byte) bool {
	return r != nil && r.priv != nil && IsInitiation(msg) && r.validMAC1(msg)
}

// IsInitiation reports cheaply (no crypto) whether msg has the shape of an initiation (type 1, reserved bytes zero, 148 bytes).
func IsInitiation(msg []byte) bool {
	return len(msg) == size && msg[0] == messageType && msg[1] == 0 && msg[2] == 0 && msg[3] == 0
}

// validMAC1 reports whether msg's MAC1, the keyed BLAKE2s-128 of
// everything before it, is right for this Reader's public key. msg is
// size bytes long.
func (r *Reader) validMAC1(msg []byte) bool {
	s := r.macs.Get().(*macState)
	s.h.Reset()
	s.h.Write(msg[:offMAC1])
	ok := hmac.Equal(s.h.Sum(s.sum[:0]), msg[offMAC1:offMAC2]) // constant time
	r.macs.Put(s)
	return ok
}

// decryptStatic decrypts msg's static key, msg being an initiation of size
// bytes with a valid MAC1:
//
//	Hi = HASH(Hi || msg.ephemeral)   (Hi already holds Spub_responder)
//	Ci = KDF1(Ci, msg.ephemeral)
//	(Ci, k) = KDF2(Ci, DH(Spriv_responder, msg.ephemeral))
//	static = AEAD-decrypt(k, 0, msg.static, Hi)
func (r *Reader) decryptStatic(msg []byte) (peer wgtypes.Key, ts Timestamp, ok bool) {
	ephemeral := msg[offEphemeral:offStatic]
	pub, err := ecdh.X25519().NewPublicKey(ephemeral)
	if err != nil {
		return wgtypes.Key{}, Timestamp{}, false
	}
	// ECDH fails when the result is all zeros (a low-order ephemeral key):
	// the key below would then be known to anyone.
	dh, err := r.priv.ECDH(pub)
	if err != nil {
		return wgtypes.Key{}, Timestamp{}, false
	}
	h := mixHash(r.hash, ephemeral)
	ck := kdf1(initialChainKey[:], ephemeral)
	ck, key := kdf2(ck[:], dh)
	clear(dh)
	aead, err := chacha20poly1305.New(key[:])
	clear(key[:])
	if err != nil {
		return wgtypes.Key{}, Timestamp{}, false
	}
	var nonce [chacha20poly1305.NonceSize]byte
	if _, err := aead.Open(peer[:0], nonce[:], msg[offStatic:offTimestamp], h[:]); err != nil {
		return wgtypes.Key{}, Timestamp{}, false
	}
	ts, ok = r.provenBy(peer, msg, mixHash(h, msg[offStatic:offTimestamp]), ck)
	if !ok {
		return wgtypes.Key{}, Timestamp{}, false
	}
	return peer, ts, true
}

// provenBy reports whether msg's encrypted timestamp decrypts with the key
// only the holder of peer's private key (or this Reader's) can derive,
// which anyone knowing this Reader's public key could otherwise name in an
// initiation of their own:
//
//	Hi = HASH(Hi || msg.static)       (h)
//	(Ci, k) = KDF2(Ci, DH(Spriv_responder, Spub_initiator))
//	timestamp = AEAD-decrypt(k, 0, msg.timestamp, Hi)
//
// It returns the timestamp: refusing an initiation replayed to a peer
// that wireguard-go has forgotten (taken out of the device, which drops
// the last timestamp it took) is the caller's job.
func (r *Reader) provenBy(peer wgtypes.Key, msg []byte, h, ck [blake2s.Size]byte) (ts Timestamp, ok bool) {
	pub, err := ecdh.X25519().NewPublicKey(peer[:])
	if err != nil {
		return Timestamp{}, false
	}
	ss, err := r.priv.ECDH(pub) // fails on an all-zero result, as wireguard-go refuses it
	if err != nil {
		return Timestamp{}, false
	}
	_, key := kdf2(ck[:], ss)
	clear(ss)
	aead, err := chacha20poly1305.New(key[:])
	clear(key[:])
	if err != nil {
		return Timestamp{}, false
	}
	var nonce [chacha20poly1305.NonceSize]byte
	if _, err := aead.Open(ts[:0], nonce[:], msg[offTimestamp:offMAC1], h[:]); err != nil {
		return Timestamp{}, false
	}
	return ts, true
}

// mixHash returns HASH(h || data).
func mixHash(h [blake2s.Size]byte, data []byte) [blake2s.Size]byte {
	d, _ := blake2s.New256(nil)
	d.Write(h[:])
	d.Write(data)
	var sum [blake2s.Size]byte
	d.Sum(sum[:0])
	return sum
}

func newHash() hash.Hash {
	h, _ := blake2s.New256(nil) // unkeyed: never fails
	return h
}

// hmacSum returns HMAC-BLAKE2s(key, in...).
func hmacSum(key []byte, in ...[]byte) [blake2s.Size]byte {
	m := hmac.New(newHash, key)
	for _, b := range in {
		m.Write(b)
	}
	var sum [blake2s.Size]byte
	m.Sum(sum[:0])
	return sum
}

// kdf1 returns the first output of the WireGuard KDF (HKDF with
// HMAC-BLAKE2s, key as the salt and input as the key material).
func kdf1(key, input []byte) [blake2s.Size]byte {
	prk := hmacSum(key, input)
	t0 := hmacSum(prk[:], []byte{1})
	clear(prk[:])
	return t0
}

// kdf2 returns the first two outputs of the WireGuard KDF.
func kdf2(key, input []byte) (t0, t1 [blake2s.Size]byte) {
	prk := hmacSum(key, input)
	t0 = hmacSum(prk[:], []byte{1})
	t1 = hmacSum(prk[:], t0[:], []byte{2})
	clear(prk[:])
	return t0, t1
}
