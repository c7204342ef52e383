package wg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Client is the seam over wgctrl: reading and configuring a device by name,
// with wgctrl.Client's semantics. FakeClient implements it in memory.
type Client interface {
	Device(name string) (*wgtypes.Device, error)
	ConfigureDevice(name string, cfg wgtypes.Config) error
}

// Device is an open WireGuard interface.
type Device struct {
	name  string
	kind  string
	mtu   int
	log   *slog.Logger
	index int

	client Client
	links  LinkOps

	closeClient func() error
	handle      *netlink.Handle
	inproc      *userspace
	createdLink bool
	lazyPeers   bool       // Options.LazyPeers
	lazyAbove   int        // Options.LazyPeersAbove
	lazy        *lazyPeers // an in-process device's lazy-peer layer; nil if none

	mu     sync.Mutex
	last   map[wgtypes.Key]netip.AddrPort // endpoint last written per peer
	writes atomic.Uint64
	closed bool
	// pending are peers created with an endpoint whose first handshake has
	// not been seen yet (see handshakeRetries).
	pending map[wgtypes.Key]pendingHandshake
	// checkRead is when retryHandshakes last finished reading the device,
	// checkCost how long that read took (see handshakeReadShare).
	checkRead time.Time
	checkCost time.Duration
	now       func() time.Time
}

// pendingHandshake is a peer whose first handshake is awaited.
type pendingHandshake struct {
	since   time.Time // created or last re-created
	retries int
	after   time.Duration // retry delay: shorter for the lower public key
	crossed time.Duration // crossing check delay (shorter for the lower key); 0 once looked at
	checked bool          // looked at after the delay: no retry needed
	// heard is when the crossing check first found the peer heard from
	// (zero: not yet); it re-creates the peer only a crossing delay later.
	heard time.Time
	// The session check, once the first handshake is seen (see
	// sessionSilentAfter): when it was first seen (zero: not yet), the
	// byte counters then, the last look, and when this side was first
	// found to have sent more than a keepalive since without hearing back.
	session, looked, sent time.Time
	rx0, tx0              int64
}

// Handshake retry: when two nodes add each other at the same moment, both
// initiate, each answers the other and discards the answer to its own
// initiation, and WireGuard waits 5 s (REKEY_TIMEOUT) before trying again —
// the cold-start outliers Kilo shows. So if a peer created with an endpoint
// has no handshake handshakeRetryAfter later, the side with the lower public
// key removes and re-adds it (once, or up to handshakeMaxRetries times while
// the peer is heard from, rx > 0, so unreachable peers cost little), which starts a fresh initiation the other side,
// still within its 5 s, answers. The higher key's side does the same only
// later (handshakeRetryAfterHigh), for the rarer crossing that leaves the
// lower side believing in a session the other side dropped; the staggered
// delays keep the two retries from crossing again.
//
// A crossing shows early: each side has received the other's initiation
// (rx > 0) and still has no handshake, where a normal first handshake is
// complete on the initiator when its first byte arrives and on the
// responder one round trip later. So a crossing check runs sooner
// (handshakeCrossedAfter on the lower key's side, handshakeCrossedAfterHigh
// on the higher's, for when the lower side awaits nothing, e.g. it just
// changed its key) and re-creates the peer only if it heard from it: a key
// rotation or two nodes starting together then stall for a fifth of a
// second (see below), not a second. A link whose round trip exceeds the
// delay costs at most one extra initiation: the re-created side's fresh
// initiation is answered by the side that completed already.
//
// Heard from is not yet crossed: an initiation this side just answered
// completes its session one round trip later, when the initiator's first
// data arrives, and re-creating the peer meanwhile drops that session while
// the initiator starts using it (a 15 s stall until WireGuard's own retry,
// seen at cold start). So the crossing check re-creates the peer only if it
// still has no handshake a crossing delay after the check first heard from
// it.
//
// A first handshake can also complete on both sides and still carry no
// traffic one way: wireguard-go's handshake workers run in parallel, and
// when a crossed initiation and the answer to this side's own initiation
// are processed at once, the answer's session can be installed under a
// receiver index the initiation's processing has just released. The peer
// accepts what this side sends, but nothing it sends back is delivered:
// both sides report a handshake, and WireGuard starts a new one only when
// it has not heard back for 15 s (seen at cold start: 3 of 280 runs on a
// loaded 2-core machine). So after a first handshake the check keeps
// looking, every sessionCheckEvery for sessionWatchFor: once the peer is
// heard from again (received bytes grow) it is done; if this side sent more
// than keepalives and still hears nothing sessionSilentAfter later, it
// re-creates the peer (within handshakeMaxRetries), a fresh handshake the
// peer answers. A flow that is one-way at that moment costs one handshake
// more.
const (
	sessionCheckEvery  = 250 * time.Millisecond
	sessionSilentAfter = 500 * time.Millisecond
	sessionWatchFor    = 5 * time.Second
	// keepaliveBytes is the size of a WireGuard keepalive (a transport
	// header and an authentication tag), which is no sign of data sent
	// (see keepaliveAllowance).
	keepaliveBytes = 32
)

const (
	handshakeRetryAfter       = time.Second
	handshakeRetryAfterHigh   = 2500 * time.Millisecond
	handshakeCrossedAfter     = 100 * time.Millisecond
	handshakeCrossedAfterHigh = 250 * time.Millisecond
	handshakeCrossedCoalesce  = 20 * time.Millisecond
	handshakeMaxRetries       = 3
	handshakePendingFor       = 30 * time.Second
	// handshakeCoalesce: checks due within this window are done together, so
	// peers added by successive reconciles do not each cause a reconcile.
	handshakeCoalesce = 500 * time.Millisecond
	// handshakeReadShare bounds the time the checks spend reading the
	// device: after a read that took c, the next check waits until
	// handshakeReadShare × c after it (at most handshakeReadGapMax), so
	// reads take at most 1/handshakeReadShare of the time. A read is every
	// peer as text both ways (UAPI): well under a millisecond for tens of
	// peers, where nothing changes, but 20-40 ms for 1,000 peers of an
	// in-process device, where a burst of joins otherwise has every new
	// peer's crossing and session checks read all of them about 4 times a
	// second (a quarter of a daemon's CPU in the burst, docs/scale.md).
	handshakeReadShare  = 20
	handshakeReadGapMax = handshakeCoalesce
)

// NewWithClient returns a Device over the given seams, for tests of code
// that drives a Device (Kind reports "fake"). Close and Delete only mark it
// closed.
func NewWithClient(name string, c Client, links LinkOps, mtu int, log *slog.Logger) *Device {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Device{name: name, kind: KindFake, mtu: mtu, log: log, client: c, links: links, last: map[wgtypes.Key]netip.AddrPort{}, now: time.Now}
	if st, err := links.Link(name); err == nil {
		d.index = st.Index
	}
	return d
}

// Open opens the WireGuard interface opts.Name in the calling thread's
// network namespace (lock the OS thread if the caller switched namespaces):
// it adopts an existing kernel link or a userspace device whose UAPI socket
// answers, else creates one as opts.Mode allows. It only creates the
// interface; Set configures it. ctx bounds Open itself, not the device's
// life: Close stops an in-process device.
func Open(ctx context.Context, opts Options) (_ *Device, err error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mode := opts.Mode
	if mode == "" {
		mode = ModeAuto
	}
	if _, err := ParseMode(string(mode)); err != nil {
		return nil, err
	}
	if err := validName(opts.Name); err != nil {
		return nil, err
	}
	name := opts.Name
	log = log.With("interface", name)

	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("getting the current network namespace: %w", err)
	}
	defer ns.Close()
	// Route netlink only: a handle with the default families also opens an
	// XFRM socket, which fails with "protocol not supported" on a kernel
	// whose xfrm_user module is not loaded (seen on Debian's 6.1 in a VM).
	h, err := netlink.NewHandleAt(unlessCurrentNS(ns), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	d := &Device{name: name, mtu: opts.MTU, log: log, handle: h, links: netlinkOps{h}, last: map[wgtypes.Key]netip.AddrPort{}, lazyPeers: opts.LazyPeers, lazyAbove: opts.LazyPeersAbove}
	defer func() {
		if err != nil {
			d.abandon()
		}
	}()
	if err := d.adoptOrCreate(ctx, ns, mode); err != nil {
		return nil, err
	}
	if err := d.connect(); err != nil {
		return nil, err
	}
	return d, nil
}

// abandon undoes a failed Open: it deletes a kernel link Open created (do
// not leave a half-opened link behind) and releases what Open acquired.
func (d *Device) abandon() {
	if d.kind == KindKernel && d.createdLink {
		if l, err := d.handle.LinkByName(d.name); err == nil {
			d.handle.LinkDel(l)
		}
	}
	d.release()
}

// adoptOrCreate adopts the existing interface if mode allows it, else
// creates one.
func (d *Device) adoptOrCreate(ctx context.Context, ns netns.NsHandle, mode Mode) error {
	link, err := d.handle.LinkByName(d.name)
	var notFound netlink.LinkNotFoundError
	switch {
	case err == nil:
		if d.kind, err = adoptKind(link, mode); err != nil {
			return err
		}
		d.log.Info("adopting existing WireGuard interface", "kind", d.kind)
		return nil
	case errors.As(err, &notFound):
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("opening WireGuard interface %s: %w", d.name, err)
		}
		return d.create(ns, mode)
	default:
		return fmt.Errorf("looking up interface %s: %w", d.name, err)
	}
}

// connect opens the wgctrl client and checks the device it sees. It runs
// after the link exists, so that a kernel module loaded by creating it is
// seen.
func (d *Device) connect() error {
	wc, err := wgctrl.New()
	if err != nil {
		return fmt.Errorf("opening wgctrl: %w", err)
	}
	d.client, d.closeClient = wc, wc.Close
	if d.lazy != nil {
		d.lazy.start(wc)
		d.client = d.lazy
	}
	wd, err := d.client.Device(d.name)
	if err != nil {
		return fmt.Errorf("reading WireGuard device %s (%s): %w", d.name, d.kind, err)
	}
	if (d.kind == KindKernel) != (wd.Type == wgtypes.LinuxKernel) {
		return fmt.Errorf("WireGuard device %s: wgctrl reports a %s device, expected %s", d.name, wd.Type, d.kind)
	}
	st, err := d.links.Link(d.name)
	if err != nil {
		return err
	}
	d.index = st.Index
	return nil
}

// adoptKind decides whether an existing link can be adopted in mode.
func adoptKind(link netlink.Link, mode Mode) (string, error) {
	name := link.Attrs().Name
	switch link.Type() {
	case "wireguard":
		if mode == ModeUserspace {
			return "", fmt.Errorf("interface %s is a kernel WireGuard link but mode is userspace; delete it or use mode auto", name)
		}
		return KindKernel, nil
	case "tuntap", "tun":
		if mode == ModeKernel {
			return "", fmt.Errorf("interface %s is a userspace (TUN) WireGuard device but mode is kernel; delete it or use mode auto", name)
		}
		c, err := net.DialTimeout("unix", socketPath(name), 2*time.Second)
		if err != nil {
			return "", fmt.Errorf("interface %s exists (TUN) but no WireGuard UAPI socket answers at %s: %w", name, socketPath(name), err)
		}
		c.Close()
		return KindUserspaceExternal, nil
	}
	return "", fmt.Errorf("interface %s exists with type %q, not WireGuard; refusing to touch it", name, link.Type())
}

// create makes a kernel link or an in-process userspace device.
func (d *Device) create(ns netns.NsHandle, mode Mode) error {
	if mode != ModeUserspace {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = d.name
		if d.mtu > 0 {
			attrs.MTU = d.mtu
		}
		err := d.handle.LinkAdd(&netlink.Wireguard{LinkAttrs: attrs})
		if err == nil {
			d.writes.Add(1)
			d.kind = KindKernel
			d.createdLink = true
			d.log.Info("created kernel WireGuard interface")
			return nil
		}
		if mode == ModeKernel {
			return fmt.Errorf("creating kernel WireGuard interface %s (is the wireguard module available?): %w", d.name, err)
		}
		d.log.Info("kernel WireGuard unavailable; using the userspace implementation in-process", "reason", err)
	}
	if d.lazyPeers {
		d.lazy = newLazyPeers(d.name, d.log, d.lazyAbove)
	}
	u, err := startUserspace(ns, d.name, d.mtu, true, d.lazy, d.log)
	if err != nil {
		return fmt.Errorf("creating userspace WireGuard interface %s: %w", d.name, err)
	}
	d.writes.Add(1)
	d.inproc = u
	d.kind = KindUserspaceInProcess
	d.log.Info("started in-process userspace WireGuard device", "socket", socketPath(d.name), "lazyPeers", d.lazy != nil, "lazyAbove", d.lazyAbove)
	return nil
}

// Name returns the interface name.
func (d *Device) Name() string { return d.name }

// LinkIndex returns the interface index found or created by Open.
func (d *Device) LinkIndex() int { return d.index }

// Kind returns KindKernel, KindUserspaceInProcess or KindUserspaceExternal.
func (d *Device) Kind() string { return d.kind }

// Writes returns how many ConfigureDevice and netlink write calls this
// Device made (creation included).
func (d *Device) Writes() uint64 { return d.writes.Load() }

// Set makes the interface match cfg, writing only what differs: MTU, up,
// addresses, then one ConfigureDevice with the changed device fields and
// peers. It goes on past failures and returns them joined. If the batched
// ConfigureDevice fails, the changes are retried one peer at a time so one
// bad peer does not hold the others back.
func (d *Device) Set(cfg Config) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("configuring %s: device closed", d.name)
	}
	var errs []error
	if err := d.setLink(cfg); err != nil {
		errs = append(errs, err)
	}
	if err := d.setWireGuard(cfg); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (d *Device) setLink(cfg Config) error {
	var errs []error
	st, err := d.links.Link(d.name)
	if err != nil {
		return err
	}
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = d.mtu
	}
	if mtu > 0 && st.MTU != mtu {
		d.writes.Add(1)
		if err := d.links.SetMTU(d.name, mtu); err != nil {
			errs = append(errs, fmt.Errorf("setting MTU of %s to %d: %w", d.name, mtu, err))
		}
	}
	if !st.Up {
		d.writes.Add(1)
		if err := d.links.SetUp(d.name); err != nil {
			errs = append(errs, fmt.Errorf("setting %s up: %w", d.name, err))
		} else if d.inproc != nil {
			// Start the device now rather than when the TUN event
			// arrives, so that peers configured next start at once.
			if err := d.inproc.devUp(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	want, err := normalizeAddrs(cfg.Addresses)
	if err != nil {
		errs = append(errs, err)
	}
	have, _ := normalizeAddrs(st.Addrs)
	for _, p := range want {
		if slices.Contains(have, p) {
			continue
		}
		// IPv6 knows an address by the address alone: while it is on the
		// link with another prefix length the kernel refuses the add
		// (EEXIST), so that entry goes first.
		var err error
		have, err = d.delOtherPrefixLen(p, want, have)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		d.writes.Add(1)
		if err := d.links.AddAddr(d.name, p); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, fmt.Errorf("adding address %s to %s: %w", p, d.name, err))
		}
	}
	for _, p := range have {
		if slices.Contains(want, p) || (p.Addr().Is6() && p.Addr().IsLinkLocalUnicast()) {
			continue
		}
		d.writes.Add(1)
		if err := d.links.DelAddr(d.name, p); err != nil {
			errs = append(errs, fmt.Errorf("removing address %s from %s: %w", p, d.name, err))
		}
	}
	return errors.Join(errs...)
}

// delOtherPrefixLen removes from the link the unwanted entries of IPv6
// address p's address with another prefix length, and returns have without
// them. IPv4 keeps one entry per address and prefix length, so p added
// beside them is no conflict, and they are removed after the add as any
// other unwanted address is.
func (d *Device) delOtherPrefixLen(p netip.Prefix, want, have []netip.Prefix) ([]netip.Prefix, error) {
	if !p.Addr().Is6() {
		return have, nil
	}
	out := have[:0:0]
	var errs []error
	for _, h := range have {
		if h.Addr() != p.Addr() || slices.Contains(want, h) {
			out = append(out, h)
			continue
		}
		d.writes.Add(1)
		if err := d.links.DelAddr(d.name, h); err != nil {
			errs = append(errs, fmt.Errorf("removing address %s from %s to add it as %s: %w", h, d.name, p, err))
			out = append(out, h)
		}
	}
	return out, errors.Join(errs...)
}

func (d *Device) setWireGuard(cfg Config) error {
	cur, err := d.client.Device(d.name)
	if err != nil {
		return fmt.Errorf("reading WireGuard device %s: %w", d.name, err)
	}
	dl, derr := computeDelta(cur, cfg, d.last)
	var errs []error
	if derr != nil {
		errs = append(errs, fmt.Errorf("configuring %s: %w", d.name, derr))
	}
	for k, ep := range dl.known {
		d.last[k] = ep
	}
	if dl.empty() {
		return errors.Join(errs...)
	}
	d.log.Debug("configuring WireGuard", "peers", dl.peerCount(), "privateKey", dl.cfg.PrivateKey != nil, "listenPort", dl.cfg.ListenPort != nil, "nudged", len(dl.nudged))
	d.writes.Add(1)
	err = d.client.ConfigureDevice(d.name, dl.cfg)
	if err == nil {
		d.applied(dl, dl.cfg.Peers)
		own := cur.PublicKey
		if dl.cfg.PrivateKey != nil {
			own = dl.cfg.PrivateKey.PublicKey()
		}
		d.awaitHandshakes(own, dl.nudged, nil)
		return errors.Join(errs...)
	}
	d.log.Warn("batched WireGuard configuration failed; retrying peer by peer", "err", err)
	// Retry: device fields, then each peer on its own.
	if dl.cfg.PrivateKey != nil || dl.cfg.ListenPort != nil {
		d.writes.Add(1)
		dev := wgtypes.Config{PrivateKey: dl.cfg.PrivateKey, ListenPort: dl.cfg.ListenPort}
		if err := d.client.ConfigureDevice(d.name, dev); err != nil {
			errs = append(errs, fmt.Errorf("configuring %s (private key, listen port): %w", d.name, err))
		}
	}
	for _, g := range groupPeers(dl.cfg.Peers) {
		d.writes.Add(1)
		if err := d.client.ConfigureDevice(d.name, wgtypes.Config{Peers: g}); err != nil {
			what := "configuring"
			if g[0].Remove {
				what = "removing"
			}
			errs = append(errs, fmt.Errorf("%s peer %s on %s: %w", what, g[0].PublicKey, d.name, err))
			continue
		}
		d.applied(dl, g)
	}
	return errors.Join(errs...)
}

// handshakeRetries returns the pending peers to re-create now (an empty map:
// none), forgetting those whose first session carries traffic back (or that
// were quiet through the session check), vanished or waited too long.
func (d *Device) handshakeRetries(cur *wgtypes.Device) map[wgtypes.Key]bool {
	if len(d.pending) == 0 {
		return nil
	}
	now := d.clock()
	peers := make(map[wgtypes.Key]*wgtypes.Peer, len(cur.Peers))
	for i := range cur.Peers {
		peers[cur.Peers[i].PublicKey] = &cur.Peers[i]
	}
	out := map[wgtypes.Key]bool{}
	for k, p := range d.pending {
		c, ok := peers[k]
		switch {
		case !ok, now.Sub(p.since) > handshakePendingFor:
			delete(d.pending, k)
		case !c.LastHandshakeTime.IsZero():
			if d.sessionSilent(k, p, c, now) {
				out[k] = true
			}
		case p.crossed > 0 && !p.checked && p.retries < handshakeMaxRetries &&
			!now.Add(handshakeCrossedCoalesce).Before(p.since.Add(p.crossed)) &&
			now.Add(handshakeCoalesce).Before(p.since.Add(p.after)):
			// Crossing check: heard from the peer but no handshake, for a
			// crossing delay since first heard.
			if c.ReceiveBytes > 0 {
				if p.heard.IsZero() {
					p.heard = now
					d.pending[k] = p
					continue
				}
				if now.Add(handshakeCrossedCoalesce).Before(p.heard.Add(p.crossed)) {
					continue
				}
				out[k] = true
				continue
			}
			p.crossed = 0
			d.pending[k] = p
		case p.checked || p.retries >= handshakeMaxRetries || now.Add(handshakeCoalesce).Before(p.since.Add(p.after)):
			// not due
		case c.ReceiveBytes > 0 || p.retries == 0:
			// Heard from (a crossed handshake) or not retried yet: retry.
			out[k] = true
		default:
			// Still nothing heard after a retry: unreachable or not
			// configured yet; WireGuard keeps retrying by itself.
			p.checked = true
			d.pending[k] = p
		}
	}
	return out
}

// sessionSilent is the session check of a pending peer c whose first
// handshake is done (see sessionSilentAfter): it reports whether to re-create
// the peer now, and updates or forgets its pending entry p.
func (d *Device) sessionSilent(k wgtypes.Key, p pendingHandshake, c *wgtypes.Peer, now time.Time) bool {
	switch {
	case p.retries >= handshakeMaxRetries:
		delete(d.pending, k)
		return false
	case p.session.IsZero():
		p.session, p.looked, p.rx0, p.tx0 = now, now, c.ReceiveBytes, c.TransmitBytes
	case c.ReceiveBytes > p.rx0, p.sent.IsZero() && now.Sub(p.session) >= sessionWatchFor:
		// Heard from since the handshake, or nothing sent to look at.
		delete(d.pending, k)
		return false
	case p.sent.IsZero():
		p.looked = now
		if c.TransmitBytes-p.tx0 > keepaliveAllowance(c.PersistentKeepaliveInterval, now.Sub(p.session)) {
			p.sent = now
		}
	case now.Add(handshakeCrossedCoalesce).Before(p.sent.Add(sessionSilentAfter)):
		p.looked = now
	default:
		d.log.Info("re-initiating a WireGuard session that carries nothing back: sent to the peer since its first handshake, heard nothing",
			"peer", k.String(), "since_handshake", now.Sub(c.LastHandshakeTime).Round(time.Millisecond), "sent_bytes", c.TransmitBytes-p.tx0)
		return true
	}
	d.pending[k] = p
	return false
}

// keepaliveAllowance is how many bytes a session check may see sent over
// elapsed without taking them for data: one keepalive, plus one per
// persistent keepalive interval begun.
func keepaliveAllowance(interval, elapsed time.Duration) int64 {
	n := int64(1)
	if interval > 0 {
		n += int64((elapsed + interval - 1) / interval)
	}
	return n * keepaliveBytes
}

// awaitHandshakes records the peers whose first handshake was just started.
func (d *Device) awaitHandshakes(own wgtypes.Key, nudged []wgtypes.Key, recreated map[wgtypes.Key]bool) {
	if d.pending == nil {
		d.pending = map[wgtypes.Key]pendingHandshake{}
	}
	now := d.clock()
	for _, k := range nudged {
		if d.lazy != nil && d.lazy.isIdle(k) {
			continue // no handshake until traffic (see lazyPeers)
		}
		p := pendingHandshake{since: now, after: handshakeRetryAfterHigh, crossed: handshakeCrossedAfterHigh}
		if compareKeys(own, k) < 0 {
			p.after, p.crossed = handshakeRetryAfter, handshakeCrossedAfter
		}
		if recreated[k] {
			p.retries = d.pending[k].retries + 1
			d.log.Debug("re-initiating a handshake that did not complete", "peer", k.String(), "retry", p.retries)
		}
		d.pending[k] = p
	}
}

// retryHandshakes re-creates, from their current configuration, the peers
// whose first handshake is overdue (see handshakeRetries): a Remove and a
// re-add with the first handshake nudged, in one ConfigureDevice call. Set
// never does this, so Set stays a pure diff of desired against actual.
func (d *Device) retryHandshakes() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || len(d.pending) == 0 {
		return nil
	}
	start := d.clock()
	cur, err := d.client.Device(d.name)
	d.checkRead = d.clock()
	d.checkCost = d.checkRead.Sub(start)
	if err != nil {
		return fmt.Errorf("reading WireGuard device %s: %w", d.name, err)
	}
	retry := d.handshakeRetries(cur)
	if len(retry) == 0 {
		return nil
	}
	dl := &delta{written: map[wgtypes.Key]netip.AddrPort{}, known: map[wgtypes.Key]netip.AddrPort{}}
	for i := range cur.Peers {
		c := &cur.Peers[i]
		ep := udpToAddrPort(c.Endpoint)
		if !retry[c.PublicKey] || !ep.IsValid() {
			continue
		}
		w := &wantPeer{key: c.PublicKey, psk: c.PresharedKey, endpoint: ep, keepalive: c.PersistentKeepaliveInterval}
		for _, n := range c.AllowedIPs {
			if p, ok := netipx(n); ok {
				w.allowedIPs = append(w.allowedIPs, p)
			}
		}
		dl.cfg.Peers = append(dl.cfg.Peers, wgtypes.PeerConfig{PublicKey: c.PublicKey, Remove: true})
		dl.cfg.Peers = append(dl.cfg.Peers, dl.createPeer(w)...)
	}
	if len(dl.cfg.Peers) == 0 {
		return nil
	}
	d.writes.Add(1)
	if err := d.client.ConfigureDevice(d.name, dl.cfg); err != nil {
		return fmt.Errorf("re-initiating handshakes on %s: %w", d.name, err)
	}
	d.applied(dl, dl.cfg.Peers)
	d.awaitHandshakes(cur.PublicKey, dl.nudged, retry)
	return nil
}

// netipx converts an allowed IP to a prefix.
func netipx(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// handshakeCheckDue reports when retryHandshakes should run to retry first
// handshakes that have not completed (false: nothing to check), never
// sooner than the last check's read allows (handshakeReadShare).
func (d *Device) handshakeCheckDue() (time.Duration, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, false
	}
	var due time.Duration
	found := false
	now := d.clock()
	for _, p := range d.pending {
		if p.retries >= handshakeMaxRetries {
			continue
		}
		at := p.since.Add(p.after)
		switch {
		case !p.session.IsZero() && !p.sent.IsZero():
			at = p.sent.Add(sessionSilentAfter)
		case !p.session.IsZero():
			at = p.looked.Add(sessionCheckEvery)
		case p.checked:
			continue
		case p.crossed > 0:
			at = p.since.Add(p.crossed)
			if !p.heard.IsZero() {
				at = p.heard.Add(p.crossed)
			}
		}
		wait := max(at.Sub(now), 0)
		if !found || wait < due {
			due, found = wait, true
		}
	}
	if found { // the read's share of the time (handshakeReadShare)
		gap := min(handshakeReadShare*d.checkCost, handshakeReadGapMax)
		due = max(due, d.checkRead.Add(gap).Sub(now))
	}
	return due, found
}

func (d *Device) clock() time.Time {
	if d.now == nil {
		return time.Now()
	}
	return d.now()
}

// applied records the endpoints written by the applied peer entries.
func (d *Device) applied(dl *delta, peers []wgtypes.PeerConfig) {
	for _, p := range peers {
		if p.Remove {
			delete(d.last, p.PublicKey)
			continue
		}
		if ep, ok := dl.written[p.PublicKey]; ok && p.Endpoint != nil {
			d.last[p.PublicKey] = ep
		}
	}
}

// trimIdle takes the peers idle for lazyIdleAfter out of an in-process
// device with lazy peers (see lazyPeers); it does nothing otherwise.
func (d *Device) trimIdle() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.lazy == nil {
		return nil
	}
	if err := d.lazy.trimIdle(); err != nil {
		return fmt.Errorf("taking idle peers out of %s: %w", d.name, err)
	}
	return nil
}

// LazyStats reports the lazy-peer layer's figures; false when the device
// has none (not in-process, or Options.LazyPeers off).
func (d *Device) LazyStats() (LazyStats, bool) {
	if d.lazy == nil {
		return LazyStats{}, false
	}
	return d.lazy.stats(), true
}

// Stats reads back every peer's state from the device.
func (d *Device) Stats() ([]PeerStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("reading WireGuard device %s: device closed", d.name)
	}
	dev, err := d.client.Device(d.name)
	if err != nil {
		return nil, fmt.Errorf("reading WireGuard device %s: %w", d.name, err)
	}
	out := make([]PeerStats, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		s := PeerStats{PublicKey: p.PublicKey, LastHandshake: p.LastHandshakeTime, ReceiveBytes: p.ReceiveBytes, TransmitBytes: p.TransmitBytes}
		if s.LastHandshake.Unix() <= 0 {
			s.LastHandshake = time.Time{}
		}
		if ap := udpToAddrPort(p.Endpoint); ap.IsValid() {
			s.Endpoint = net.UDPAddrFromAddrPort(ap)
		}
		out = append(out, s)
	}
	return out, nil
}

// Close releases the Device. An in-process device stops (its interface
// disappears with it); a kernel or external userspace interface stays.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	return d.release()
}

func (d *Device) release() error {
	var errs []error
	if d.lazy != nil {
		d.lazy.close()
	}
	if d.inproc != nil {
		d.inproc.close()
	}
	if d.closeClient != nil {
		if err := d.closeClient(); err != nil {
			errs = append(errs, fmt.Errorf("closing wgctrl: %w", err))
		}
	}
	if d.handle != nil {
		d.handle.Close()
	}
	return errors.Join(errs...)
}

// Delete removes the interface and closes the Device: a kernel link is
// deleted; an external userspace device is stopped by removing its UAPI
// socket (wireguard-go and RunDevice exit when it goes) and deleting its
// link, if it is still there; an in-process device is stopped.
func (d *Device) Delete() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("deleting %s: device closed", d.name)
	}
	var errs []error
	switch d.kind {
	case KindKernel, KindUserspaceExternal:
		if d.kind == KindUserspaceExternal {
			if err := os.Remove(socketPath(d.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing UAPI socket of %s: %w", d.name, err))
			}
		}
		if l, err := d.handle.LinkByName(d.name); err == nil {
			d.writes.Add(1)
			// ENODEV: the interface went between the lookup and the
			// delete, which is what Delete wants. An external device
			// does that on its own: wireguard-go notices its socket's
			// removal and closes the TUN device.
			if err := d.handle.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("deleting interface %s: %w", d.name, err))
			}
		}
	}
	d.closed = true
	if err := d.release(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
