//go:build e2e

package e2e

import (
	"context"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/e2e/testbed"
)

// The laptop Peer's tunnel address and WireGuard port (the outside host
// of the Peer scenarios).
const laptopIP, laptopPort = "10.5.0.1", 51821

// pskLaptop is an outside WireGuard host declared as the Peer "laptop"
// with a preshared key from a Secret.
type pskLaptop struct {
	key     string // its public key
	psk     string // the preshared key, also in pskFile on the host
	keyFile string // its private key file on the host
	pskFile string
}

// addPSKLaptop starts laptop's wg0, gives it a key, writes a random
// preshared key to the Secret secret in the peer-secret namespace (deleted
// at the end of the test) and to a file on the host, and creates the Peer
// "laptop" for it: allowed IP laptopIP, endpoint the host at laptopPort,
// keepalive 10 s. The host's wg0 is not yet configured with a peer.
func (s *scenario) addPSKLaptop(laptop *testbed.External, secret string) pskLaptop {
	t, ctx := s.t, s.ctx
	t.Helper()
	l := pskLaptop{psk: randomKey()}
	secrets := tb.Kube.CoreV1().Secrets(testbed.PeerSecretNamespace)
	if _, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: testbed.PeerSecretNamespace},
		Data:       map[string][]byte{"psk": []byte(l.psk)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The testbed's reset leaves Secrets alone.
	t.Cleanup(func() { _ = secrets.Delete(context.Background(), secret, metav1.DeleteOptions{}) })
	if _, err := laptop.StartDevice(ctx, "wg0"); err != nil {
		t.Fatal(err)
	}
	l.keyFile, l.pskFile = filepath.Join(laptop.Dir, "private.key"), filepath.Join(laptop.Dir, "psk")
	if _, err := laptop.Exec(ctx, "sh", "-c", "umask 077; wg genkey > "+l.keyFile+"; echo "+l.psk+" > "+l.pskFile); err != nil {
		t.Fatal(err)
	}
	out, err := laptop.Exec(ctx, "sh", "-c", "wg pubkey < "+l.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	l.key = strings.TrimSpace(out)
	if _, err := tb.Dynamic.Resource(testbed.PeerGVR).Create(ctx, peerObject("laptop", map[string]any{
		"publicKey":             l.key,
		"allowedIPs":            []any{laptopIP + "/32"},
		"endpoint":              map[string]any{"host": laptop.IP.String(), "port": int64(laptopPort)},
		"persistentKeepalive":   int64(10),
		"presharedKeySecretRef": map[string]any{"name": secret, "namespace": testbed.PeerSecretNamespace, "key": "psk"},
	}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Peer: %v", err)
	}
	return l
}
