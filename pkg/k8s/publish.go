package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
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
	// Handshakes are the latest handshake times per peer (for meshctl status).
	Handshakes map[wgtypes.Key]time.Time
}

// NodeAnnotations renders pub as the annotations meshd owns. Every owned
// annotation is present in the result; an empty value means "absent" (and
// makes PublishNode remove it).
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
	if len(pub.Handshakes) > 0 {
		m := make(map[string]int64, len(pub.Handshakes))
		for k, v := range pub.Handshakes {
			if !v.IsZero() {
				m[k.String()] = v.Unix() / 60 * 60
			}
		}
		if len(m) > 0 {
			if b, err := json.Marshal(m); err == nil {
				out[AnnotationHandshakes] = string(b)
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
