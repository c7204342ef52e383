package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"meshd.io/meshd/pkg/route"
	"meshd.io/meshd/pkg/wg"
)

// device is the WireGuard device the daemon configures. If the interface
// disappears (deleted by hand, a sidecar device that died), the next Set
// opens it again — adopting or creating one — instead of failing forever.
type device struct {
	log  *slog.Logger
	opts wg.Options

	mu    sync.Mutex
	dev   *wg.Device
	retry *time.Timer // pending RetryHandshakes
}

func openDevice(ctx context.Context, log *slog.Logger, opts wg.Options) (*device, error) {
	dev, err := wg.Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &device{log: log, opts: opts, dev: dev}, nil
}

func (d *device) current() *wg.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dev
}

// Set configures the device, reopening it once if its interface is gone.
func (d *device) Set(cfg wg.Config) error {
	err := d.current().Set(cfg)
	if err == nil {
		return nil
	}
	if route.LinkExists(d.opts.Name) {
		return err // the interface exists: a real configuration error
	}
	d.log.Warn("WireGuard interface disappeared; opening it again", "interface", d.opts.Name, "error", err)
	d.mu.Lock()
	_ = d.dev.Close()
	dev, oerr := wg.Open(context.Background(), d.opts)
	if oerr == nil {
		d.dev = dev
	}
	d.mu.Unlock()
	if oerr != nil {
		return errors.Join(err, fmt.Errorf("reopening WireGuard interface %s: %w", d.opts.Name, oerr))
	}
	return d.current().Set(cfg)
}

func (d *device) Stats() ([]wg.PeerStats, error) { return d.current().Stats() }

// scheduleHandshakeRetries arranges for first handshakes that have not
// completed (two nodes that initiated at the same moment) to be retried when
// due (see wg.Device.RetryHandshakes); it reschedules itself while needed.
func (d *device) scheduleHandshakeRetries() {
	due, ok := d.current().HandshakeCheckDue()
	if !ok {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.retry != nil {
		d.retry.Stop()
	}
	d.retry = time.AfterFunc(due, func() {
		if err := d.current().RetryHandshakes(); err != nil {
			d.log.Warn("retrying WireGuard handshakes", "error", err)
		}
		d.scheduleHandshakeRetries()
	})
}

// Writes counts the writes of the current device (reset when reopened).
func (d *device) Writes() uint64 { return d.current().Writes() }

func (d *device) Kind() string  { return d.current().Kind() }
func (d *device) Close() error  { return d.current().Close() }
func (d *device) Delete() error { return d.current().Delete() }
