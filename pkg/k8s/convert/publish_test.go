package convert

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"meshd.io/meshd/pkg/mesh"
)

func TestNodeAnnotationsRoundTrip(t *testing.T) {
	k1, k2 := testKey(t, 1), testKey(t, 2)
	pub := Published{
		PublicKey:    k1,
		Endpoint:     netip.MustParseAddrPort("[2001:db8::1]:51820"),
		InternalIPs:  addrs("10.0.0.1", "fd00::1"),
		WireGuardIPs: addrs("10.77.0.1", "fd77::1"),
		DiscoveredEndpoints: map[wgtypes.Key]netip.AddrPort{
			k2: netip.MustParseAddrPort("198.51.100.2:4000"),
		},
	}
	a := NodeAnnotations(pub)
	for k := range a {
		if k != AnnotationPublicKey && k != AnnotationEndpoint && k != AnnotationInternalIP && k != AnnotationWireGuardIP && k != AnnotationDiscoveredEndpoints && k != AnnotationHandshakes {
			t.Errorf("unexpected annotation %s", k)
		}
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: a}}
	got, errs := NodeFromObject(n, ParseOptions{})
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	want := mesh.Node{
		Name: "n1", PublicKey: k1, Endpoint: mesh.Endpoint{Addr: pub.Endpoint},
		InternalIPs: pub.InternalIPs, WireGuardIPs: pub.WireGuardIPs, DiscoveredEndpoints: pub.DiscoveredEndpoints,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
	// Rendering is deterministic.
	if !reflect.DeepEqual(a, NodeAnnotations(pub)) {
		t.Error("NodeAnnotations is not deterministic")
	}
	// Handshake times are volatile: never published, and the annotation of
	// earlier versions is removed.
	if v, ok := a[AnnotationHandshakes]; !ok || v != "" {
		t.Errorf("handshakes annotation rendered %q (present %v), want empty (removed)", v, ok)
	}
	// The zero value renders every owned annotation empty.
	for k, v := range NodeAnnotations(Published{}) {
		if v != "" {
			t.Errorf("zero Published renders %s=%q", k, v)
		}
	}
}

func TestPublishNode(t *testing.T) {
	ctx := context.Background()
	k1, k2 := testKey(t, 1), testKey(t, 2)
	base := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{
		"user.example.com/keep": "x",
		AnnotationLocation:      "eu",
	}}}
	c := fake.NewClientset(base)
	var patches [][]byte
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		if p.GetPatchType() != types.MergePatchType {
			t.Errorf("patch type %s, want merge patch", p.GetPatchType())
		}
		patches = append(patches, p.GetPatch())
		return false, nil, nil
	})
	want := NodeAnnotations(Published{PublicKey: k1, InternalIPs: addrs("10.0.0.1")})

	// First publish: only the non-empty values are written.
	changed, err := PublishNode(ctx, c, "n1", want, nil)
	if err != nil || !changed {
		t.Fatalf("first publish: changed=%v err=%v", changed, err)
	}
	assertPatch(t, patches[0], map[string]any{AnnotationPublicKey: k1.String(), AnnotationInternalIP: "10.0.0.1"})

	cur, err := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cur.Annotations["user.example.com/keep"] != "x" || cur.Annotations[AnnotationLocation] != "eu" {
		t.Errorf("foreign annotations changed: %v", cur.Annotations)
	}

	// Equal: no API call at all.
	before := len(c.Actions())
	changed, err = PublishNode(ctx, c, "n1", want, cur)
	if err != nil || changed {
		t.Fatalf("equal publish: changed=%v err=%v", changed, err)
	}
	if len(c.Actions()) != before {
		t.Errorf("equal publish made API calls: %v", c.Actions()[before:])
	}

	// One key changes, one is removed: only those are patched.
	want = NodeAnnotations(Published{PublicKey: k2})
	changed, err = PublishNode(ctx, c, "n1", want, cur)
	if err != nil || !changed {
		t.Fatalf("update publish: changed=%v err=%v", changed, err)
	}
	assertPatch(t, patches[1], map[string]any{AnnotationPublicKey: k2.String(), AnnotationInternalIP: nil})
	cur, _ = c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if _, ok := cur.Annotations[AnnotationInternalIP]; ok || cur.Annotations[AnnotationPublicKey] != k2.String() {
		t.Errorf("after update: %v", cur.Annotations)
	}

	// Keys outside meshd.io/ are refused.
	if _, err := PublishNode(ctx, c, "n1", map[string]string{"other/x": "1"}, cur); err == nil {
		t.Error("publishing a foreign annotation was accepted")
	}
	// A missing node is an error naming it.
	if _, err := PublishNode(ctx, c, "ghost", want, nil); err == nil {
		t.Error("publishing on a missing node succeeded")
	}
}

func assertPatch(t *testing.T, patch []byte, wantAnnotations map[string]any) {
	t.Helper()
	var got struct {
		Metadata struct {
			Annotations map[string]any `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &got); err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	if !reflect.DeepEqual(got.Metadata.Annotations, wantAnnotations) {
		t.Errorf("patch %s\nwant annotations %v", patch, wantAnnotations)
	}
}

func TestDiscoveredEndpointsHysteresis(t *testing.T) {
	k1, k2 := testKey(t, 1), testKey(t, 2)
	ap := netip.MustParseAddrPort
	t0 := time.Unix(1700000000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	obs := func(m ...any) map[wgtypes.Key]netip.AddrPort {
		out := map[wgtypes.Key]netip.AddrPort{}
		for i := 0; i < len(m); i += 2 {
			out[m[i].(wgtypes.Key)] = ap(m[i+1].(string))
		}
		return out
	}
	d := &DiscoveredEndpoints{Settle: 30 * time.Second, Linger: 10 * time.Minute}
	check := func(step string, got map[wgtypes.Key]netip.AddrPort, want map[wgtypes.Key]netip.AddrPort) {
		t.Helper()
		if len(want) == 0 {
			want = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: published %v, want %v", step, got, want)
		}
	}
	// First sighting: published at once (nothing to replace).
	check("first", d.Observe(at(0), obs(k1, "198.51.100.1:1000")), obs(k1, "198.51.100.1:1000"))
	// A new port: not before it has been stable for Settle.
	check("new port", d.Observe(at(10*time.Second), obs(k1, "198.51.100.1:2000")), obs(k1, "198.51.100.1:1000"))
	check("new port 20s", d.Observe(at(30*time.Second), obs(k1, "198.51.100.1:2000")), obs(k1, "198.51.100.1:1000"))
	// Flapping back and forth restarts the clock.
	check("flap", d.Observe(at(35*time.Second), obs(k1, "198.51.100.1:3000")), obs(k1, "198.51.100.1:1000"))
	check("flap again", d.Observe(at(70*time.Second), obs(k1, "198.51.100.1:2000")), obs(k1, "198.51.100.1:1000"))
	// A gap (no observation) restarts it too.
	check("gap", d.Observe(at(80*time.Second), obs()), obs(k1, "198.51.100.1:1000"))
	check("after gap", d.Observe(at(101*time.Second), obs(k1, "198.51.100.1:2000")), obs(k1, "198.51.100.1:1000"))
	// Stable for Settle: replaces.
	check("settled", d.Observe(at(131*time.Second), obs(k1, "198.51.100.1:2000")), obs(k1, "198.51.100.1:2000"))
	// No longer observed (idle link): kept for Linger after the last sighting.
	check("idle", d.Observe(at(5*time.Minute), obs(k2, "198.51.100.2:1")), obs(k1, "198.51.100.1:2000", k2, "198.51.100.2:1"))
	check("idle 10m", d.Observe(at(131*time.Second+10*time.Minute), obs(k2, "198.51.100.2:1")), obs(k2, "198.51.100.2:1"))
	check("Published", d.Published(), obs(k2, "198.51.100.2:1"))

	// Seeded from the annotation after a restart: kept while nothing is
	// observed (no write at restart), replaced only after Settle.
	d = &DiscoveredEndpoints{}
	d.Seed(at(0), obs(k1, "198.51.100.1:1000"))
	d.Seed(at(0), obs(k2, "198.51.100.2:1")) // only the first seed counts
	check("seeded", d.Observe(at(time.Second), obs()), obs(k1, "198.51.100.1:1000"))
	check("seeded change", d.Observe(at(2*time.Second), obs(k1, "198.51.100.1:5")), obs(k1, "198.51.100.1:1000"))
	check("seeded change settled", d.Observe(at(2*time.Second+DiscoveredSettle), obs(k1, "198.51.100.1:5")), obs(k1, "198.51.100.1:5"))
}

// TestLimitDiscovered: every needed endpoint is published, at most the limit
// of the others, those published already first, then by key; replaying the
// same observations in any order, with the last output as what is
// published, never changes the set.
func TestLimitDiscovered(t *testing.T) {
	key := func(i int) wgtypes.Key { return wgtypes.Key{0: byte(i >> 8), 1: byte(i)} }
	ep := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 51820)
	}
	eps := map[wgtypes.Key]netip.AddrPort{}
	for i := range 10 {
		eps[key(i)] = ep(i)
	}
	needed := func(k wgtypes.Key) bool { return k == key(7) || k == key(9) }
	has := func(got map[wgtypes.Key]netip.AddrPort, is ...int) error {
		want := map[wgtypes.Key]netip.AddrPort{}
		for _, i := range is {
			want[key(i)] = ep(i)
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("got %v, want keys %v", got, is)
		}
		return nil
	}
	for _, tc := range []struct {
		name    string
		current []int
		limit   int
		want    []int
	}{
		{"the lowest keys fill the limit, needed ones on top", nil, 3, []int{0, 1, 2, 7, 9}},
		{"published ones stay first", []int{5, 8}, 3, []int{0, 5, 8, 7, 9}},
		{"more published than the limit: the lowest of them", []int{4, 5, 6, 8}, 2, []int{4, 5, 7, 9}},
		{"no limit for others: needed only", nil, 0, []int{7, 9}},
		{"a large limit: everything", []int{3}, 64, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := map[wgtypes.Key]netip.AddrPort{}
			for _, i := range tc.current {
				cur[key(i)] = ep(i)
			}
			if err := has(LimitDiscovered(eps, needed, cur, tc.limit), tc.want...); err != nil {
				t.Error(err)
			}
		})
	}
	if got := LimitDiscovered(nil, needed, nil, DiscoveredLimit); got != nil {
		t.Errorf("nothing observed: got %v, want nil", got)
	}

	// Replays: peers come and go in random order; what is published keeps
	// every entry it still observes while the limit allows.
	rng := rand.New(rand.NewPCG(1, 2))
	var published map[wgtypes.Key]netip.AddrPort
	for round := range 200 {
		obs := map[wgtypes.Key]netip.AddrPort{}
		for _, i := range rng.Perm(100)[:40+rng.IntN(40)] {
			obs[key(i)] = ep(i)
		}
		got := LimitDiscovered(obs, nil, published, 16)
		if len(got) != min(16, len(obs)) {
			t.Fatalf("round %d: %d published of %d observed, want %d", round, len(got), len(obs), min(16, len(obs)))
		}
		for k, ap := range published {
			if _, still := obs[k]; still && got[k] != ap {
				t.Fatalf("round %d: %v was published and is still observed, but left out", round, k)
			}
		}
		published = got
	}
}
