package main

import (
	"io"
	"log/slog"
	"maps"
	"testing"
	"time"
)

// TestLiveFreeze: while the own Lease is not seen changing (API
// unreachable), the live set of the last plan is kept, so Leases expiring
// one after the other move no leader; after the API is back it stays frozen
// for the grace, then follows liveness again.
func TestLiveFreeze(t *testing.T) {
	t0 := time.Unix(1000, 0)
	f := newLiveFreeze(slog.New(slog.NewTextHandler(io.Discard, nil)), 40*time.Second, t0)
	all := map[string]bool{"a1": true, "a2": true}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	check := func(what string, got, want map[string]bool) {
		t.Helper()
		if !maps.Equal(got, want) {
			t.Errorf("%s: live %v, want %v", what, got, want)
		}
	}
	// Healthy: heartbeats every 10 s seen; liveness passes through.
	for i := range 4 {
		f.selfObserved(at(time.Duration(i) * 10 * time.Second))
		check("healthy", f.live(all, at(time.Duration(i)*10*time.Second+time.Second)), all)
	}
	// Outage from 31 s: own Lease last seen at 30 s.
	check("19 s unseen", f.live(map[string]bool{"a1": true, "a2": true}, at(49*time.Second)), all)
	a1dead := map[string]bool{"a1": false, "a2": true}
	check("a1's Lease expired during the outage", f.live(a1dead, at(65*time.Second)), all)
	check("every Lease expired", f.live(map[string]bool{"a1": false, "a2": false}, at(80*time.Second)), all)
	// The API is back at 100 s: still frozen for the grace (a2 renewed first).
	f.selfObserved(at(100 * time.Second))
	check("back, within the grace", f.live(a1dead, at(105*time.Second)), all)
	f.selfObserved(at(110 * time.Second))
	f.selfObserved(at(120 * time.Second))
	check("back, after the grace", f.live(a1dead, at(121*time.Second)), a1dead)
	// A real death while healthy is followed at once.
	f.selfObserved(at(125 * time.Second))
	check("healthy again", f.live(a1dead, at(126*time.Second)), a1dead)
}

// TestLiveFreezeFreshProcess: a process that never planned does not freeze
// (nothing to keep).
func TestLiveFreezeFreshProcess(t *testing.T) {
	t0 := time.Unix(1000, 0)
	f := newLiveFreeze(slog.New(slog.NewTextHandler(io.Discard, nil)), 40*time.Second, t0)
	live := map[string]bool{"a1": true}
	if got := f.live(live, t0.Add(time.Minute)); !maps.Equal(got, live) {
		t.Errorf("fresh process froze: %v", got)
	}
}

// TestLiveFreezeDue: the end of the grace after an outage changes the plan
// (a node that died during the outage goes) with no event to say so; due
// tells the daemon's tick, once, and the start of a freeze likewise.
func TestLiveFreezeDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	f := newLiveFreeze(slog.New(slog.NewTextHandler(io.Discard, nil)), 40*time.Second, t0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	all, a1dead := map[string]bool{"a1": true, "a2": true}, map[string]bool{"a1": false, "a2": true}
	f.live(all, at(time.Second))
	if f.due(at(2 * time.Second)) {
		t.Fatal("due while healthy")
	}
	if !f.due(at(25 * time.Second)) { // own Lease unseen for more than 20 s
		t.Fatal("the start of the freeze not due")
	}
	f.live(a1dead, at(25*time.Second))
	f.selfObserved(at(60 * time.Second)) // the API is back; the grace runs to 80 s
	for _, s := range []time.Duration{61, 70, 79} {
		f.selfObserved(at(s * time.Second))
		if f.due(at(s * time.Second)) {
			t.Fatalf("due at %d s, inside the grace", s)
		}
		f.live(a1dead, at(s*time.Second))
	}
	f.selfObserved(at(81 * time.Second))
	if !f.due(at(81 * time.Second)) {
		t.Fatal("the end of the grace not due: the plan would keep dead a1 until an unrelated event or the resync")
	}
	if got := f.live(a1dead, at(81*time.Second)); !maps.Equal(got, a1dead) {
		t.Fatalf("after the grace: live %v, want %v", got, a1dead)
	}
	if f.due(at(82 * time.Second)) {
		t.Fatal("still due after the plan followed")
	}
}
