package convert

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/secrets"
	"meshd.io/meshd/pkg/mesh"
)

// SecretLookup returns the value of one key of a Secret.
type SecretLookup func(namespace, name, key string) ([]byte, error)

// PeerFromObject converts a Peer object. The API server already validated
// it against the CRD schema, but the conversion checks again (a Peer written
// before a schema change, or a CRD installed without validation) and
// returns an error naming the bad field; the Peer is then unusable. The
// preshared key, if referenced, is read through secretLookup; it may be
// stored as its base64 text (as printed by `wg genpsk`) or as 32 raw bytes.
// Errors never contain key material.
func PeerFromObject(p *v1alpha1.Peer, secretLookup func(ns, name, key string) ([]byte, error)) (mesh.Peer, error) {
	if p == nil {
		return mesh.Peer{}, errors.New("converting peer: nil Peer")
	}
	fail := func(format string, args ...any) (mesh.Peer, error) {
		return mesh.Peer{}, fmt.Errorf("converting peer %q: "+format, append([]any{p.Name}, args...)...)
	}
	out := mesh.Peer{Name: p.Name, Created: p.CreationTimestamp.Time}

	key, err := wgtypes.ParseKey(p.Spec.PublicKey)
	if err != nil {
		return fail("spec.publicKey %q is not a base64-encoded 32-byte WireGuard key", p.Spec.PublicKey)
	}
	out.PublicKey = key

	if len(p.Spec.AllowedIPs) == 0 {
		return fail("spec.allowedIPs is empty")
	}
	for i, s := range p.Spec.AllowedIPs {
		ps, err := ParsePrefixes([]string{s})
		if err != nil {
			return fail("spec.allowedIPs[%d]: %w", i, err)
		}
		out.AllowedIPs = append(out.AllowedIPs, ps[0])
	}

	if e := p.Spec.Endpoint; e != nil {
		if e.Port < 1 || e.Port > 65535 {
			return fail("spec.endpoint.port %d is not between 1 and 65535", e.Port)
		}
		host := e.Host
		if strings.Contains(host, ":") {
			host = "[" + host + "]" // ParseEndpoint wants brackets around IPv6 with a port
		}
		ep, err := ParseEndpoint(fmt.Sprintf("%s:%d", host, e.Port), int(e.Port))
		if err != nil {
			return fail("spec.endpoint.host: %w", err)
		}
		out.Endpoint = ep
	}

	if ka := p.Spec.PersistentKeepalive; ka != nil {
		if *ka < 0 || *ka > 65535 {
			return fail("spec.persistentKeepalive %d is not between 0 and 65535 seconds", *ka)
		}
		out.PersistentKeepalive = time.Duration(*ka) * time.Second
	}

	if ref := p.Spec.PresharedKeySecretRef; ref != nil {
		psk, err := presharedKey(ref, secretLookup)
		if err != nil {
			return fail("%w", err)
		}
		out.PresharedKey = psk
	}
	return out, nil
}

// presharedKey reads and parses the preshared key ref names.
func presharedKey(ref *v1alpha1.SecretKeyRef, secretLookup SecretLookup) (*wgtypes.Key, error) {
	where := fmt.Sprintf("key %q of Secret %s/%s", ref.Key, ref.Namespace, ref.Name)
	if ref.Name == "" || ref.Namespace == "" || ref.Key == "" {
		return nil, errors.New("spec.presharedKeySecretRef needs name, namespace and key")
	}
	if secretLookup == nil {
		return nil, fmt.Errorf("reading the preshared key from %s: no Secret lookup configured", where)
	}
	raw, err := secretLookup(ref.Namespace, ref.Name, ref.Key)
	if err != nil {
		return nil, fmt.Errorf("reading the preshared key from %s: %w", where, err)
	}
	psk, err := secrets.ParsePresharedKey(raw)
	if err != nil {
		return nil, fmt.Errorf("preshared key in %s: %w", where, err)
	}
	return &psk, nil
}
