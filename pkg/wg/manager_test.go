package wg

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// fakeWorld is an interface that can disappear: open (re)creates it in the
// fakes, linkChanged plays a link notification to Run.
type fakeWorld struct {
	fc          *FakeClient
	links       *FakeLinks
	opens       atomic.Int32
	linkChanged chan struct{}
}

func newFakeWorld() *fakeWorld {
	w := &fakeWorld{fc: NewFakeClient(), links: NewFakeLinks(), linkChanged: make(chan struct{})}
	w.create()
	return w
}

func (w *fakeWorld) create() {
	w.fc.AddDevice("mgr0")
	w.links.AddLink("mgr0", 7, 1420)
}

// remove deletes the interface, as `ip link del` does.
func (w *fakeWorld) remove() {
	w.fc.RemoveDevice("mgr0")
	w.links.RemoveLink("mgr0")
}

func (w *fakeWorld) manager(t *testing.T) *Manager {
	t.Helper()
	opts := Options{Name: "mgr0", Logger: testLogger(t)}
	open := func(context.Context, Options) (*Device, error) {
		w.opens.Add(1)
		w.create()
		return NewWithClient("mgr0", w.fc, w.links, 1420, nil), nil
	}
	watch := func(ctx context.Context, changed func()) error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-w.linkChanged:
				changed()
			}
		}
	}
	return NewManagerWith(NewWithClient("mgr0", w.fc, w.links, 1420, nil), opts, open, watch)
}

// peers returns the public keys the fake device holds.
func (w *fakeWorld) peers(t *testing.T) []wgtypes.Key {
	t.Helper()
	d, err := w.fc.Device("mgr0")
	if err != nil {
		return nil
	}
	var out []wgtypes.Key
	for _, p := range d.Peers {
		out = append(out, p.PublicKey)
	}
	return out
}

// runManager runs m.Run until the test ends; changed counts its calls.
func runManager(t *testing.T, m *Manager) (changed *atomic.Int32) {
	t.Helper()
	changed = &atomic.Int32{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func() { changed.Add(1) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return changed
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func managerConfig(t *testing.T) Config {
	return Config{
		PrivateKey: privKey(t),
		ListenPort: 51820,
		Addresses:  pfx("10.77.0.1/24"),
		Peers: []Peer{{
			PublicKey:  privKey(t).PublicKey(),
			Endpoint:   net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.51.100.2:51820")),
			AllowedIPs: pfx("10.77.0.2/32"),
		}},
	}
}

// Set opens the interface again when it has disappeared, and only then: a
// configuration error on an existing interface is returned as it is. The
// write count does not go back when the Device is replaced.
func TestManagerSetReopens(t *testing.T) {
	w := newFakeWorld()
	m := w.manager(t)
	defer m.Close()
	cfg := managerConfig(t)
	if err := m.Set(cfg); err != nil {
		t.Fatal(err)
	}
	if got := w.peers(t); len(got) != 1 || got[0] != cfg.Peers[0].PublicKey {
		t.Fatalf("peers %v after Set", got)
	}
	before := m.Writes()

	w.fc.Fail = func(string, wgtypes.Config) error { return errors.New("refused") }
	cfg2 := cfg
	cfg2.ListenPort = 51821
	if err := m.Set(cfg2); err == nil {
		t.Fatal("a failing ConfigureDevice on an existing interface must fail Set")
	}
	if n := w.opens.Load(); n != 0 {
		t.Fatalf("reopened %d times for a configuration error", n)
	}
	w.fc.Fail = nil

	w.remove()
	if err := m.Set(cfg); err != nil {
		t.Fatalf("Set after the interface disappeared: %v", err)
	}
	if n := w.opens.Load(); n != 1 {
		t.Fatalf("%d reopens, want 1", n)
	}
	if got := w.peers(t); len(got) != 1 || got[0] != cfg.Peers[0].PublicKey {
		t.Fatalf("peers %v on the reopened interface", got)
	}
	if m.Writes() <= before {
		t.Fatalf("writes went from %d to %d across the reopen", before, m.Writes())
	}
	w0 := m.Writes()
	if err := m.Set(cfg); err != nil || m.Writes() != w0 {
		t.Fatalf("an unchanged Set wrote (%d → %d, %v)", w0, m.Writes(), err)
	}
}

// Run puts a deleted interface back with the last desired config on its
// own, without a Set, and asks for a reconcile (its routes went with it).
// Before the first Set and after Close it only asks.
func TestManagerRunRepairs(t *testing.T) {
	w := newFakeWorld()
	m := w.manager(t)
	changed := runManager(t, m)

	w.linkChanged <- struct{}{}
	eventually(t, "changed called", func() bool { return changed.Load() == 1 })
	if n := w.opens.Load(); n != 0 || m.Writes() != 0 {
		t.Fatalf("before the first Set: %d reopens, %d writes", n, m.Writes())
	}

	cfg := managerConfig(t)
	if err := m.Set(cfg); err != nil {
		t.Fatal(err)
	}
	w.remove()
	w.linkChanged <- struct{}{}
	eventually(t, "the interface is put back and changed called", func() bool { return changed.Load() == 2 })
	if n := w.opens.Load(); n != 1 {
		t.Fatalf("%d reopens, want 1", n)
	}
	if got := w.peers(t); len(got) != 1 || got[0] != cfg.Peers[0].PublicKey {
		t.Fatalf("peers %v on the interface Run put back", got)
	}
	st, err := w.links.Link("mgr0")
	if err != nil || !st.Up || len(st.Addrs) != 1 {
		t.Fatalf("link put back as %+v (%v), want up with its address", st, err)
	}

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	w.remove()
	w.linkChanged <- struct{}{}
	eventually(t, "changed called after Close", func() bool { return changed.Load() == 3 })
	if n := w.opens.Load(); n != 1 {
		t.Fatalf("reopened after Close (%d reopens)", n)
	}
}

// The first handshake of a peer added with an endpoint is retried by Run
// when due (TestHandshakeRetryStaggered has the policy): nobody but the
// worker writes to the device between Sets.
func TestManagerRunRetriesHandshakes(t *testing.T) {
	w := newFakeWorld()
	m := w.manager(t)
	defer m.Close()
	cfg := managerConfig(t)
	own, peer := keyPair(t)
	cfg.PrivateKey, cfg.Peers[0].PublicKey = own, peer.PublicKey() // the lower key retries first
	if err := m.Set(cfg); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.handshakeCheckDue(); !ok {
		t.Fatal("no handshake check due after adding a peer with an endpoint")
	}
	written := m.Writes()
	start := time.Now()
	runManager(t, m)
	eventually(t, "the peer re-created by Run", func() bool { return m.Writes() == written+1 })
	if d := time.Since(start); d < handshakeRetryAfter-handshakeCoalesce {
		t.Fatalf("retried after %s, before it was due (%s)", d, handshakeRetryAfter)
	}
	if got := w.peers(t); len(got) != 1 || got[0] != peer.PublicKey() {
		t.Fatalf("peers %v after the retry", got)
	}
}
