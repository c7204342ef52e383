package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"meshd.io/meshd/pkg/k8s"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/mesh"
)

// TestPeerKeepsPresharedKeyWhenSecretVanishes: the preshared key comes from
// the Secret cache; a rotated key applies, and a deleted Secret keeps the
// peer on its last known key (reported), never removes it.
func TestPeerKeepsPresharedKeyWhenSecretVanishes(t *testing.T) {
	ctx := context.Background()
	f := newFakes(t, "a1", testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}))
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	f.rec.secrets = k8s.NewPresharedKeys(store, "meshd-system").Lookup
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
		dev, err := f.wgc.Device("meshd0")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range dev.Peers {
			if p.PublicKey == peerKey.PublicKey() {
				return &p.PresharedKey
			}
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
	g.rec.key, g.rec.stateDir = f.rec.key, dir
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
