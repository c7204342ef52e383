package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// subcommand is the scaffolding every meshd subcommand shares, written
// once: parse the flags (help exits 0; a bad flag, a stray argument or
// invalid settings exit 2 with the reason on stderr), build the logger, and
// run until SIGINT or SIGTERM (a run error exits 1).
type subcommand struct {
	name     string         // as the user types it: "meshd", "meshd mirror"
	flags    *pflag.FlagSet // its flags, bound to the subcommand's config
	logLevel *string        // the --log-level flag's value
	// logFormat is the --log-format flag's value: text or json.
	logFormat *string
	// validate checks the parsed flags (nil: nothing to check).
	validate func() error
	// run is the subcommand; ctx ends on SIGINT or SIGTERM. Returning
	// ctx's error counts as a clean stop.
	run func(ctx context.Context, log *slog.Logger) error
	// failed is logged with run's error.
	failed string
}

// main runs the subcommand over args and returns the process exit code.
func (s subcommand) main(args []string, stderr io.Writer) int {
	s.flags.SetOutput(stderr)
	if err := s.flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		// pflag prints nothing itself with ContinueOnError.
		fmt.Fprintf(stderr, "%s: %v (see %s --help)\n", s.name, err, s.name)
		return 2
	}
	if s.flags.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (see %s --help)\n", s.name, s.flags.Arg(0), s.name)
		return 2
	}
	if s.validate != nil {
		if err := s.validate(); err != nil {
			fmt.Fprintf(stderr, "%s: invalid flags:\n%v\n", s.name, err)
			return 2
		}
	}
	log := newLogger(stderr, *s.logLevel, *s.logFormat)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := s.run(ctx, log); err != nil && !errors.Is(err, context.Canceled) {
		log.Error(s.failed, "error", err)
		return 1
	}
	return 0
}

// newLogger builds the logger of level and format (text or json, checked
// before) and makes it klog's too, so client-go's lines (reflector errors,
// throttling, leader election) come out in the same format and level
// filter instead of klog's own on stderr.
func newLogger(w io.Writer, level, format string) *slog.Logger {
	l, _ := parseLevel(level)
	opts := &slog.HandlerOptions{Level: l}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	log := slog.New(h)
	klog.SetSlogLogger(log)
	return log
}
