package secrets

import (
	"errors"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestPresharedKeysKeepLastKnown(t *testing.T) {
	k1, _ := wgtypes.GenerateKey()
	k2, _ := wgtypes.GenerateKey()
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	secret := func(v string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "meshd-system", Name: "psk"}, Data: map[string][]byte{"psk": []byte(v)}}
	}
	p := NewPresharedKeys(store, "meshd-system")

	if _, err := p.Lookup("meshd-system", "psk", "psk"); err == nil || errors.As(err, new(*StaleError)) {
		t.Fatalf("never seen Secret: err %v, want a plain error", err)
	}
	store.Add(secret(k1.String()))
	if v, err := p.Lookup("meshd-system", "psk", "psk"); err != nil || string(v) != k1.String() {
		t.Fatalf("Lookup = %q, %v", v, err)
	}
	store.Update(secret(k2.String() + "\n"))
	if v, err := p.Lookup("meshd-system", "psk", "psk"); err != nil || string(v) != k2.String()+"\n" {
		t.Fatalf("changed Secret: Lookup = %q, %v", v, err)
	}
	for name, change := range map[string]func(){
		"malformed": func() { store.Update(secret("short")) },
		"key gone": func() {
			store.Update(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "meshd-system", Name: "psk"}})
		},
		"deleted": func() { store.Delete(secret("")) },
	} {
		change()
		v, err := p.Lookup("meshd-system", "psk", "psk")
		var se *StaleError
		if !errors.As(err, &se) || string(v) != k2.String()+"\n" {
			t.Errorf("%s: Lookup = %q, %v; want the last known key and a *StaleError", name, v, err)
		}
		if err != nil && strings.Contains(err.Error(), k2.String()) {
			t.Errorf("%s: error leaks the key: %v", name, err)
		}
		store.Add(secret(k2.String() + "\n"))
	}
	if _, err := p.Lookup("default", "psk", "psk"); err == nil || !strings.Contains(err.Error(), "not in namespace meshd-system") {
		t.Errorf("Secret outside the namespace: err %v", err)
	}
}
