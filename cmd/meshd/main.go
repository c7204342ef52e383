// Command meshd is the node daemon of meshd: it keeps this node's WireGuard
// interface, routes and iptables rules equal to the plan computed from the
// cluster's Nodes and Peers. Subcommands: `device` runs only a userspace
// WireGuard device, `cleanup` removes everything meshd owns.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"

	"github.com/oklog/run"
	"github.com/spf13/pflag"

	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/wg"
)

const usage = `meshd — a WireGuard mesh for Kubernetes nodes.

Usage:
  meshd [flags]                     run the node daemon
  meshd device --interface NAME     run only a userspace WireGuard device (a sidecar that outlives meshd restarts)
  meshd cleanup [flags]             remove the interface, routes, rules and iptables chains meshd owns
  meshd mirror [flags]              mirror exported Services of linked clusters (see meshd mirror --help)
  meshd version (or meshd --version) print the version

Flags of the node daemon (cleanup takes the same):
`

// version is set by the linker: -ldflags "-X main.version=$(git describe --tags --always --dirty)"
// (make build, make image and the Dockerfile do).
var version = "dev"

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "device":
			return runDevice(args[1:], stderr)
		case "cleanup":
			return runCleanup(args[1:], stderr)
		case "mirror":
			return runMirror(args[1:], stderr)
		case "version", "--version":
			fmt.Fprintln(stdout, version)
			return 0
		}
	}
	var c config
	fs := newFlagSet(&c)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "meshd: unexpected argument %q (see meshd --help)\n", fs.Arg(0))
		return 2
	}
	opts, err := c.options()
	if err != nil {
		fmt.Fprintf(stderr, "meshd: invalid flags:\n%v\n", err)
		return 2
	}
	log := newLogger(stderr, c.LogLevel)
	d, err := newDaemon(&c, opts, log)
	if err != nil {
		log.Error("meshd cannot start", "error", err)
		return 1
	}
	var g run.Group
	ctx, cancel := context.WithCancel(context.Background())
	g.Add(func() error { return d.Run(ctx) }, func(error) { cancel() })
	g.Add(run.SignalHandler(ctx, os.Interrupt, syscall.SIGTERM))
	err = g.Run()
	if cerr := d.Close(c.CleanupOnExit); cerr != nil {
		log.Error("shutting down", "error", cerr)
	}
	var sig run.SignalError
	if err != nil && !errors.As(err, &sig) && !errors.Is(err, context.Canceled) {
		log.Error("meshd stopped", "error", err)
		return 1
	}
	log.Info("meshd stopped; kernel state left in place", "cleanup", c.CleanupOnExit)
	return 0
}

func newLogger(w io.Writer, level string) *slog.Logger {
	l, _ := parseLevel(level)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// runDevice runs only the userspace WireGuard device: no key, no API access.
func runDevice(args []string, stderr io.Writer) int {
	var dc deviceConfig
	fs := newDeviceFlagSet(&dc)
	fs.SetOutput(stderr)
	name, mtu, level := &dc.Interface, &dc.MTU, &dc.LogLevel
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if _, err := parseLevel(*level); err != nil {
		fmt.Fprintln(stderr, "meshd device:", err)
		return 2
	}
	log := newLogger(stderr, *level)
	ctx, cancel := context.WithCancel(context.Background())
	var g run.Group
	g.Add(func() error { return wg.RunDevice(ctx, log, *name, *mtu) }, func(error) { cancel() })
	g.Add(run.SignalHandler(ctx, os.Interrupt, syscall.SIGTERM))
	err := g.Run()
	var sig run.SignalError
	if err != nil && !errors.As(err, &sig) && !errors.Is(err, context.Canceled) {
		log.Error("device stopped", "interface", *name, "error", err)
		return 1
	}
	return 0
}

// deviceConfig are the settings of `meshd device`.
type deviceConfig struct {
	Interface string
	MTU       int
	LogLevel  string
}

func newDeviceFlagSet(c *deviceConfig) *pflag.FlagSet {
	fs := pflag.NewFlagSet("meshd device", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&c.Interface, "interface", mesh.DefaultInterface, "name of the WireGuard interface to create")
	fs.IntVar(&c.MTU, "mtu", 1420, "MTU of the interface (meshd adjusts it later)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: meshd device --interface NAME\n\nRuns a userspace WireGuard device with its UAPI socket in /var/run/wireguard until SIGTERM.\nmeshd --wireguard auto adopts it, so meshd restarts do not touch traffic.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// runCleanup removes everything meshd owns on this node.
func runCleanup(args []string, stderr io.Writer) int {
	var c config
	fs := newFlagSet(&c)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	log := newLogger(stderr, c.LogLevel)
	if err := cleanup(&c, log); err != nil {
		log.Error("cleanup incomplete", "error", err)
		return 1
	}
	log.Info("removed everything meshd owns", "interface", c.Interface)
	return 0
}
