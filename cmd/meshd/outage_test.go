package main

import (
	"context"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"meshd.io/meshd/pkg/k8s"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
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
