package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"time"

	"meshd.io/meshd/pkg/mesh"
)

// processStart is when this process started (for the restart figures).
var processStart = time.Now()

// stateFileName is the file in --state-dir holding the last applied state.
const stateFileName = "last-applied.json"

// stateVersion changes when the file's meaning does; another version is ignored.
const stateVersion = 1

// persistedState is what meshd last applied, kept in --state-dir (mode 0600,
// like the private key beside it: it holds preshared keys) so that a meshd
// restarted while the API server is down programs the node at once instead
// of waiting for its caches to sync.
type persistedState struct {
	Version int       `json:"version"`
	Node    string    `json:"node"`
	Saved   time.Time `json:"saved"`
	// Plan is the last plan applied without error.
	Plan *mesh.Plan `json:"plan"`
	// Links are the last known peers of every linked cluster, by link Secret
	// name: used while a cluster's cache has not synced (it is unreachable).
	Links map[string][]mesh.Peer `json:"links,omitempty"`
}

func statePath(dir string) string { return filepath.Join(dir, stateFileName) }

// encodeState returns the file's content.
func encodeState(s *persistedState) ([]byte, error) {
	return json.Marshal(s)
}

// loadState reads the state file; a missing file is (nil, nil).
func loadState(dir, node string) (*persistedState, error) {
	b, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the last applied state: %w", err)
	}
	var s persistedState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("reading the last applied state %s: %w", statePath(dir), err)
	}
	switch {
	case s.Version != stateVersion:
		return nil, fmt.Errorf("last applied state %s: version %d, want %d; ignored", statePath(dir), s.Version, stateVersion)
	case s.Node != node:
		return nil, fmt.Errorf("last applied state %s is of node %q, not %q; ignored", statePath(dir), s.Node, node)
	case s.Plan == nil:
		return nil, fmt.Errorf("last applied state %s has no plan; ignored", statePath(dir))
	}
	return &s, nil
}

// writeFileAtomic replaces path with data (mode 0600): written to a
// temporary file in the same directory, synced, then renamed, so a crash
// leaves the old file or the new one, never a torn one.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	_, werr := tmp.Write(data)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// saveState persists the applied plan and the linked clusters' last known
// peers, writing only when they differ from what was last written. The
// comparison is with the objects last written, not with their encoding: at
// 1,000 nodes the plan encodes to about 2 MB, and keeping that encoding (and
// encoding every plan twice to compare it) kept 5.6 MB of heap live in an
// idle daemon (docs/scale.md). An unchanged reconcile now encodes nothing.
func (r *reconciler) saveState(plan *mesh.Plan) {
	if r.stateDir == "" {
		return
	}
	if r.savedPlan != nil && reflect.DeepEqual(plan, r.savedPlan) && reflect.DeepEqual(r.linkPeers, r.savedLinks) {
		r.savedPlan = plan // the same content: keep the newest alive, not an old copy
		return
	}
	s := &persistedState{Version: stateVersion, Node: r.node, Saved: time.Now().UTC(), Plan: plan, Links: r.linkPeers}
	b, err := encodeState(s)
	if err == nil {
		err = writeFileAtomic(statePath(r.stateDir), b)
	}
	if err != nil {
		r.log.Warn("cannot persist the applied state; a restart during an API outage will wait for the API", "error", err)
		return
	}
	// Plans are never modified once built, and remotePeers replaces a
	// cluster's peers rather than editing them: a shallow copy of the map
	// is a snapshot.
	r.savedPlan, r.savedLinks = plan, maps.Clone(r.linkPeers)
}

// restore applies the persisted plan, if any, before the caches have synced:
// the node keeps (or, with an in-process device, regains within
// milliseconds) its last programming while the API server is unreachable.
// It reports whether a plan was applied.
func (r *reconciler) restore() (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			_ = r.recovered(p)
			ok = false
		}
	}()
	start := time.Now()
	s, err := loadState(r.stateDir, r.node)
	if err != nil {
		r.log.Warn("not restoring the last applied state", "error", err)
		return false
	}
	if s == nil {
		return false
	}
	if r.linkPeers == nil {
		r.linkPeers = s.Links
	}
	plan := s.Plan
	errs := r.executors.apply(plan, r.metrics) // the same executors, the same order as a reconcile
	r.restoredAt.Store(&s.Saved)
	r.log.Info("applied the last persisted state while the caches sync", "saved", s.Saved, "duration", time.Since(start), "since_process_start", time.Since(processStart),
		"peers", len(plan.WireGuard.Peers), "routes", len(plan.Routes), "error", errors.Join(errs...))
	return true
}
