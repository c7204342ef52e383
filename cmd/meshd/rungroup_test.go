package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/oklog/run"
)

// TestGroupStopsWhenAPartFails: an actor that fails stops the daemon's
// group, the stop-on-signal actor included, so Run returns the error (it
// used to wait for the signal forever), and the failure is logged at once
// with the part's name.
func TestGroupStopsWhenAPartFails(t *testing.T) {
	var logged []string
	log := slog.New(recordHandler(func(r slog.Record) {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "part" {
				logged = append(logged, a.Value.String())
			}
			return true
		})
	}))
	ctx := context.Background() // no signal ever
	var g run.Group
	boom := errors.New("boom")
	addActor(&g, ctx, log, "failing part", func(context.Context) error { return boom })
	addActor(&g, ctx, log, "waiting part", func(c context.Context) error { <-c.Done(); return nil })
	addStopOnDone(&g, ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run() }()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("Run = %v, want the failing part's error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the group did not stop after a part failed")
	}
	if len(logged) != 1 || logged[0] != "failing part" {
		t.Fatalf("logged parts %q, want only the failing one", logged)
	}
}

// TestGroupStopsOnSignal: with every part running, the end of ctx (the
// signal) stops the group, which logs no failure.
func TestGroupStopsOnSignal(t *testing.T) {
	failures := 0
	log := slog.New(recordHandler(func(slog.Record) { failures++ }))
	ctx, cancel := context.WithCancel(context.Background())
	var g run.Group
	addActor(&g, ctx, log, "part", func(c context.Context) error { <-c.Done(); return nil })
	addStopOnDone(&g, ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run() }()
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) { // whichever part stops first
			t.Fatalf("Run = %v, want nil or context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the group did not stop on the signal")
	}
	if failures != 0 {
		t.Fatalf("%d failures logged on a normal stop", failures)
	}
}

// recordHandler is a slog.Handler that passes every record to f.
type recordHandler func(slog.Record)

func (h recordHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h recordHandler) WithGroup(string) slog.Handler                 { return h }
