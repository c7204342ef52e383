package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/secrets"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/route"
)

// TestPeerKeepsPresharedKeyWhenSecretVanishes: the preshared key comes from
// the Secret cache; a rotated key applies, and a deleted Secret keeps the
// peer on its last known key (reported), never removes it.
func TestPeerKeepsPresharedKeyWhenSecretVanishes(t *testing.T) {
	ctx := context.Background()
	f := newFakes(t, "a1", testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}))
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	f.rec.secrets = secrets.NewPresharedKeys(store, "meshd-system").Lookup
	peerKey := newKey(t)
	f.rec.peerLister = sliceLister{&v1alpha1.Peer{
		ObjectMeta: metav1.ObjectMeta{Name: "office"},
		Spec: v1alpha1.PeerSpec{
			PublicKey: peerKey.PublicKey().String(), AllowedIPs: []string{"10.5.0.1/32"},
			PresharedKeySecretRef: &v1alpha1.SecretKeyRef{Namespace: "meshd-system", Name: "psk", Key: "psk"},
		},
	}}
	secret := func(k wgtypes.Key) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "meshd-system", Name: "psk"}, Data: map[string][]byte{"psk": []byte(k.String())}}
	}
	psk := func() *wgtypes.Key {
		t.Helper()
		if p := f.peer(t, peerKey); p != nil {
			return &p.PresharedKey
		}
		return nil
	}
	k1, k2 := newKey(t), newKey(t)
	store.Add(secret(k1))
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := psk(); got == nil || *got != k1 {
		t.Fatalf("preshared key %v, want the Secret's", got)
	}
	store.Update(secret(k2))
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := psk(); got == nil || *got != k2 {
		t.Fatalf("rotated preshared key not applied: %v", got)
	}
	store.Delete(secret(k2))
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := psk(); got == nil || *got != k2 {
		t.Fatalf("Secret deleted: peer %v, want it kept with the last known key", got)
	}
	select {
	case e := <-f.rec.events.(*record.FakeRecorder).Events:
		if !contains(e, "keeping the last known preshared key") {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no Event for the vanished Secret")
	}
}

// TestRestoreAppliesPersistedState: a reconcile persists what it applied
// (0600, atomically); a fresh meshd on an empty node applies it before any
// cache exists, and an unusable file is ignored.
func TestRestoreAppliesPersistedState(t *testing.T) {
	dir := t.TempDir()
	nodes := []*corev1.Node{
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("a2", "a", "198.51.100.12", "10.42.2.0/24", newKey(t)),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	}
	f := newFakes(t, "a1", nodes...)
	f.rec.stateDir = dir
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v, want 0600", fi.Mode().Perm())
	}
	wantDev, _ := f.wgc.Device("meshd0")
	wantRoutes, _ := f.kern.ListRoutes(mesh.DefaultRouteTable, mesh.DefaultRouteProto)

	// A restart: nothing in the kernel, no caches (listers panic if read).
	g := newFakes(t, "a1")
	g.rec.setKey(f.rec.key)
	g.rec.stateDir = dir
	g.rec.nodeLister, g.rec.peerLister = nil, nil
	if !g.rec.restore() {
		t.Fatal("persisted state not restored")
	}
	dev, _ := g.wgc.Device("meshd0")
	if len(dev.Peers) != len(wantDev.Peers) || len(dev.Peers) == 0 || dev.Peers[0].PublicKey != wantDev.Peers[0].PublicKey {
		t.Errorf("restored peers %+v, want %+v", dev.Peers, wantDev.Peers)
	}
	if dev.PrivateKey != f.rec.key {
		t.Error("restored device has another private key")
	}
	got, _ := g.kern.ListRoutes(mesh.DefaultRouteTable, mesh.DefaultRouteProto)
	if len(got) != len(wantRoutes) || len(got) == 0 {
		t.Errorf("restored %d routes, want %d", len(got), len(wantRoutes))
	}
	if g.rec.restoredAt.Load() == nil {
		t.Error("restoredAt not set")
	}

	// Another node's file, or a torn one, is ignored.
	h := newFakes(t, "b1")
	h.rec.stateDir = dir
	if h.rec.restore() {
		t.Error("restored another node's state")
	}
	os.WriteFile(filepath.Join(dir, stateFileName), []byte("{"), 0o600)
	if g.rec.restore() {
		t.Error("restored a torn file")
	}
}

// fakeLinks is a linkSource with fixed answers.
type fakeLinks struct {
	listed  bool
	remotes []clusterlink.Remote
}

func (f *fakeLinks) Snapshot() []clusterlink.Remote { return f.remotes }
func (f *fakeLinks) Listed() bool                   { return f.listed }

// TestLinkedClusterKeepsPeersWhenUnsynced: a linked cluster's peers stay
// while the link controller has not observed it (restart or kubeconfig
// change during its outage) or its link is unusable, across a restart
// (persisted), and go only when the ClusterLink is deleted.
func TestLinkedClusterKeepsPeersWhenUnsynced(t *testing.T) {
	dir := t.TempDir()
	nodes := []*corev1.Node{testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{})}
	settings := clusterlink.LinkSettings{Name: "west", Granularity: mesh.GranularityLocation, Port: 51820,
		MeshCIDRs: []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16")}, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}}
	remote := testNode("w1", "x", "203.0.113.31", "10.52.1.0/24", newKey(t))
	leaders, _, err := clusterlink.Leaders(settings, []*corev1.Node{remote}, nil)
	if err != nil {
		t.Fatal(err)
	}
	links := &fakeLinks{listed: true, remotes: []clusterlink.Remote{{Object: &v1alpha1.ClusterLink{ObjectMeta: metav1.ObjectMeta{Name: "west"}},
		Link: mesh.RemoteLink{Cluster: "west"}, Leaders: leaders, Observed: true}}}
	f := newFakes(t, "a1", nodes...)
	f.rec.stateDir, f.rec.links = dir, links
	westPeer := func(f *fakes) bool {
		t.Helper()
		dev, err := f.wgc.Device("meshd0")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range dev.Peers {
			for _, a := range p.AllowedIPs {
				if a.String() == "10.52.1.0/24" {
					return true
				}
			}
		}
		return false
	}
	step := func(f *fakes, what string, want bool) {
		t.Helper()
		if err := f.rec.reconcile(context.Background()); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := westPeer(f); got != want {
			t.Fatalf("%s: linked cluster's peer present %v, want %v", what, got, want)
		}
	}
	step(f, "synced", true)
	links.remotes[0].Observed, links.remotes[0].Leaders = false, nil
	step(f, "kubeconfig changed while the cluster is down", true)
	links.remotes[0].Err = errors.New("link broken")
	step(f, "link unusable", true)
	links.remotes[0].Err = nil

	// Restart while the linked cluster is down: first the link Secrets are
	// not even listed, then listed but the cluster's Nodes never arrive.
	g := newFakes(t, "a1", nodes...)
	g.rec.setKey(f.rec.key)
	g.rec.stateDir = dir
	g.rec.links = &fakeLinks{}
	if !g.rec.restore() {
		t.Fatal("no state restored")
	}
	if !westPeer(g) {
		t.Fatal("restored state lacks the linked cluster's peer")
	}
	step(g, "restart, ClusterLinks not listed", true)
	g.rec.links = links
	step(g, "restart, linked cluster unreachable", true)
	links.remotes = nil
	step(g, "ClusterLink deleted", false)
}

// panicLister panics like a planner bug on shared input would.
type panicLister struct{}

func (panicLister) List() []any { panic("boom") }

// TestReconcilePanicRecovered: a panic while reconciling is returned as an
// error, counted, reported as an Event, and leaves the node as it was; the
// next reconcile works.
func TestReconcilePanicRecovered(t *testing.T) {
	ctx := context.Background()
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)))
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	routesBefore := f.kern.Routes()
	good := f.rec.nodeLister
	f.rec.nodeLister = panicLister{}
	err := f.rec.reconcile(ctx)
	if !errors.Is(err, errPanicked) || !contains(err.Error(), "boom") {
		t.Fatalf("err %v, want the recovered panic", err)
	}
	if got := testutil.ToFloat64(f.rec.metrics.panics); got != 1 {
		t.Errorf("meshd_reconcile_panics_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.rec.metrics.reconciles.WithLabelValues("success")); got != 1 {
		t.Errorf("the panicked reconcile counted as a success (%v successes)", got)
	}
	select {
	case e := <-f.rec.events.(*record.FakeRecorder).Events:
		if !contains(e, "ReconcilePanic") || !contains(e, "boom") {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no Event for the panic")
	}
	if f.rec.ready.Load() {
		t.Error("ready after a panic")
	}
	if got := f.kern.Routes(); len(got) != len(routesBefore) {
		t.Errorf("routes changed by the panicked reconcile: %v → %v", routesBefore, got)
	}
	f.rec.nodeLister = good
	if err := f.rec.reconcile(ctx); err != nil {
		t.Fatalf("reconcile after the panic: %v", err)
	}
}

// TestRestoreKeepsPeersOfPartlyFailedReconcile: a reconcile applies a new
// location's peer but cannot write one of its routes; the state persisted
// is that plan, so a restart (same kernel, same device) during an API
// outage does not restore the plan from before and remove the peer.
func TestRestoreKeepsPeersOfPartlyFailedReconcile(t *testing.T) {
	dir := t.TempDir()
	nodes := []*corev1.Node{
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	}
	f := newFakes(t, "a1", nodes...)
	f.rec.stateDir = dir
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	cKey := newKey(t)
	f.rec.nodeLister = sliceLister{nodes[0], nodes[1], testNode("c1", "c", "198.51.100.31", "10.42.5.0/24", cKey)}
	f.kern.SetFail(func(op string, obj any) error {
		if r, ok := obj.(route.KernelRoute); ok && op == "add route" && r.Dst == netip.MustParsePrefix("10.42.5.0/24") {
			return errors.New("injected route failure")
		}
		return nil
	})
	if err := f.rec.reconcile(context.Background()); err == nil {
		t.Fatal("reconcile: want the injected route failure")
	}
	if f.peer(t, cKey) == nil {
		t.Fatal("c1's peer not applied beside the failed route")
	}
	g := newFakes(t, "a1") // the restarted meshd: no Nodes yet, the same kernel and device
	g.wgc, g.kern = f.wgc, f.kern
	g.rec.executors = f.rec.executors
	g.rec.stateDir = dir
	if !g.rec.restore() {
		t.Fatal("restore applied nothing")
	}
	if f.peer(t, cKey) == nil {
		t.Fatal("restore after a restart removed c1's working peer: the persisted plan was the one before c1")
	}
}

// TestSaveStateWritesOnlyChanges: a reconcile that changes neither the plan
// nor the linked clusters' peers writes nothing (the file, removed after
// the first writes, stays gone); a changed plan, or changed link peers
// alone, is written, with the new content.
func TestSaveStateWritesOnlyChanges(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, stateFileName)
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.2.0/24", newKey(t)))
	f.rec.stateDir = dir
	f.step(t)
	f.step(t) // the node's own published annotations are in its cache now
	// written reads what was persisted (nil: nothing) and removes it. The
	// plan on disk is what saveState encoded; the one it kept went through
	// the rest of the reconcile (publishing, metrics, debug): it must not
	// have changed, or a later equal-looking plan would not be written.
	written := func() *persistedState {
		t.Helper()
		s, err := loadState(dir, "a1")
		if err != nil {
			t.Fatal(err)
		}
		if s != nil && !reflect.DeepEqual(s.Plan, f.rec.savedPlan) {
			t.Errorf("the persisted plan was modified after it was written:\n%+v\nnow\n%+v", s.Plan, f.rec.savedPlan)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		return s
	}
	if written() == nil {
		t.Fatal("nothing persisted")
	}
	for range 3 {
		f.step(t)
	}
	if s := written(); s != nil {
		t.Fatalf("unchanged reconciles rewrote the state (saved %v)", s.Saved)
	}

	c1 := newKey(t)
	if _, err := f.kube.CoreV1().Nodes().Create(context.Background(), testNode("c1", "c", "198.51.100.31", "10.42.3.0/24", c1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.refresh(t)
	f.step(t)
	s := written()
	if s == nil {
		t.Fatal("a changed plan was not persisted")
	}
	if !slices.ContainsFunc(s.Plan.WireGuard.Peers, func(p mesh.WireGuardPeer) bool { return p.PublicKey == c1.PublicKey() }) {
		t.Errorf("persisted plan has no peer for the new node: %+v", s.Plan.WireGuard.Peers)
	}

	// Links alone: the same plan (an equal copy), other link peers.
	b, err := encodeState(&persistedState{Plan: f.rec.savedPlan})
	if err != nil {
		t.Fatal(err)
	}
	var copied persistedState
	if err := json.Unmarshal(b, &copied); err != nil {
		t.Fatal(err)
	}
	plan := *copied.Plan
	f.rec.saveState(&plan)
	if s := written(); s != nil {
		t.Fatal("an equal plan was written again")
	}
	f.rec.linkPeers = map[string][]mesh.Peer{"west": {{Name: "west-n1", PublicKey: newKey(t).PublicKey()}}}
	f.rec.saveState(&plan)
	s = written()
	if s == nil || len(s.Links["west"]) != 1 || s.Links["west"][0].Name != "west-n1" {
		t.Fatalf("changed link peers not persisted: %+v", s)
	}
	f.rec.saveState(&plan)
	if s := written(); s != nil {
		t.Fatal("unchanged link peers written again")
	}
}
