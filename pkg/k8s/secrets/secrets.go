package secrets

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
)

// SecretGetter reads an informer's store by "namespace/name" key
// (cache.Store satisfies it).
type SecretGetter interface {
	GetByKey(key string) (any, bool, error)
}

// StaleError wraps why a value read through [PresharedKeys] is the last one
// known rather than the current one: the peer keeps working on it, and the
// problem is reported.
type StaleError struct{ Err error }

func (e *StaleError) Error() string {
	return fmt.Sprintf("%v; keeping the last known preshared key", e.Err)
}

func (e *StaleError) Unwrap() error { return e.Err }

// PresharedKeys reads Peer preshared keys from a Secret informer's store,
// never from the API server. It remembers the last valid key read for every
// reference, so a Secret that disappears, loses its key or holds a malformed
// one keeps the Peer on its last known key (Lookup returns it with a
// *StaleError to report) instead of removing the Peer. A reference never
// read successfully fails, as before. Safe for concurrent use.
type PresharedKeys struct {
	store     SecretGetter
	namespace string // "" means any namespace the store holds

	mu   sync.Mutex
	last map[string][]byte
}

// NewPresharedKeys returns a lookup over store, which holds the Secrets of
// namespace ("" for every namespace).
func NewPresharedKeys(store SecretGetter, namespace string) *PresharedKeys {
	return &PresharedKeys{store: store, namespace: namespace, last: map[string][]byte{}}
}

// Lookup is a [SecretLookup].
func (p *PresharedKeys) Lookup(namespace, name, key string) ([]byte, error) {
	v, err := p.current(namespace, name, key)
	if err == nil {
		if _, perr := ParsePresharedKey(v); perr != nil {
			err = fmt.Errorf("key %q of Secret %s/%s: %w", key, namespace, name, perr)
		}
	}
	id := namespace + "/" + name + "/" + key
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.last[id] = v
		return v, nil
	}
	if old, ok := p.last[id]; ok {
		return old, &StaleError{Err: err}
	}
	return nil, err
}

func (p *PresharedKeys) current(namespace, name, key string) ([]byte, error) {
	if p.namespace != "" && namespace != p.namespace {
		return nil, fmt.Errorf("the Secret %s/%s is not in namespace %s, the only one meshd reads Secrets from", namespace, name, p.namespace)
	}
	if p.store == nil {
		return nil, errors.New("no Secret cache configured")
	}
	o, ok, err := p.store.GetByKey(namespace + "/" + name)
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s from the cache: %w", namespace, name, err)
	}
	s, isSecret := o.(*corev1.Secret)
	if !ok || !isSecret {
		return nil, fmt.Errorf("the Secret %s/%s was not found", namespace, name)
	}
	v, ok := s.Data[key]
	if !ok {
		return nil, fmt.Errorf("the Secret %s/%s has no key %q", namespace, name, key)
	}
	return v, nil
}

// ParsePresharedKey parses a preshared key as a Secret holds it: base64
// text (surrounding white space ignored) or 32 raw bytes.
func ParsePresharedKey(raw []byte) (wgtypes.Key, error) {
	if t := bytes.TrimSpace(raw); len(t) == 44 {
		if k, err := wgtypes.ParseKey(string(t)); err == nil {
			return k, nil
		}
	}
	if len(raw) == wgtypes.KeyLen {
		return wgtypes.NewKey(raw)
	}
	return wgtypes.Key{}, fmt.Errorf("want a base64-encoded 32-byte key (as printed by wg genpsk) or 32 raw bytes, got %d bytes", len(raw))
}
