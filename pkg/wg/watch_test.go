package wg

import (
	"context"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// WatchLink against the real kernel, in a fresh namespace: creating,
// deleting, re-creating and downing the interface each call changed;
// another interface does not.
func TestWatchLinkRealKernel(t *testing.T) {
	requireRoot(t)
	ns := newNSHandle(t)
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan struct{}, 100)
	done := make(chan error, 1)
	go func() {
		done <- watchLink(ctx, testLogger(t), &ns, "watched0", func() { calls <- struct{}{} })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watchLink: %v", err)
		}
	})
	// The subscription starts asynchronously: create links until the first
	// event is seen.
	expect := func(what string) {
		t.Helper()
		select {
		case <-calls:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: changed not called", what)
		}
		// Let follow-up notifications of the same change arrive, then drop
		// them (e.g. a new link is reported more than once).
		time.Sleep(100 * time.Millisecond)
		for len(calls) > 0 {
			<-calls
		}
	}
	none := func(what string) {
		t.Helper()
		select {
		case <-calls:
			t.Fatalf("%s: changed called", what)
		case <-time.After(300 * time.Millisecond):
		}
	}
	// A veth pair (watched0/watched0p): the host has no dummy module, and a
	// bridge needs the bridge module, which a kernel that cannot autoload
	// modules (a guest's initramfs that chroots without a modprobe helper)
	// only has if loaded by hand: LinkAdd then fails with "operation not
	// supported", as it did on Debian's 6.1 in qemu. veth is what every
	// namespace test here needs anyway.
	newLink := func(name string) *netlink.Veth {
		return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	}

	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := h.LinkAdd(newLink("watched0")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-calls:
		case <-time.After(200 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no call for a created interface")
			}
			if err := h.LinkDel(newLink("watched0")); err != nil {
				t.Fatal(err)
			}
			for len(calls) > 0 {
				<-calls
			}
			continue
		}
		break
	}
	time.Sleep(100 * time.Millisecond)
	for len(calls) > 0 {
		<-calls
	}

	l, err := h.LinkByName("watched0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	none("set up")
	if err := h.LinkSetMTU(l, 1400); err != nil {
		t.Fatal(err)
	}
	none("MTU changed")
	if err := h.LinkAdd(newLink("other0")); err != nil {
		t.Fatal(err)
	}
	none("another interface created")
	if err := h.LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
	expect("set down")
	if err := h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	expect("deleted")
	if err := h.LinkAdd(newLink("watched0")); err != nil {
		t.Fatal(err)
	}
	expect("created again")
}
