// Command meshd is the node daemon of meshd: it keeps this node's WireGuard
// interface, routes and iptables rules equal to the plan computed from the
// cluster's Nodes and Peers. Subcommands: `device` runs only a userspace
// WireGuard device, `cleanup` removes everything meshd owns, `mirror`
// mirrors linked clusters' Services and `link` is the link controller.
//
// Out of scope: deciding or touching anything itself. The plan comes from
// pkg/mesh, the conversion of API objects from pkg/k8s/convert, and every kernel
// change from the executors pkg/wg, pkg/route and pkg/iptables; this package
// wires them together (flags, informers, the reconcile loop, the coalescer,
// metrics, the subcommands) and makes no netlink, wgctrl or iptables call of
// its own.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"github.com/spf13/pflag"

	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/procmem"
	"meshd.io/meshd/pkg/wg"
)

const usage = `meshd — a WireGuard mesh for Kubernetes nodes.

Usage:
  meshd [flags]                     run the node daemon
  meshd device --interface NAME     run only a userspace WireGuard device (a sidecar that outlives meshd restarts)
  meshd cleanup [flags]             remove the interface, routes, rules and iptables chains meshd owns
  meshd mirror [flags]              mirror exported Services of linked clusters (see meshd mirror --help)
  meshd link [flags]                the link controller: watch linked clusters once, write ClusterLinks (see meshd link --help)
  meshd dns [flags]                 answer clusterset.local DNS for ServiceImports (see meshd dns --help)
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
			return deviceCommand().main(args[1:], stderr)
		case "cleanup":
			return cleanupCommand().main(args[1:], stderr)
		case "mirror":
			return mirrorCommand().main(args[1:], stderr)
		case "link":
			return linkCommand().main(args[1:], stderr)
		case "dns":
			return dnsCommand().main(args[1:], stderr)
		case "version", "--version":
			fmt.Fprintln(stdout, version)
			return 0
		}
	}
	return daemonCommand().main(args, stderr)
}

// daemonCommand is `meshd`, the node daemon.
func daemonCommand() subcommand {
	var c config
	var opts mesh.Options
	fs := newFlagSet(&c)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	return subcommand{
		name: "meshd", flags: fs, logLevel: &c.LogLevel, logFormat: &c.LogFormat, failed: "meshd stopped",
		validate: func() (err error) {
			opts, err = c.options()
			return err
		},
		run: func(ctx context.Context, log *slog.Logger) error {
			setGCPercent(log)
			d, err := newDaemon(&c, opts, log)
			if err != nil {
				return fmt.Errorf("meshd cannot start: %w", err)
			}
			err = d.Run(ctx)
			if cerr := d.Close(c.CleanupOnExit); cerr != nil {
				log.Error("shutting down", "error", cerr)
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			log.Info("meshd stopped; kernel state left in place", "cleanup", c.CleanupOnExit)
			return nil
		},
	}
}

// deviceCommand is `meshd device`: only the userspace WireGuard device, no
// key, no API access.
func deviceCommand() subcommand {
	var dc deviceConfig
	return subcommand{
		name: "meshd device", flags: newDeviceFlagSet(&dc), logLevel: &dc.LogLevel, logFormat: &dc.LogFormat, failed: "device stopped",
		validate: func() error {
			_, err := parseLevel(dc.LogLevel)
			return errors.Join(err, checkLogFormat(dc.LogFormat))
		},
		run: func(ctx context.Context, log *slog.Logger) error {
			go func() {
				select { // the device is up by then
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
					trimStartupPages(log)
				}
			}()
			if err := wg.RunDevice(ctx, log, dc.Interface, dc.MTU); err != nil {
				return fmt.Errorf("interface %s: %w", dc.Interface, err)
			}
			return nil
		},
	}
}

// deviceConfig are the settings of `meshd device`.
type deviceConfig struct {
	Interface string
	MTU       int
	LogLevel  string
	LogFormat string
}

func newDeviceFlagSet(c *deviceConfig) *pflag.FlagSet {
	fs := pflag.NewFlagSet("meshd device", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&c.Interface, "interface", mesh.DefaultInterface, "name of the WireGuard interface to create")
	fs.IntVar(&c.MTU, "mtu", 1420, "MTU of the interface (meshd adjusts it later)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text (logfmt) or json; client-go's klog lines are written the same way")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: meshd device --interface NAME\n\nRuns a userspace WireGuard device with its UAPI socket in /var/run/wireguard until SIGTERM.\nmeshd --wireguard auto adopts it, so meshd restarts do not touch traffic.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// cleanupCommand is `meshd cleanup`: it removes everything meshd owns on
// this node.
func cleanupCommand() subcommand {
	var c config
	return subcommand{
		name: "meshd cleanup", flags: newFlagSet(&c), logLevel: &c.LogLevel, logFormat: &c.LogFormat, failed: "cleanup incomplete",
		validate: func() error {
			_, err := parseLevel(c.LogLevel)
			return errors.Join(err, checkLogFormat(c.LogFormat))
		},
		run: func(_ context.Context, log *slog.Logger) error {
			if err := cleanup(&c, log); err != nil {
				return err
			}
			log.Info("removed everything meshd owns", "interface", c.Interface)
			return nil
		},
	}
}

// trimStartupPages returns the executable's pages that only start-up
// touched (package initialisation, the first reconcile) to the kernel
// (procmem.TrimExecutable: unmapped, and dropped from the page cache):
// 30-40 MB of resident memory that a node agent on every node would
// otherwise keep. What runs again faults back in from the disk, without
// read-ahead for readAheadAfter; then with it again (see procmem).
func trimStartupPages(log *slog.Logger) {
	r, err := procmem.TrimExecutable()
	attrs := []any{"resident_file_mb_before", r.ResidentBefore >> 20, "resident_file_mb_after", r.ResidentAfter >> 20, "page_cache_dropped", r.CacheDropped}
	if err != nil {
		log.Warn("returning the executable's start-up pages failed in part; nothing else is affected", append(attrs, "error", err)...)
	} else {
		log.Info("returned the executable's start-up pages", attrs...)
	}
	if r.Mappings == 0 {
		return
	}
	time.AfterFunc(readAheadAfter, func() {
		if _, err := procmem.ReadAheadAgain(); err != nil {
			log.Warn("restoring read-ahead for the executable's pages failed; nothing else is affected", "error", err)
			return
		}
		log.Info("restored read-ahead for the executable's pages", "after", readAheadAfter)
	})
}

// readAheadAfter is how long after the trim the executable's pages fault
// back in one at a time (procmem.ReadAheadAgain): long enough for what
// keeps running (resyncs, heartbeats, metrics, the garbage collector) to
// have come back.
const readAheadAfter = 10 * time.Minute

// defaultGCPercent is the node daemon's GOGC unless the environment sets
// one: the heap grows to 1.5 times what is live before a collection, not
// twice. An idle meshd allocates little (a reconcile per --resync-period),
// so the extra collections cost next to nothing, and the memory of an agent
// that runs on every node is what a cluster pays N times: at 1,000 nodes in
// location mesh, 65-68 MB of RSS instead of 82-94 (docs/scale.md).
const defaultGCPercent = 50

func setGCPercent(log *slog.Logger) {
	if os.Getenv("GOGC") != "" {
		return // the operator's choice
	}
	debug.SetGCPercent(defaultGCPercent)
	log.Debug("garbage collection target set", "gogc", defaultGCPercent)
}
