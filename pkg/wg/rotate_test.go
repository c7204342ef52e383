package wg

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestKeyRotationDelta: a peer whose key changed (a node rotated its key) is
// one created entry that takes over the allowed IPs, written before the old
// entry's removal, in one call; no other peer is touched.
func TestKeyRotationDelta(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	c.Reset()
	old, next := cfg.Peers[1].PublicKey, key(t, 7)
	cfg.Peers[1].PublicKey = next
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 1 {
		t.Fatalf("want one call, got %d", c.ConfigureCalls)
	}
	got := c.Configs[0]
	if got.ReplacePeers || got.PrivateKey != nil || got.ListenPort != nil {
		t.Fatalf("device-wide fields written: %+v", got)
	}
	keys := []wgtypes.Key{}
	for _, p := range got.Peers {
		keys = append(keys, p.PublicKey)
	}
	if keys[0] != next || keys[len(keys)-1] != old || !got.Peers[len(keys)-1].Remove {
		t.Fatalf("want the new key's entries first and the old key's removal last, got %+v", got.Peers)
	}
	if slices.ContainsFunc(got.Peers, func(p wgtypes.PeerConfig) bool { return p.PublicKey != old && p.PublicKey != next }) {
		t.Fatalf("another peer was touched: %+v", got.Peers)
	}
	if p := got.Peers[0]; p.UpdateOnly || !p.ReplaceAllowedIPs || len(p.AllowedIPs) != 1 || p.Endpoint == nil {
		t.Fatalf("created entry %+v", p)
	}
	checkState(t, c, cfg)
}

// TestPresharedKeyChangeUpdatesInPlace: a changed preshared key is an
// update of the existing peer (its sessions survive), never a removal.
func TestPresharedKeyChangeUpdatesInPlace(t *testing.T) {
	d, c, _ := newFake(t)
	cfg := baseConfig(t)
	mustSet(t, d, cfg)
	c.Reset()
	psk2 := key(t, 998)
	cfg.Peers[2].PresharedKey = &psk2
	mustSet(t, d, cfg)
	if c.ConfigureCalls != 1 || len(c.Configs[0].Peers) != 1 {
		t.Fatalf("want one call with one entry, got %+v", c.Configs)
	}
	p := c.Configs[0].Peers[0]
	if p.PublicKey != cfg.Peers[2].PublicKey || !p.UpdateOnly || p.Remove || p.PresharedKey == nil || *p.PresharedKey != psk2 || p.ReplaceAllowedIPs {
		t.Fatalf("entry %+v", p)
	}
	checkState(t, c, cfg)
}

// TestNextKeyFile: the next key of a rotation is stored once (0600), found
// again after a restart, and committed atomically over the current key,
// which is then gone from disk; committing twice is harmless.
func TestNextKeyFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	cur, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := LoadNextKey(dir); ok || err != nil {
		t.Fatalf("a next key before any rotation (%v)", err)
	}
	next, err := LoadOrCreateNextKey(dir)
	if err != nil || next == cur || next == (wgtypes.Key{}) {
		t.Fatalf("next key %v", err)
	}
	fi, err := os.Stat(filepath.Join(dir, "private-key.next"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("next key file: %v %v", fi, err)
	}
	// A restart in the middle: the same keys come back.
	if k, err := LoadOrCreateKey(dir); err != nil || k != cur {
		t.Fatalf("current key changed before the commit (%v)", err)
	}
	if k, ok, err := LoadNextKey(dir); err != nil || !ok || k != next {
		t.Fatalf("next key lost across a restart (%v)", err)
	}
	if k, err := LoadOrCreateNextKey(dir); err != nil || k != next {
		t.Fatalf("a second prepare made another next key (%v)", err)
	}
	other, _ := wgtypes.GeneratePrivateKey()
	if err := CommitNextKey(dir, other); err == nil {
		t.Fatal("committing a key that is not the next key succeeded")
	}
	if err := CommitNextKey(dir, next); err != nil {
		t.Fatal(err)
	}
	if k, err := LoadOrCreateKey(dir); err != nil || k != next {
		t.Fatalf("after the commit the current key is not the next one (%v)", err)
	}
	if _, ok, _ := LoadNextKey(dir); ok {
		t.Fatal("the next key file is still there")
	}
	if err := CommitNextKey(dir, next); err != nil {
		t.Fatalf("a repeated commit (a restart after the rename): %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("leftover files: %v", entries)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "private-key"))
	if string(b) == cur.String()+"\n" {
		t.Fatal("the old key is still on disk")
	}
}

var pingReply = regexp.MustCompile(`icmp_seq=(\d+) `)

// TestRootKeyRotationLosesNothing: with real userspace WireGuard on both
// sides and a 10 pps ping each way, node a switches to a new private key and
// node b learns it 300 ms later (the control plane's delay), replacing the
// old key's peer by the new one. a's packets wait in its queue during the
// handshake it cannot complete yet, b's still use the old session: nothing
// is lost in either direction.
func TestRootKeyRotationLosesNothing(t *testing.T) {
	requireRoot(t)
	a, b := twoNodes(t, testLoggerAt(t, 0))
	keyRotationLosesNothing(t, a, b)
	a.dev.Delete()
	b.dev.Delete()
}

// TestRootKeyRotationQuickPeerLosesNothing: the same with b learning the
// new key within a few milliseconds, before a's next packet: without the
// nudge of the kept peers at the switch (nudgeKept), a's first handshake
// as the new key could cross b's and stall both sides.
func TestRootKeyRotationQuickPeerLosesNothing(t *testing.T) {
	requireRoot(t)
	for _, learn := range []time.Duration{0, 20 * time.Millisecond, 60 * time.Millisecond} {
		t.Run(learn.String(), func(t *testing.T) {
			a, b := twoNodes(t, testLoggerAt(t, 0))
			keyRotationLosesNothingAfter(t, a, b, learn)
			a.dev.Delete()
			b.dev.Delete()
		})
	}
}

// TestRootKeyRotationInitiatesAtTheSwitch: with no traffic at all, the Set
// that switches a's key sends a handshake initiation as the new key at once
// (the nudge of the kept peers, nudgeKept): it shows as a's transmit bytes.
// b, not knowing the key yet, drops it; when b learns the key, b's
// initiation is the only one (a initiates no other for REKEY_TIMEOUT), so
// the two cannot cross, and the session as the new key works.
func TestRootKeyRotationInitiatesAtTheSwitch(t *testing.T) {
	requireRoot(t)
	a, b := twoNodes(t, testLoggerAt(t, 0))
	defer a.dev.Delete()
	defer b.dev.Delete()
	mustSet(t, a.dev, a.cfg)
	mustSet(t, b.dev, b.cfg)
	waitHandshake(t, a.dev, time.Time{}, 5*time.Second)
	tx := func() int64 {
		st, err := a.dev.Stats()
		if err != nil || len(st) != 1 {
			t.Fatalf("a's peers: %+v (%v)", st, err)
		}
		return st[0].TransmitBytes
	}
	// Quiet: the nudge's keepalive and its handshake are sent by now.
	time.Sleep(500 * time.Millisecond)
	before := tx()
	time.Sleep(300 * time.Millisecond)
	if tx() != before {
		t.Fatalf("a still sends before the switch")
	}
	newKey := privKey(t)
	a.cfg.PrivateKey = newKey
	mustSet(t, a.dev, a.cfg)
	deadline := time.Now().Add(2 * time.Second)
	for tx() == before {
		if time.Now().After(deadline) {
			t.Fatal("the switch sent no handshake initiation within 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	switched := time.Now()
	b.cfg.Peers[0].PublicKey = newKey.PublicKey()
	mustSet(t, b.dev, b.cfg)
	waitHandshake(t, b.dev, switched, 3*time.Second)
	if out, err := execIn(t, a.ns, "ping", "-c", "1", "-W", "2", "10.77.0.2"); err != nil {
		t.Fatalf("ping through the tunnel after the rotation: %v\n%s", err, out)
	}
}

// keyRotationLosesNothing: see TestRootKeyRotationLosesNothing (and
// TestKernelKeyRotationLosesNothing, the same on kernel WireGuard).
func keyRotationLosesNothing(t *testing.T, a, b *node) {
	t.Helper()
	keyRotationLosesNothingAfter(t, a, b, 300*time.Millisecond)
}

// keyRotationLosesNothingAfter rotates a's key with b learning it learn
// later.
func keyRotationLosesNothingAfter(t *testing.T, a, b *node, learn time.Duration) {
	t.Helper()
	mustSet(t, a.dev, a.cfg)
	mustSet(t, b.dev, b.cfg)
	waitHandshake(t, a.dev, time.Time{}, 5*time.Second)
	if out, err := execIn(t, a.ns, "ping", "-c", "1", "-W", "2", "10.77.0.2"); err != nil {
		t.Fatalf("ping through the tunnel: %v\n%s", err, out)
	}
	type result struct {
		out string
		err error
	}
	ping := func(from *node, dst string) chan result {
		ch := make(chan result, 1)
		go func() {
			out, err := execIn(t, from.ns, "ping", "-n", "-i", "0.1", "-c", "40", "-W", "2", dst)
			ch <- result{out, err}
		}()
		return ch
	}
	ab, ba := ping(a, "10.77.0.2"), ping(b, "10.77.0.1")
	time.Sleep(1 * time.Second)

	newKey := privKey(t)
	a.cfg.PrivateKey = newKey
	mustSet(t, a.dev, a.cfg)
	time.Sleep(learn)
	b.cfg.Peers[0].PublicKey = newKey.PublicKey()
	mustSet(t, b.dev, b.cfg)

	for name, ch := range map[string]chan result{"a->b": ab, "b->a": ba} {
		r := <-ch
		got := map[int]bool{}
		for _, m := range pingReply.FindAllStringSubmatch(r.out, -1) {
			n, _ := strconv.Atoi(m[1])
			got[n] = true
		}
		if len(got) != 40 {
			t.Errorf("%s: %d of 40 replies (%v):\n%s", name, len(got), r.err, r.out)
		}
	}
	st, _ := b.dev.Stats()
	if len(st) != 1 || st[0].PublicKey != newKey.PublicKey() {
		t.Fatalf("b's peers after the rotation: %+v", st)
	}
}
