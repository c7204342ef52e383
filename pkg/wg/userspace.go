package wg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
)

// userspace is a wireguard-go device running in this process: a TUN device,
// the device itself and its UAPI listener.
type userspace struct {
	name   string
	ns     netns.NsHandle // namespace of the TUN device and of every socket
	log    *slog.Logger
	dev    *device.Device
	uapi   net.Listener
	done   chan struct{} // closed when the UAPI listener stops
	uapiEr error

	closeOnce sync.Once
}

// inNS runs fn on a fresh OS thread switched into ns and waits for it. The
// thread is never unlocked, so Go discards it when fn returns.
func inNS(ns netns.NsHandle, fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := setNS(ns); err != nil {
			errc <- fmt.Errorf("entering network namespace: %w", err)
			return
		}
		fn()
		errc <- nil
	}()
	return <-errc
}

// goInNS is inNS without waiting.
func goInNS(ns netns.NsHandle, log *slog.Logger, fn func()) {
	go func() {
		runtime.LockOSThread()
		if err := setNS(ns); err != nil {
			log.Error("entering network namespace", "err", err)
			return
		}
		fn()
	}()
}

// pumpedTUN hands the device only MTU events: up/down events are acted on
// by a goroutine pinned to the device's namespace, because bringing the
// device up opens its UDP and route sockets in the calling thread's
// namespace, and wireguard-go would otherwise do that on any thread.
//
// For the same reason it caches the MTU: NativeTun.MTU asks the kernel
// through a socket opened in the calling thread's namespace, so the pump
// reads it on its pinned thread and the device gets the cached value.
//
// It also reports a BatchSize of at most inProcessBatchSize, once the link's
// gso_max_segs is capped to the same number: with TSO on, the kernel hands
// the TUN device TCP segments of up to 64 KB that wireguard-go splits into
// one buffer per MSS-sized packet (about 48 at MTU 1420), and drops what
// does not fit in a batch (tun.ErrTooManySegments); gso_max_segs makes the
// kernel build no larger ones (segmenting forwarded ones itself).
type pumpedTUN struct {
	tun.Device
	events chan tun.Event
	mtu    atomic.Int64
	batch  int
	lazy   *lazyPeers // nil: every peer is in the device
}

// Read reads a batch from the TUN device and, with lazy peers, puts the
// peers it is for into the device before the device routes it.
func (t *pumpedTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := t.Device.Read(bufs, sizes, offset)
	if t.lazy != nil && n > 0 {
		t.lazy.outbound(bufs[:n], sizes[:n], offset)
	}
	return n, err
}

func (t *pumpedTUN) BatchSize() int { return t.batch }

func (t *pumpedTUN) Events() <-chan tun.Event { return t.events }

// Write writes bufs to the TUN device and then detaches them (see detach):
// the device's per-peer receiver passes the same slice array on every call.
func (t *pumpedTUN) Write(bufs [][]byte, offset int) (int, error) {
	n, err := t.Device.Write(bufs, offset)
	detach(bufs)
	return n, err
}

func (t *pumpedTUN) MTU() (int, error) { return int(t.mtu.Load()), nil }

func (t *pumpedTUN) pump(dev *device.Device, log *slog.Logger) {
	defer close(t.events)
	for ev := range t.Device.Events() {
		if ev&tun.EventMTUUpdate != 0 {
			if mtu, err := t.Device.MTU(); err == nil {
				t.mtu.Store(int64(mtu))
				t.events <- tun.EventMTUUpdate
			}
		}
		if ev&tun.EventUp != 0 {
			if err := dev.Up(); err != nil {
				log.Error("bringing WireGuard device up", "err", err)
			}
		}
		if ev&tun.EventDown != 0 {
			if err := dev.Down(); err != nil {
				log.Error("bringing WireGuard device down", "err", err)
			}
		}
	}
}

func deviceLogger(log *slog.Logger) *device.Logger {
	ctx := context.Background()
	return &device.Logger{
		Verbosef: func(format string, args ...any) {
			if log.Enabled(ctx, slog.LevelDebug) {
				log.Debug(fmt.Sprintf(format, args...))
			}
		},
		Errorf: func(format string, args ...any) {
			log.Error(fmt.Sprintf(format, args...))
		},
	}
}

// startUserspace creates the TUN device and runs wireguard-go on it with a
// UAPI socket. It must be called on a thread in the target namespace ns
// (the caller's, captured by the caller). When up is true the link is set
// up and the device started before returning. lazy, if not nil, sees
// every packet read from the TUN device and received on the UDP socket
// before the device does (see lazyPeers).
func startUserspace(ns netns.NsHandle, name string, mtu int, up bool, lazy *lazyPeers, log *slog.Logger) (_ *userspace, err error) {
	if mtu <= 0 {
		mtu = defaultMTU
	}
	nsDup, err := dupNS(ns)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			nsDup.Close()
		}
	}()
	pt, err := createTUN(nsDup, name, mtu)
	if err != nil {
		return nil, err
	}
	pt.lazy = lazy
	uapiFile, err := ipc.UAPIOpen(name)
	if err != nil {
		pt.Close()
		hint := ""
		if c, derr := net.Dial("unix", socketPath(name)); derr == nil {
			c.Close()
			hint = " (another process serves a WireGuard device of that name, in another network namespace: /var/run/wireguard is shared unless each namespace mounts its own)"
		}
		return nil, fmt.Errorf("opening UAPI socket %s%s: %w", socketPath(name), hint, err)
	}
	dlog := log.With("component", "wireguard-go", "interface", name)
	bind := &batchBind{Bind: conn.NewDefaultBind(), batch: inProcessBatchSize, stride: receiveStride(mtu), lazy: lazy}
	dev := device.NewDevice(pt, bind, deviceLogger(dlog))
	goInNS(nsDup, log, func() { pt.pump(dev, dlog) })

	uapi, err := ipc.UAPIListen(name, uapiFile)
	uapiFile.Close()
	if err != nil {
		dev.Close()
		os.Remove(socketPath(name))
		return nil, fmt.Errorf("listening on UAPI socket %s: %w", socketPath(name), err)
	}
	u := &userspace{name: name, ns: nsDup, log: log, dev: dev, uapi: uapi, done: make(chan struct{})}
	go u.serve()

	if up {
		if err := u.up(); err != nil {
			u.close()
			return nil, err
		}
	}
	return u, nil
}

// createTUN creates the TUN device name in ns, with its batch size capped
// to inProcessBatchSize when the kernel takes the matching gso_max_segs.
func createTUN(ns netns.NsHandle, name string, mtu int) (*pumpedTUN, error) {
	var tdev tun.Device
	var tunErr error
	pt := &pumpedTUN{events: make(chan tun.Event, 8)}
	pt.mtu.Store(int64(mtu))
	if err := inNS(ns, func() {
		if tdev, tunErr = tun.CreateTUN(name, mtu); tunErr == nil {
			if m, err := tdev.MTU(); err == nil {
				pt.mtu.Store(int64(m))
			}
			pt.batch = tdev.BatchSize()
			if pt.batch > inProcessBatchSize {
				if l, err := netlink.LinkByName(name); err == nil && netlink.LinkSetGSOMaxSegs(l, inProcessBatchSize) == nil {
					pt.batch = inProcessBatchSize
				}
			}
		}
	}); err != nil {
		return nil, err
	}
	if tunErr != nil {
		return nil, fmt.Errorf("creating TUN device %s: %w", name, tunErr)
	}
	if real, err := tdev.Name(); err == nil && real != name {
		tdev.Close()
		return nil, fmt.Errorf("creating TUN device %s: kernel named it %s", name, real)
	}
	pt.Device = tdev
	return pt, nil
}

// up sets the link up and brings the device up in its namespace, so that a
// configuration written next finds it running.
func (u *userspace) up() error {
	h, err := netlink.NewHandleAt(unlessCurrentNS(u.ns), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening netlink in the device's namespace: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(u.name)
	if err != nil {
		return fmt.Errorf("looking up link %s: %w", u.name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting link %s up: %w", u.name, err)
	}
	return u.devUp()
}

// devUp brings the wireguard-go device up from a thread in its namespace.
func (u *userspace) devUp() error {
	var upErr error
	if err := inNS(u.ns, func() { upErr = u.dev.Up() }); err != nil {
		return err
	}
	if upErr != nil {
		return fmt.Errorf("starting WireGuard device %s: %w", u.name, upErr)
	}
	return nil
}

func (u *userspace) serve() {
	defer close(u.done)
	for {
		c, err := u.uapi.Accept()
		if err != nil {
			u.uapiEr = err
			return
		}
		// A "set" may rebind the UDP socket (new listen port): handle it
		// on a thread in the device's namespace.
		goInNS(u.ns, u.log, func() { u.dev.IpcHandle(c) })
	}
}

// close stops the device; the TUN link disappears with it and the UAPI
// socket file is removed.
func (u *userspace) close() {
	u.closeOnce.Do(func() {
		u.uapi.Close()
		u.dev.Close()
		<-u.done
		u.ns.Close()
	})
}

// socketGone reports whether the UAPI socket file was removed, which is
// how Device.Delete (and wg-quick) tell a userspace device to stop.
func socketGone(name string) bool {
	_, err := os.Stat(socketPath(name))
	return errors.Is(err, os.ErrNotExist)
}

func socketPath(name string) string { return filepath.Join(uapiSocketDir, name+".sock") }

func dupNS(ns netns.NsHandle) (netns.NsHandle, error) {
	fd, err := dupFD(int(ns))
	if err != nil {
		return netns.None(), fmt.Errorf("duplicating network namespace handle: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// RunDevice runs a userspace WireGuard device named name (TUN device plus
// UAPI socket, no key, no peers, link up) until ctx is done, the device
// fails, or its UAPI socket is deleted. It serves `meshd device --interface
// NAME`: the daemon adopts the device over UAPI and configures it, and can
// restart without taking the interface down. Call it on a thread in the
// target network namespace.
func RunDevice(ctx context.Context, log *slog.Logger, name string, mtu int) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := validName(name); err != nil {
		return err
	}
	ns, err := netns.Get()
	if err != nil {
		return fmt.Errorf("getting the current network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(unlessCurrentNS(ns), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	_, lerr := h.LinkByName(name)
	h.Close()
	if lerr == nil {
		return fmt.Errorf("running WireGuard device %s: an interface with that name already exists", name)
	}
	u, err := startUserspace(ns, name, mtu, true, nil, log)
	if err != nil {
		return fmt.Errorf("running WireGuard device %s: %w", name, err)
	}
	log.Info("userspace WireGuard device running", "interface", name, "socket", socketPath(name))
	defer u.close()
	select {
	case <-ctx.Done():
		log.Info("stopping userspace WireGuard device", "interface", name)
		return nil
	case <-u.dev.Wait():
		if socketGone(name) {
			log.Info("interface deleted; stopping userspace WireGuard device", "interface", name)
			return nil
		}
		return fmt.Errorf("WireGuard device %s stopped (interface gone?)", name)
	case <-u.done:
		if errors.Is(u.uapiEr, os.ErrNotExist) || socketGone(name) {
			log.Info("UAPI socket removed; stopping userspace WireGuard device", "interface", name)
			return nil
		}
		return fmt.Errorf("WireGuard device %s: UAPI listener stopped: %w", name, u.uapiEr)
	}
}

func validName(name string) error {
	if name == "" || len(name) >= 16 || name == "." || name == ".." {
		return fmt.Errorf("invalid interface name %q", name)
	}
	for _, r := range name {
		if r == '/' || r == ':' || r <= ' ' || r > '~' {
			return fmt.Errorf("invalid interface name %q", name)
		}
	}
	return nil
}
