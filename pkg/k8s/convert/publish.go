package convert

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Published is what meshd publishes about its own node. There is
// deliberately no place for the private key.
type Published struct {
	PublicKey           wgtypes.Key
	Endpoint            netip.AddrPort
	InternalIPs         []netip.Addr
	WireGuardIPs        []netip.Addr
	DiscoveredEndpoints map[wgtypes.Key]netip.AddrPort
}

// NodeAnnotations renders pub as the annotations meshd owns. Every owned
// annotation is present in the result; an empty value means "absent" (and
// makes PublishNode remove it). Volatile data (handshake times, counters)
// is never published: it would make every node write its Node, and every
// other node receive that write, forever. The legacy meshd.io/handshakes
// annotation is therefore always rendered empty (removed once on upgrade).
func NodeAnnotations(pub Published) map[string]string {
	out := make(map[string]string, len(PublishedAnnotations()))
	for _, k := range PublishedAnnotations() {
		out[k] = ""
	}
	if pub.PublicKey != (wgtypes.Key{}) {
		out[AnnotationPublicKey] = pub.PublicKey.String()
	}
	if pub.Endpoint.IsValid() {
		out[AnnotationEndpoint] = pub.Endpoint.String()
	}
	out[AnnotationInternalIP] = joinAddrs(pub.InternalIPs)
	out[AnnotationWireGuardIP] = joinAddrs(pub.WireGuardIPs)
	if len(pub.DiscoveredEndpoints) > 0 {
		m := make(map[string]string, len(pub.DiscoveredEndpoints))
		for k, v := range pub.DiscoveredEndpoints {
			if v.IsValid() {
				m[k.String()] = v.String()
			}
		}
		if len(m) > 0 {
			b, err := json.Marshal(m) // sorted keys: stable output
			if err == nil {
				out[AnnotationDiscoveredEndpoints] = string(b)
			}
		}
	}
	return out
}

func joinAddrs(as []netip.Addr) string {
	ss := make([]string, 0, len(as))
	for _, a := range as {
		if a.IsValid() {
			ss = append(ss, a.String())
		}
	}
	return strings.Join(ss, ",")
}

// AnnotationPatch returns the JSON merge patch that makes current's
// annotations agree with want (an empty value removes the annotation; keys
// absent from want are left alone), or nil when they already agree. Every key
// of want must carry the meshd.io/ prefix.
func AnnotationPatch(want map[string]string, current map[string]string) ([]byte, error) {
	diff := map[string]any{}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if !strings.HasPrefix(k, AnnotationPrefix) {
			return nil, fmt.Errorf("refusing to publish annotation %q: not under %s", k, AnnotationPrefix)
		}
		v := want[k]
		cur, ok := current[k]
		switch {
		case v == "" && ok:
			diff[k] = nil
		case v != "" && (!ok || cur != v):
			diff[k] = v
		}
	}
	if len(diff) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": diff}})
	if err != nil {
		return nil, fmt.Errorf("encoding annotation patch: %w", err)
	}
	return b, nil
}

// PublishNode makes the meshd-owned annotations of node nodeName equal to
// want (see NodeAnnotations; an empty value removes an annotation) with one
// JSON merge patch holding only the differing keys. current is the Node as
// the caller last saw it (usually from the informer); when nil it is read
// from the API. No API call is made when nothing differs.
func PublishNode(ctx context.Context, c kubernetes.Interface, nodeName string, want map[string]string, current *corev1.Node) (changed bool, err error) {
	if current == nil {
		current, err = c.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("reading node %s to publish annotations: %w", nodeName, err)
		}
	}
	patch, err := AnnotationPatch(want, current.Annotations)
	if err != nil || patch == nil {
		return false, err
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		return false, fmt.Errorf("publishing annotations on node %s: %w", nodeName, err)
	}
	return true, nil
}

// DiscoveredLimit is how many discovered endpoints a node publishes for
// peers that do not need them (see LimitDiscovered).
const DiscoveredLimit = 64

// LimitDiscovered returns the discovered endpoints a node publishes out of
// eps: every one of a peer that needs it (needed: a node other nodes may
// reach at its discovered endpoint, see mesh.UsesDiscoveredEndpoint), and
// at most limit of the others, which only show a recent handshake (meshctl
// status). Those already published (current) come first, then the rest in
// key order, so the published set changes only when an entry is withdrawn
// or a slot frees up. Without the limit every node of a full mesh would
// publish an entry for every peer it talked to in the last minutes: at
// 1,000 nodes about 70 KB on every Node, cached and parsed by every node.
func LimitDiscovered(eps map[wgtypes.Key]netip.AddrPort, needed func(wgtypes.Key) bool, current map[wgtypes.Key]netip.AddrPort, limit int) map[wgtypes.Key]netip.AddrPort {
	var out map[wgtypes.Key]netip.AddrPort
	add := func(k wgtypes.Key, ap netip.AddrPort) {
		if out == nil {
			out = make(map[wgtypes.Key]netip.AddrPort, len(eps))
		}
		out[k] = ap
	}
	var kept, others []wgtypes.Key
	for k, ap := range eps {
		switch _, was := current[k]; {
		case needed != nil && needed(k):
			add(k, ap)
		case was:
			kept = append(kept, k)
		default:
			others = append(others, k)
		}
	}
	byKey := func(a, b wgtypes.Key) int { return bytes.Compare(a[:], b[:]) }
	slices.SortFunc(kept, byKey)
	slices.SortFunc(others, byKey)
	for _, k := range append(kept, others...) {
		if limit <= 0 {
			break
		}
		add(k, eps[k])
		limit--
	}
	return out
}

// Discovered endpoints: how long they must be stable, and how long they
// outlive their last handshake.
const (
	// DiscoveredFresh is how recent a handshake must be for its endpoint to
	// count as observed.
	DiscoveredFresh = 3 * time.Minute
	// DiscoveredSettle is how long a changed endpoint must be observed,
	// unchanged, before it replaces the one published for that peer.
	DiscoveredSettle = 30 * time.Second
	// DiscoveredLinger is how long a published endpoint stays published
	// after it was last observed (idle links stop handshaking).
	DiscoveredLinger = 10 * time.Minute
)

// DiscoveredEndpoints decides which endpoints, learned from WireGuard
// handshakes, a node publishes in meshd.io/discovered-endpoints, with
// hysteresis so that the Node is written only when an endpoint really
// changed:
//   - a peer with nothing published gets its observed endpoint at once
//     (nothing is replaced; NAT traversal needs it now);
//   - a different endpoint replaces the published one only once it has been
//     observed, unchanged, for Settle (a NAT rebinding flapping between two
//     ports, or a roaming laptop, costs no writes until it settles);
//   - a published endpoint that is no longer observed (no handshake within
//     DiscoveredFresh: an idle link, or the peer left) is withdrawn only
//     Linger after it was last observed.
//
// The zero value uses DiscoveredSettle and DiscoveredLinger. It is safe for
// concurrent use.
type DiscoveredEndpoints struct {
	Settle, Linger time.Duration

	mu        sync.Mutex
	seeded    bool
	published map[wgtypes.Key]netip.AddrPort
	seen      map[wgtypes.Key]time.Time // when published[k] was last observed
	candidate map[wgtypes.Key]discoveredCandidate
}

type discoveredCandidate struct {
	ap    netip.AddrPort
	since time.Time
}

// Seed starts from what the node published before (its annotation after a
// restart), as if observed at now; only the first Seed or Observe counts.
func (d *DiscoveredEndpoints) Seed(now time.Time, published map[wgtypes.Key]netip.AddrPort) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seeded {
		return
	}
	d.init()
	for k, ap := range published {
		if ap.IsValid() {
			d.published[k] = ap
			d.seen[k] = now
		}
	}
}

func (d *DiscoveredEndpoints) init() {
	d.seeded = true
	if d.published == nil {
		d.published = map[wgtypes.Key]netip.AddrPort{}
		d.seen = map[wgtypes.Key]time.Time{}
		d.candidate = map[wgtypes.Key]discoveredCandidate{}
	}
}

// Observe records the endpoints observed at now (peers with a handshake
// within DiscoveredFresh) and returns the endpoints to publish (a copy;
// nil when none).
func (d *DiscoveredEndpoints) Observe(now time.Time, observed map[wgtypes.Key]netip.AddrPort) map[wgtypes.Key]netip.AddrPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	settle, linger := d.Settle, d.Linger
	if settle <= 0 {
		settle = DiscoveredSettle
	}
	if linger <= 0 {
		linger = DiscoveredLinger
	}
	for k, ap := range observed {
		if !ap.IsValid() {
			continue
		}
		cur, ok := d.published[k]
		switch {
		case ok && cur == ap, !ok:
			d.published[k] = ap
			d.seen[k] = now
			delete(d.candidate, k)
		default:
			c, ok := d.candidate[k]
			if !ok || c.ap != ap {
				d.candidate[k] = discoveredCandidate{ap: ap, since: now}
				continue
			}
			if now.Sub(c.since) >= settle {
				d.published[k] = ap
				d.seen[k] = now
				delete(d.candidate, k)
			}
		}
	}
	for k := range d.candidate {
		if _, ok := observed[k]; !ok {
			delete(d.candidate, k) // a candidate must be observed without a gap
		}
	}
	for k := range d.published {
		if _, ok := observed[k]; !ok && now.Sub(d.seen[k]) >= linger {
			delete(d.published, k)
			delete(d.seen, k)
		}
	}
	return d.publishedLocked()
}

// Published returns the endpoints to publish as of the last Observe or Seed
// (a copy; nil when none).
func (d *DiscoveredEndpoints) Published() map[wgtypes.Key]netip.AddrPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.publishedLocked()
}

func (d *DiscoveredEndpoints) publishedLocked() map[wgtypes.Key]netip.AddrPort {
	if len(d.published) == 0 {
		return nil
	}
	return maps.Clone(d.published)
}
