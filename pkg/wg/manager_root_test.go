package wg

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A Manager on a real in-process device in a fresh namespace: Run puts the
// interface back with its configuration when it is downed or deleted, from
// its own goroutine (outside the namespace, which the Manager remembers),
// and asks for a reconcile.
func TestRootManagerPutsInterfaceBack(t *testing.T) {
	requireRoot(t)
	ns := lockedNewNS(t)
	name := uniqueName(t)
	m, err := NewManager(context.Background(), Options{Name: name, Mode: ModeUserspace, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	cfg := rootConfig(t)
	if err := m.Set(cfg); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	up := func() bool {
		l, err := h.LinkByName(name)
		return err == nil && l.Attrs().Flags&net.FlagUp != 0
	}

	var changed atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func() { changed.Add(1) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	// The subscription starts asynchronously: take the link down (from up:
	// downing a down link is no event) until Run answers by setting it up
	// again.
	deadline := time.Now().Add(10 * time.Second)
	for changed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a downed interface was never set up again")
		}
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetDown(l); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	eventually(t, "the interface up again", up)

	// Deleted: a new interface, configured as last desired, without a Set.
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	oldIndex := l.Attrs().Index
	calls := changed.Load()
	if err := h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the interface put back", func() bool {
		l, err := h.LinkByName(name)
		return err == nil && l.Attrs().Index != oldIndex && l.Attrs().Flags&net.FlagUp != 0 && changed.Load() > calls
	})
	eventually(t, "its configuration put back", func() bool {
		dev := wgDevice(t, name)
		return dev.PublicKey == cfg.PrivateKey.PublicKey() && dev.ListenPort == 51820 && len(dev.Peers) == len(cfg.Peers)
	})
	if k := m.Kind(); k != KindUserspaceInProcess {
		t.Fatalf("kind %q after the reopen", k)
	}
}
