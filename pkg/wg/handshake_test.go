package wg

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// keyPair returns two private keys whose public keys are ordered: low < high.
func keyPair(t *testing.T) (low, high wgtypes.Key) {
	t.Helper()
	a, _ := wgtypes.GeneratePrivateKey()
	b, _ := wgtypes.GeneratePrivateKey()
	if compareKeys(a.PublicKey(), b.PublicKey()) > 0 {
		a, b = b, a
	}
	return a, b
}

func handshakeDevice(t *testing.T, own wgtypes.Key, peer wgtypes.Key, clock *time.Time) (*Device, *FakeClient, Config) {
	t.Helper()
	fc := NewFakeClient()
	fc.AddDevice("hs0")
	links := NewFakeLinks()
	links.AddLink("hs0", 3, 1420)
	d := NewWithClient("hs0", fc, links, 1420, nil)
	d.now = func() time.Time { return *clock }
	cfg := Config{PrivateKey: own, ListenPort: 51820, Peers: []Peer{{
		PublicKey:  peer.PublicKey(),
		Endpoint:   net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.51.100.2:51820")),
		AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.42.2.0/24")},
	}}}
	if err := d.Set(cfg); err != nil {
		t.Fatal(err)
	}
	return d, fc, cfg
}

// TestHandshakeRetryStaggered: a peer with no handshake a second after it
// was added is re-created (a fresh initiation) by retryHandshakes on the lower
// key's side; the higher key's side waits longer; at most handshakeMaxRetries
// times, never once a handshake happened, and never by Set (a pure diff).
func TestHandshakeRetryStaggered(t *testing.T) {
	low, high := keyPair(t)
	clock := time.Unix(1000, 0)

	d, fc, cfg := handshakeDevice(t, low, high, &clock)
	if due, ok := d.handshakeCheckDue(); !ok || due != handshakeCrossedAfter {
		t.Fatalf("lower key: want a crossing check due in %s, got %s %v", handshakeCrossedAfter, due, ok)
	}
	w := d.Writes()
	if err := d.retryHandshakes(); err != nil || d.Writes() != w {
		t.Fatalf("before the retry delay nothing may be retried (%v)", err)
	}
	clock = clock.Add(10 * handshakeRetryAfter)
	if err := d.Set(cfg); err != nil || d.Writes() != w {
		t.Fatalf("an unchanged Set must write nothing, however late (%v)", err)
	}
	clock = clock.Add(-10 * handshakeRetryAfter)
	for i := 1; i <= handshakeMaxRetries; i++ {
		clock = clock.Add(handshakeRetryAfter)
		fc.SetReceived("hs0", high.PublicKey(), 148) // its crossed initiation reached us
		if err := d.retryHandshakes(); err != nil {
			t.Fatal(err)
		}
		if d.Writes() != w+uint64(i) {
			t.Fatalf("retry %d: want one more write, writes %d → %d", i, w, d.Writes())
		}
		last := fc.Configs[len(fc.Configs)-1]
		if len(last.Peers) < 2 || !last.Peers[0].Remove || last.Peers[1].Remove || last.Peers[1].Endpoint == nil {
			t.Fatalf("retry %d: want remove + re-add with endpoint, got %+v", i, last.Peers)
		}
	}
	clock = clock.Add(handshakeRetryAfter)
	fc.SetReceived("hs0", high.PublicKey(), 148)
	w = d.Writes()
	if err := d.retryHandshakes(); err != nil || d.Writes() != w {
		t.Fatalf("more than %d retries", handshakeMaxRetries)
	}
	if err := d.Set(cfg); err != nil || d.Writes() != w {
		t.Fatalf("Set after the retries must write nothing (%v)", err)
	}
	if _, ok := d.handshakeCheckDue(); ok {
		t.Fatal("no check may be due after the last retry")
	}

	// The higher key's side retries only after the longer delay.
	clock = time.Unix(1000, 0)
	d2, fc2, _ := handshakeDevice(t, high, low, &clock)
	if due, ok := d2.handshakeCheckDue(); !ok || due != handshakeCrossedAfterHigh {
		t.Fatalf("higher key: want a crossing check due in %s, got %s %v", handshakeCrossedAfterHigh, due, ok)
	}
	clock = clock.Add(handshakeRetryAfter)
	w = d2.Writes()
	if err := d2.retryHandshakes(); err != nil || d2.Writes() != w {
		t.Fatal("higher key side re-created the peer as early as the lower one")
	}
	fc2.SetReceived("hs0", low.PublicKey(), 148)
	clock = clock.Add(handshakeRetryAfterHigh)
	if err := d2.retryHandshakes(); err != nil || d2.Writes() != w+1 {
		t.Fatal("higher key side did not retry after its longer delay")
	}

	// A peer we heard nothing from (unreachable, or not configured yet) is
	// retried once, then left to WireGuard's own retries.
	clock = time.Unix(1000, 0)
	d4, _, _ := handshakeDevice(t, low, high, &clock)
	clock = clock.Add(handshakeRetryAfter)
	w = d4.Writes()
	if err := d4.retryHandshakes(); err != nil || d4.Writes() != w+1 {
		t.Fatal("a silent peer must be retried once")
	}
	clock = clock.Add(handshakeRetryAfter)
	if err := d4.retryHandshakes(); err != nil || d4.Writes() != w+1 {
		t.Fatal("re-created a silent peer twice")
	}
	if _, ok := d4.handshakeCheckDue(); ok {
		t.Fatal("a checked silent peer must not schedule more checks")
	}

	// A completed handshake ends the retries; once the peer is heard from
	// after it, the checks end too (TestHandshakeSessionCheck).
	clock = time.Unix(1000, 0)
	d3, fc3, _ := handshakeDevice(t, low, high, &clock)
	fc3.SetHandshake("hs0", high.PublicKey(), clock)
	fc3.SetReceived("hs0", high.PublicKey(), 92)
	clock = clock.Add(2 * handshakeRetryAfter)
	w = d3.Writes()
	if err := d3.retryHandshakes(); err != nil || d3.Writes() != w {
		t.Fatal("re-created a peer that completed its handshake")
	}
	fc3.SetReceived("hs0", high.PublicKey(), 92+128)
	clock = clock.Add(sessionCheckEvery)
	if err := d3.retryHandshakes(); err != nil || d3.Writes() != w {
		t.Fatal("re-created a peer that completed its handshake and was heard from")
	}
	if _, ok := d3.handshakeCheckDue(); ok {
		t.Fatal("no check may be due after a handshake and traffic back")
	}
}

// TestHandshakeSessionCheck: after a first handshake, a peer this side sent
// data to (more than a keepalive) but heard nothing from since is re-created
// sessionSilentAfter later (wireguard-go can install a crossed handshake's
// session under a released receiver index: both sides see a handshake, one
// direction carries nothing, for 15 s); a peer heard from, or sent nothing
// but a keepalive, is left alone, and the checks end.
func TestHandshakeSessionCheck(t *testing.T) {
	low, high := keyPair(t)
	peer := high.PublicKey()
	start := time.Unix(1000, 0)
	// handshaken returns a device whose peer completed its first handshake,
	// and the check's first look at it (the session starts), with the
	// handshake's bytes counted both ways.
	handshaken := func(clock *time.Time) (*Device, *FakeClient) {
		*clock = start
		d, fc, _ := handshakeDevice(t, low, high, clock)
		*clock = clock.Add(10 * time.Millisecond)
		fc.SetHandshake("hs0", peer, *clock)
		fc.SetReceived("hs0", peer, 92)
		fc.SetTransmitted("hs0", peer, 148+keepaliveBytes)
		*clock = start.Add(handshakeCrossedAfter)
		if err := d.retryHandshakes(); err != nil {
			t.Fatal(err)
		}
		if due, ok := d.handshakeCheckDue(); !ok || due != sessionCheckEvery {
			t.Fatalf("after a first handshake, want the session check due in %s, got %s %v", sessionCheckEvery, due, ok)
		}
		return d, fc
	}
	step := func(d *Device, clock *time.Time, by time.Duration) uint64 {
		t.Helper()
		*clock = clock.Add(by)
		w := d.Writes()
		if err := d.retryHandshakes(); err != nil {
			t.Fatal(err)
		}
		return d.Writes() - w
	}

	// Sent data, heard nothing back: re-created sessionSilentAfter after the
	// check first saw the data, not before.
	var clock time.Time
	d, fc := handshaken(&clock)
	fc.SetTransmitted("hs0", peer, 148+keepaliveBytes+128)
	if n := step(d, &clock, sessionCheckEvery); n != 0 {
		t.Fatal("re-created the peer as soon as data was sent")
	}
	if due, ok := d.handshakeCheckDue(); !ok || due != sessionSilentAfter {
		t.Fatalf("want the next look %s after the data was seen, got %s %v", sessionSilentAfter, due, ok)
	}
	if n := step(d, &clock, sessionSilentAfter/2); n != 0 {
		t.Fatal("re-created the peer before sessionSilentAfter")
	}
	if n := step(d, &clock, sessionSilentAfter/2); n != 1 {
		t.Fatal("a session that carries nothing back was not re-created")
	}
	last := fc.Configs[len(fc.Configs)-1]
	if len(last.Peers) < 2 || !last.Peers[0].Remove || last.Peers[1].Endpoint == nil {
		t.Fatalf("want remove + re-add with endpoint, got %+v", last.Peers)
	}
	if due, ok := d.handshakeCheckDue(); !ok || due != handshakeCrossedAfter {
		t.Fatalf("the re-created peer's first handshake is awaited again: want a check in %s, got %s %v", handshakeCrossedAfter, due, ok)
	}

	// Sent data and heard back, at the next look or after the data was
	// seen but before the delay: done, nothing re-created, no more checks.
	for _, seenFirst := range []bool{false, true} {
		d, fc = handshaken(&clock)
		fc.SetTransmitted("hs0", peer, 148+keepaliveBytes+128)
		if seenFirst {
			step(d, &clock, sessionCheckEvery)
		}
		fc.SetReceived("hs0", peer, 92+128)
		if n := step(d, &clock, sessionCheckEvery); n != 0 {
			t.Fatalf("re-created a peer that answered (data seen before: %v)", seenFirst)
		}
		if _, ok := d.handshakeCheckDue(); ok {
			t.Fatalf("a check is due for a peer that answered after its handshake (data seen before: %v)", seenFirst)
		}
	}

	// Only a keepalive sent: no sign of a one-way session; the checks end
	// after sessionWatchFor.
	d, fc = handshaken(&clock)
	fc.SetTransmitted("hs0", peer, 148+2*keepaliveBytes)
	for by := time.Duration(0); by < sessionWatchFor; by += sessionCheckEvery {
		if n := step(d, &clock, sessionCheckEvery); n != 0 {
			t.Fatal("re-created a peer that was sent only a keepalive")
		}
	}
	if _, ok := d.handshakeCheckDue(); ok {
		t.Fatalf("checks still due %s after the handshake of a quiet peer", sessionWatchFor)
	}

	// A persistent keepalive: its keepalives are no data either.
	d, fc = handshaken(&clock)
	ka := time.Second
	if err := fc.ConfigureDevice("hs0", wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: peer, UpdateOnly: true, PersistentKeepaliveInterval: &ka}}}); err != nil {
		t.Fatal(err)
	}
	sent := int64(148 + keepaliveBytes)
	for by := time.Duration(0); by < sessionWatchFor; by += sessionCheckEvery {
		if by%time.Second == 0 {
			sent += keepaliveBytes
			fc.SetTransmitted("hs0", peer, sent)
		}
		if n := step(d, &clock, sessionCheckEvery); n != 0 {
			t.Fatalf("re-created a peer sent only its persistent keepalives (%d bytes)", sent)
		}
	}

	// Retries exhausted: left to WireGuard.
	d, fc = handshaken(&clock)
	for i := 0; i < handshakeMaxRetries; i++ {
		fc.SetHandshake("hs0", peer, clock)
		fc.SetReceived("hs0", peer, 92)
		fc.SetTransmitted("hs0", peer, 148+keepaliveBytes)
		step(d, &clock, handshakeCrossedAfter) // the session starts
		fc.SetTransmitted("hs0", peer, 148+keepaliveBytes+128)
		step(d, &clock, sessionCheckEvery) // data seen
		if n := step(d, &clock, sessionSilentAfter); n != 1 {
			t.Fatalf("retry %d: not re-created", i+1)
		}
	}
	fc.SetHandshake("hs0", peer, clock)
	fc.SetReceived("hs0", peer, 92)
	fc.SetTransmitted("hs0", peer, 148+keepaliveBytes+128)
	for range 4 {
		if n := step(d, &clock, sessionSilentAfter); n != 0 {
			t.Fatalf("re-created the peer more than %d times", handshakeMaxRetries)
		}
	}
	if _, ok := d.handshakeCheckDue(); ok {
		t.Fatal("a check is due after the last retry")
	}
}

// TestHandshakeCrossingCheck: a tenth of a second after a peer was created,
// the lower key's side looks whether it heard from the peer but has no
// handshake (both initiated at once, each discarded the answer to its own),
// and re-creates it if that is still so a tenth of a second later (an
// initiation it just answered completes one round trip later, and
// re-creating the peer meanwhile would drop that session); a silent peer is
// left to the regular check; the higher key's side looks later, so the two
// re-creations do not cross again.
func TestHandshakeCrossingCheck(t *testing.T) {
	low, high := keyPair(t)
	clock := time.Unix(1000, 0)
	d, fc, _ := handshakeDevice(t, low, high, &clock)
	clock = clock.Add(handshakeCrossedAfter / 2)
	fc.SetReceived("hs0", high.PublicKey(), 148) // its initiation crossed ours
	w := d.Writes()
	if err := d.retryHandshakes(); err != nil || d.Writes() != w {
		t.Fatalf("crossing check before it was due (%v)", err)
	}
	clock = clock.Add(handshakeCrossedAfter / 2)
	if err := d.retryHandshakes(); err != nil || d.Writes() != w {
		t.Fatalf("re-created a peer as soon as it was heard from: an answered initiation completes a round trip later (%v)", err)
	}
	if due, ok := d.handshakeCheckDue(); !ok || due != handshakeCrossedAfter {
		t.Fatalf("the crossing check must look again %s after it first heard from the peer, got %s %v", handshakeCrossedAfter, due, ok)
	}
	clock = clock.Add(handshakeCrossedAfter)
	if err := d.retryHandshakes(); err != nil || d.Writes() != w+1 {
		t.Fatalf("a crossed first handshake was not re-initiated %s after it was heard from (%v)", handshakeCrossedAfter, err)
	}
	if due, ok := d.handshakeCheckDue(); !ok || due != handshakeCrossedAfter {
		t.Fatalf("after a re-creation the next crossing check is due in %s, got %s %v", handshakeCrossedAfter, due, ok)
	}

	// Silent peer: nothing at the crossing check, the regular check later.
	clock = time.Unix(1000, 0)
	d2, _, _ := handshakeDevice(t, low, high, &clock)
	clock = clock.Add(handshakeCrossedAfter)
	w = d2.Writes()
	if err := d2.retryHandshakes(); err != nil || d2.Writes() != w {
		t.Fatalf("re-created a peer it heard nothing from at the crossing check (%v)", err)
	}
	if due, ok := d2.handshakeCheckDue(); !ok || due != handshakeRetryAfter-handshakeCrossedAfter {
		t.Fatalf("want the regular check due in %s, got %s %v", handshakeRetryAfter-handshakeCrossedAfter, due, ok)
	}

	// Higher key: its crossing check comes later than the lower key's.
	clock = time.Unix(1000, 0)
	d3, fc3, _ := handshakeDevice(t, high, low, &clock)
	fc3.SetReceived("hs0", low.PublicKey(), 148)
	clock = clock.Add(handshakeCrossedAfter)
	w = d3.Writes()
	if err := d3.retryHandshakes(); err != nil || d3.Writes() != w {
		t.Fatal("the higher key's side re-created the peer as early as the lower's")
	}
	clock = clock.Add(handshakeCrossedAfterHigh - handshakeCrossedAfter)
	if err := d3.retryHandshakes(); err != nil || d3.Writes() != w {
		t.Fatal("the higher key's side re-created the peer as soon as it was heard from")
	}
	clock = clock.Add(handshakeCrossedAfterHigh)
	if err := d3.retryHandshakes(); err != nil || d3.Writes() != w+1 {
		t.Fatal("the higher key's side did not re-create a crossed peer a crossing delay after it heard from it")
	}

	// An initiation this side answered just before the check: the session
	// completes when the initiator's first data arrives, within the delay,
	// and the peer is never re-created (it was, and the initiator then used
	// a session this side had dropped: 15 s without traffic).
	clock = time.Unix(1000, 0)
	d4, fc4, _ := handshakeDevice(t, low, high, &clock)
	clock = clock.Add(handshakeCrossedAfter)
	fc4.SetReceived("hs0", high.PublicKey(), 148) // its initiation, answered
	w = d4.Writes()
	if err := d4.retryHandshakes(); err != nil || d4.Writes() != w {
		t.Fatalf("re-created a peer whose initiation it had just answered (%v)", err)
	}
	clock = clock.Add(handshakeCrossedAfter / 2)
	fc4.SetHandshake("hs0", high.PublicKey(), clock) // the initiator's first data
	clock = clock.Add(handshakeCrossedAfter)
	if err := d4.retryHandshakes(); err != nil || d4.Writes() != w {
		t.Fatalf("re-created a peer that completed its handshake (%v)", err)
	}
	if due, ok := d4.handshakeCheckDue(); !ok || due != sessionCheckEvery {
		t.Fatalf("after a handshake only the session check may be due (in %s), got %s %v", sessionCheckEvery, due, ok)
	}
}

// slowReads is a Client whose every read of the device takes cost on the
// test's clock.
type slowReads struct {
	*FakeClient
	clock *time.Time
	cost  time.Duration
	reads int
}

func (c *slowReads) Device(name string) (*wgtypes.Device, error) {
	c.reads++
	*c.clock = c.clock.Add(c.cost)
	return c.FakeClient.Device(name)
}

// TestHandshakeChecksSpacedByReadCost: the first-handshake checks read the
// whole device, so after a read that took c the next check waits until
// handshakeReadShare × c after it (at most handshakeReadGapMax), even when
// a peer added meanwhile would have its crossing check due sooner; a read
// that costs nothing changes no delay.
func TestHandshakeChecksSpacedByReadCost(t *testing.T) {
	for _, tc := range []struct {
		cost time.Duration
		gap  time.Duration // wanted wait after the read, 0: the peer's own delay
	}{
		{cost: 0},
		{cost: 20 * time.Millisecond, gap: handshakeReadShare * 20 * time.Millisecond},
		{cost: 100 * time.Millisecond, gap: handshakeReadGapMax},
	} {
		t.Run(tc.cost.String(), func(t *testing.T) {
			low, high := keyPair(t)
			clock := time.Unix(1000, 0)
			d, fc, cfg := handshakeDevice(t, low, high, &clock)
			c := &slowReads{FakeClient: fc, clock: &clock, cost: tc.cost}
			d.client = c
			due, ok := d.handshakeCheckDue()
			if !ok || due != handshakeCrossedAfter {
				t.Fatalf("before any read: want the crossing check due in %s, got %s %v", handshakeCrossedAfter, due, ok)
			}
			clock = clock.Add(due)
			if err := d.retryHandshakes(); err != nil || c.reads != 1 {
				t.Fatalf("the check must read the device once: %d reads (%v)", c.reads, err)
			}
			// A peer joins right after the read: its crossing check is
			// due after its own delay, or after the read's gap if later.
			third, _ := wgtypes.GeneratePrivateKey()
			own := handshakeCrossedAfter
			if compareKeys(low.PublicKey(), third.PublicKey()) > 0 {
				own = handshakeCrossedAfterHigh
			}
			cfg.Peers = append(cfg.Peers, Peer{
				PublicKey:  third.PublicKey(),
				Endpoint:   net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.51.100.3:51820")),
				AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.42.3.0/24")},
			})
			c.cost = 0 // Set reads the device too: keep the clock where the check left it
			if err := d.Set(cfg); err != nil {
				t.Fatal(err)
			}
			due, ok = d.handshakeCheckDue()
			if want := max(own, tc.gap); !ok || due != want {
				t.Fatalf("read cost %s: want the next check due in %s (its own delay %s, the read's gap %s), got %s %v", tc.cost, want, own, tc.gap, due, ok)
			}
		})
	}
}
