package wg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Manager owns the WireGuard interface for the daemon's whole life, the way
// route.Manager owns routes: Set applies a desired Config (opening the
// interface again first when it has disappeared), and Run is the one worker
// that keeps the interface as last desired between Sets. Run puts the
// interface back when it is deleted, replaced or downed (then asks for a
// reconcile through changed, since its routes went with it) and re-initiates
// the first handshakes that crossed (see Device.retryHandshakes). No timer
// writes to the device outside Run.
type Manager struct {
	opts Options
	log  *slog.Logger
	ns   netns.NsHandle // the namespace the interface lives in; reopened there

	// Seams for tests: open makes a Device, watch reports link changes of
	// the interface until ctx ends.
	open  func(ctx context.Context, opts Options) (*Device, error)
	watch func(ctx context.Context, changed func()) error

	kick chan struct{} // Set ran: the handshake check may be due sooner

	mu      sync.Mutex
	dev     *Device // nil after a failed reopen
	desired *Config // the last Set; nil before the first
	writes  uint64  // writes of the Devices closed by reopening
	closed  bool
}

// NewManager opens the interface opts.Name (see Open) in the calling
// thread's network namespace, which the Manager remembers: a reopen
// happens there too, whichever goroutine does it.
func NewManager(ctx context.Context, opts Options) (*Manager, error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("getting the current network namespace: %w", err)
	}
	m := newManager(opts, nil, nil)
	m.ns = ns
	m.open = m.openInNS
	watchNS := ns // not m.ns, which Close resets
	m.watch = func(ctx context.Context, changed func()) error {
		return watchLink(ctx, m.log, &watchNS, opts.Name, changed)
	}
	dev, err := Open(ctx, opts)
	if err != nil {
		ns.Close()
		return nil, err
	}
	m.dev = dev
	return m, nil
}

// NewManagerWith returns a Manager over dev whose reopen calls open and whose
// Run follows the interface through watch: the seams tests use with
// NewWithClient, FakeClient and FakeLinks.
func NewManagerWith(dev *Device, opts Options, open func(context.Context, Options) (*Device, error), watch func(context.Context, func()) error) *Manager {
	m := newManager(opts, open, watch)
	m.dev = dev
	return m
}

func newManager(opts Options, open func(context.Context, Options) (*Device, error), watch func(context.Context, func()) error) *Manager {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{opts: opts, log: log.With("interface", opts.Name), ns: netns.None(), open: open, watch: watch, kick: make(chan struct{}, 1)}
}

// openInNS opens the interface in the Manager's namespace, from a thread of
// its own when the caller's thread is elsewhere.
func (m *Manager) openInNS(ctx context.Context, opts Options) (d *Device, err error) {
	if !unlessCurrentNS(m.ns).IsOpen() {
		return Open(ctx, opts)
	}
	if nerr := inNS(m.ns, func() { d, err = Open(ctx, opts) }); nerr != nil {
		return nil, nerr
	}
	return d, err
}

// Set makes the interface match cfg (see Device.Set) and remembers cfg as
// the desired state Run keeps. When the interface has disappeared (deleted
// by hand, a sidecar device that died), it is opened again — adopted or
// created, as Options.Mode allows — and configured.
func (m *Manager) Set(cfg Config) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("configuring %s: closed", m.opts.Name)
	}
	m.desired = &cfg
	err := m.applyLocked()
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
	return err
}

// applyLocked applies the desired config, reopening the interface once if it
// is gone.
func (m *Manager) applyLocked() error {
	var err error
	if m.dev != nil {
		if err = m.dev.Set(*m.desired); err == nil || !m.dev.linkGone() {
			return err // done, or a real configuration error
		}
		m.log.Warn("WireGuard interface disappeared; opening it again", "error", err)
	}
	if oerr := m.reopenLocked(); oerr != nil {
		return errors.Join(err, oerr)
	}
	return m.dev.Set(*m.desired)
}

// reopenLocked closes the current Device, if any, and opens the interface
// again.
func (m *Manager) reopenLocked() error {
	if m.dev != nil {
		m.writes += m.dev.Writes()
		_ = m.dev.Close()
		m.dev = nil
	}
	dev, err := m.open(context.Background(), m.opts)
	if err != nil {
		return fmt.Errorf("reopening WireGuard interface %s: %w", m.opts.Name, err)
	}
	m.dev = dev
	return nil
}

// Run follows the interface until ctx ends, then returns nil. When it is
// deleted, replaced or set down, Run applies the last desired Config again
// (reopening the interface if needed) and calls changed, if not nil, so the
// caller puts back what went with the link (its routes). It also retries
// first handshakes when due. Nothing is applied before the first Set or
// after Close.
func (m *Manager) Run(ctx context.Context, changed func()) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan struct{}, 1)
	werr := make(chan error, 1)
	go func() {
		werr <- m.watch(wctx, func() {
			select {
			case events <- struct{}{}:
			default:
			}
		})
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var timerC <-chan time.Time
	schedule := func() {
		timer.Stop()
		timerC = nil
		if due, ok := m.handshakeCheckDue(); ok {
			timer.Reset(due)
			timerC = timer.C
		}
	}
	schedule()
	// The lazy-peer trim (see lazyPeers); a nil channel when off.
	var trimC <-chan time.Time
	if m.opts.LazyPeers {
		trim := time.NewTicker(lazyTrimEvery)
		defer trim.Stop()
		trimC = trim.C
	}
	for {
		select {
		case <-ctx.Done():
			cancel()
			return <-werr
		case err := <-werr:
			if ctx.Err() != nil {
				return nil
			}
			return err
		case <-events:
			m.repair()
			if changed != nil {
				changed()
			}
			schedule()
		case <-m.kick:
			schedule()
		case <-timerC:
			m.retryHandshakes()
			schedule()
		case <-trimC:
			m.trimIdle()
		}
	}
}

// repair applies the last desired config again after a link change.
func (m *Manager) repair() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.desired == nil {
		return
	}
	if err := m.applyLocked(); err != nil {
		m.log.Warn("putting the WireGuard interface back", "error", err)
	}
}

func (m *Manager) handshakeCheckDue() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.dev == nil {
		return 0, false
	}
	return m.dev.handshakeCheckDue()
}

func (m *Manager) retryHandshakes() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.dev == nil {
		return
	}
	if err := m.dev.retryHandshakes(); err != nil {
		m.log.Warn("retrying WireGuard handshakes", "error", err)
	}
}

func (m *Manager) trimIdle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.dev == nil {
		return
	}
	if err := m.dev.trimIdle(); err != nil {
		m.log.Warn("trimming idle WireGuard peers", "error", err)
	}
}

// LazyStats reports the current Device's lazy-peer figures (see
// Device.LazyStats).
func (m *Manager) LazyStats() (LazyStats, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dev == nil {
		return LazyStats{}, false
	}
	return m.dev.LazyStats()
}

// Stats reads back every peer's state from the device.
func (m *Manager) Stats() ([]PeerStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dev == nil {
		return nil, fmt.Errorf("reading WireGuard device %s: not open", m.opts.Name)
	}
	return m.dev.Stats()
}

// Writes counts the writes to the interface, across reopens.
func (m *Manager) Writes() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.writes
	if m.dev != nil {
		n += m.dev.Writes()
	}
	return n
}

// Kind is the current Device's Kind ("" while not open).
func (m *Manager) Kind() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dev == nil {
		return ""
	}
	return m.dev.Kind()
}

// Close releases the device (see Device.Close); Run applies nothing after.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	defer m.closeNS()
	if m.dev == nil {
		return nil
	}
	return m.dev.Close()
}

// Delete removes the interface and closes the Manager (see Device.Delete).
func (m *Manager) Delete() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.dev == nil {
		return fmt.Errorf("deleting %s: not open", m.opts.Name)
	}
	m.closed = true
	defer m.closeNS()
	return m.dev.Delete()
}

// linkGone reports whether the interface no longer exists.
func (d *Device) linkGone() bool {
	_, err := d.links.Link(d.name)
	var notFound netlink.LinkNotFoundError
	return err != nil && (errors.As(err, &notFound) || errors.Is(err, os.ErrNotExist))
}

func (m *Manager) closeNS() {
	if m.ns.IsOpen() {
		m.ns.Close()
	}
}
