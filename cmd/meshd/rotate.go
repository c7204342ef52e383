package main

import (
	"errors"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/wg"
)

// Key rotation (docs/security.md, "Key rotation"): meshd.io/rotate-key with
// a new value on this node's Node (meshctl rotate-key NODE) rotates its
// WireGuard key in two reconciles, each started by the watch:
//
//  1. prepare: the next private key is generated and stored beside the
//     current one (wg.LoadOrCreateNextKey: private-key.next, 0600), and its
//     public key is published as meshd.io/next-public-key.
//  2. switch, once this node's cache shows that annotation (the API server
//     holds it, so the switch can be published): the device gets the next
//     key, the Node gets it as meshd.io/public-key (next-public-key removed,
//     meshd.io/rotated-key set to the request), then the key file is
//     committed (private-key.next renamed over private-key: the old private
//     key is gone from disk).
//
// Peers need nothing beforehand: they replace the old key's peer by the new
// one as soon as they see the new public key (the node update skips the
// reconcile coalescer), the new peer taking over the allowed IPs before the
// old one is removed (pkg/wg). Until then this node's packets wait in
// WireGuard's per-peer queue (its handshakes as the new key are not yet
// answered) and the peers' packets still arrive on the old sessions, which
// stay valid for receiving; once a peer has switched, its handshake to the
// new key releases the queue. Nothing is dropped, it is delayed by the
// peers' reaction time. Staging the next key as a peer without allowed IPs
// ahead of time would do worse: a handshake from it would succeed and its
// packets would then be dropped by cryptokey routing until the allowed IPs
// moved.
//
// A restart in the middle resumes: the next key is read back from its file;
// if the Node already shows it as the public key (meshd stopped between the
// publish and the commit), the rotation is committed, else it continues.
// If the switch cannot be published, the device goes back to the old key
// and the switch is retried: the peers never lose a key they use.

// rotationSwitch is a switch in progress within one reconcile.
type rotationSwitch struct {
	old, next wgtypes.Key
	request   string // meshd.io/rotate-key, recorded in meshd.io/rotated-key
}

// rotationBefore runs at the start of a reconcile, before the plan: it
// commits a rotation the Node shows as published, prepares a requested one,
// and starts the switch of a prepared one whose next key the Node shows. On
// a switch it returns the switch with r.key already the next key.
func (r *reconciler) rotationBefore(self *corev1.Node) (*rotationSwitch, error) {
	if self == nil {
		return nil, nil
	}
	ann := self.Annotations
	request := ann[convert.AnnotationRotateKey]
	if r.stateDir == "" {
		if request != "" && request != ann[convert.AnnotationRotatedKey] && !r.rotationWarned {
			r.rotationWarned = true
			r.log.Warn("key rotation requested but meshd has no --state-dir to keep the next key in; ignored")
		}
		return nil, nil
	}
	if r.nextKey == (wgtypes.Key{}) && request != "" && request != ann[convert.AnnotationRotatedKey] {
		next, err := wg.LoadOrCreateNextKey(r.stateDir)
		if err != nil {
			return nil, fmt.Errorf("preparing the key rotation: %w", err)
		}
		r.nextKey = next
		r.log.Info("key rotation: next key stored; publishing it before the switch", "request", request, "public_key", r.key.PublicKey(), "next_public_key", next.PublicKey())
		return nil, nil
	}
	if r.nextKey == (wgtypes.Key{}) {
		return nil, nil
	}
	pub := r.nextKey.PublicKey().String()
	switch {
	case ann[convert.AnnotationPublicKey] == pub:
		// Published but not committed (meshd stopped in between, or the
		// commit failed): finish.
		r.log.Info("key rotation: the Node already shows the next key; committing it", "public_key", pub)
		old := r.key
		r.setKey(r.nextKey)
		if err := r.rotationCommit(old, request); err != nil {
			return nil, err
		}
		return nil, nil
	case ann[convert.AnnotationNextPublicKey] == pub:
		sw := &rotationSwitch{old: r.key, next: r.nextKey, request: request}
		r.setKey(r.nextKey)
		return sw, nil
	}
	return nil, nil // prepared; the switch waits for the published next key
}

// rotationAnnotations are the rotation annotations to publish (added to
// convert.NodeAnnotations): the next public key while one is prepared, and the
// completed request on a switch.
func (r *reconciler) rotationAnnotations(sw *rotationSwitch) map[string]string {
	out := map[string]string{convert.AnnotationNextPublicKey: ""}
	if sw != nil {
		if sw.request != "" {
			out[convert.AnnotationRotatedKey] = sw.request
		}
		return out
	}
	if r.nextKey != (wgtypes.Key{}) && r.nextKey != r.key {
		out[convert.AnnotationNextPublicKey] = r.nextKey.PublicKey().String()
	}
	return out
}

// rotationExecuted adds the prepare's error to the reconcile's and, if the
// WireGuard write of a switch failed, abandons the switch before anything of
// the new key is published (the next reconcile retries it).
func (r *reconciler) rotationExecuted(sw *rotationSwitch, errs []error, prepare error) (*rotationSwitch, []error) {
	if prepare != nil {
		errs = append(errs, prepare)
	}
	if sw == nil {
		return nil, errs
	}
	if i := slices.IndexFunc(errs, func(e error) bool { return errors.Is(e, errConfigureWireGuard) }); i >= 0 {
		r.rotationAbort(sw, errs[i])
		return nil, errs
	}
	return sw, errs
}

// rotationPublished ends a switch after the publish: the key file is
// committed, or, when the publish failed (the peers may not know the new
// key), the device goes back to the old key at once.
func (r *reconciler) rotationPublished(plan *mesh.Plan, sw *rotationSwitch, published error) error {
	if sw == nil {
		return nil
	}
	if published == nil {
		return r.rotationCommit(sw.old, sw.request)
	}
	r.rotationAbort(sw, published)
	if err := r.device.Set(wireGuardConfig(plan, r.key, r.mtu)); err != nil {
		return fmt.Errorf("%w: %w", errConfigureWireGuard, err)
	}
	return nil
}

// rotationUnfinished abandons a switch that a reconcile left before its
// publish (snapshot or plan failed): the old key stays.
func (r *reconciler) rotationUnfinished(sw *rotationSwitch, err error) {
	if sw != nil && r.key == sw.next && r.nextKey == sw.next {
		r.rotationAbort(sw, err)
	}
}

// rotationAbort puts the old key back after a switch that could not be
// applied or published.
func (r *reconciler) rotationAbort(sw *rotationSwitch, why error) {
	r.setKey(sw.old)
	r.log.Warn("key rotation: switch not completed; keeping the old key and retrying", "error", why)
}

// rotationCommit makes the switched-to key the stored one and reports it.
func (r *reconciler) rotationCommit(old wgtypes.Key, request string) error {
	if err := wg.CommitNextKey(r.stateDir, r.key); err != nil {
		return err
	}
	r.nextKey = wgtypes.Key{}
	r.metrics.keyRotations.Inc()
	r.log.Info("key rotation: done", "request", request, "old_public_key", old.PublicKey(), "public_key", r.key.PublicKey())
	if r.events != nil {
		ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: r.node, UID: types.UID(r.node)}
		r.events.Eventf(ref, corev1.EventTypeNormal, "KeyRotated", "WireGuard key rotated: public key %s replaces %s", r.key.PublicKey(), old.PublicKey())
	}
	return nil
}

func newKeyRotationsCounter(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "meshd_key_rotations_total", Help: "Completed rotations of this node's WireGuard key (meshd.io/rotate-key, meshctl rotate-key).",
	})
	reg.MustRegister(c)
	return c
}
