package clusterlink

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

func remoteNode(t *testing.T, name, region, ip, pod string) *corev1.Node {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:      map[string]string{convert.DefaultTopologyLabel: region},
			Annotations: map[string]string{convert.AnnotationPublicKey: k.PublicKey().String()}},
		Spec:   corev1.NodeSpec{PodCIDRs: []string{pod}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}},
	}
}

func TestRemotePeersOnePerLeader(t *testing.T) {
	ls := LinkSettings{Name: "west", Granularity: mesh.GranularityLocation, Port: 51820,
		MeshCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}}
	nodes := []*corev1.Node{
		remoteNode(t, "w1", "a", "198.51.100.101", "10.52.1.0/24"),
		remoteNode(t, "w2", "a", "198.51.100.102", "10.52.2.0/24"),
		remoteNode(t, "w3", "b", "198.51.100.103", "10.52.3.0/24"),
	}
	peers, problems := RemotePeers(ls, nodes, mesh.RemoteGuard{Local: []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16")}})
	if len(problems) != 0 {
		t.Fatalf("unexpected problems: %v", problems)
	}
	if len(peers) != 2 {
		t.Fatalf("want one peer per location leader (2), got %d", len(peers))
	}
	if peers[0].Name != "cluster-west-w1" || peers[1].Name != "cluster-west-w3" {
		t.Fatalf("peer names: %s, %s", peers[0].Name, peers[1].Name)
	}
	has := func(p mesh.Peer, cidr string) bool {
		for _, a := range p.AllowedIPs {
			if a == netip.MustParsePrefix(cidr) {
				return true
			}
		}
		return false
	}
	if !has(peers[0], "10.52.1.0/24") || !has(peers[0], "10.52.2.0/24") {
		t.Errorf("location a's leader must carry both pod CIDRs: %v", peers[0].AllowedIPs)
	}
	if !has(peers[0], "10.97.0.0/16") || has(peers[1], "10.97.0.0/16") {
		t.Errorf("the service CIDR must go to exactly the first leader: %v / %v", peers[0].AllowedIPs, peers[1].AllowedIPs)
	}
	if peers[0].Endpoint.Addr != netip.MustParseAddrPort("198.51.100.101:51820") {
		t.Errorf("endpoint: %v", peers[0].Endpoint)
	}
}

func TestRemotePeersOverlapReported(t *testing.T) {
	ls := LinkSettings{Name: "west", Granularity: mesh.GranularityFull, Port: 51820,
		MeshCIDRs: []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}}
	nodes := []*corev1.Node{remoteNode(t, "w1", "a", "198.51.100.101", "10.42.7.0/24")}
	local := []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16"), netip.MustParsePrefix("10.42.0.0/16")}
	peers, problems := RemotePeers(ls, nodes, mesh.RemoteGuard{Local: local})
	if len(problems) != 2 {
		t.Fatalf("want the pod CIDR and the mesh IP reported as overlapping, got %v", problems)
	}
	msg := problems[0].Error() + problems[1].Error()
	for _, want := range []string{"10.42.7.0/24", "10.42.0.0/16", "10.4.0.0/16", "west"} {
		if !strings.Contains(msg, want) {
			t.Errorf("problem does not name %s: %s", want, msg)
		}
	}
	for _, p := range peers {
		for _, a := range p.AllowedIPs {
			for _, l := range local {
				if a.Overlaps(l) {
					t.Errorf("overlapping %s still routed", a)
				}
			}
		}
	}
}

func TestLinkFromSecret(t *testing.T) {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "meshd-link-west", Namespace: "meshd-system",
		Annotations: LinkSettings{Name: "west", Granularity: mesh.GranularityFull, Port: 51821,
			MeshCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16")},
			ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}, TopologyLabel: "zone"}.annotations()},
		Data: map[string][]byte{LinkKubeconfigKey: []byte("kc")}}
	ls, kc, err := LinkFromSecret(s)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Name != "west" || ls.Port != 51821 || ls.Granularity != mesh.GranularityFull || ls.TopologyLabel != "zone" ||
		len(ls.MeshCIDRs) != 1 || len(ls.ServiceCIDRs) != 1 || string(kc) != "kc" || ls.Allowed != nil {
		t.Fatalf("round trip: %+v %q", ls, kc)
	}
	// The agreed ranges round-trip; recorded but empty means nothing may be claimed.
	allowed := []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16"), netip.MustParsePrefix("198.51.100.0/24")}
	s.Data[LinkKubeconfigKey] = []byte("kc")
	s.Annotations = LinkSettings{Name: "west", Port: 51820, Allowed: allowed,
		MeshCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}}.annotations()
	if ls, _, err := LinkFromSecret(s); err != nil || len(ls.Allowed) != 2 || ls.Allowed[1] != allowed[1] {
		t.Fatalf("allowed ranges round trip: %v %v", ls.Allowed, err)
	}
	s.Annotations[AnnotationRemoteAllowedCIDRs] = ""
	if ls, _, err := LinkFromSecret(s); err != nil || ls.Allowed == nil || len(ls.Allowed) != 0 {
		t.Fatalf("empty allowed ranges: %#v %v", ls.Allowed, err)
	}
	// A cluster linked without service CIDRs (its meshd has no
	// --service-cidr) and, in an older Secret, without mesh CIDRs: no
	// service routes, meshd's default mesh CIDR.
	s.Annotations = LinkSettings{Name: "west", Port: 51820}.annotations()
	delete(s.Annotations, AnnotationRemoteMeshCIDRs)
	if ls, _, err := LinkFromSecret(s); err != nil || len(ls.ServiceCIDRs) != 0 ||
		!slices.Equal(ls.MeshCIDRs, []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}) {
		t.Fatalf("link without service and mesh CIDRs: %+v %v", ls, err)
	}
	s.Annotations[AnnotationRemoteServiceCIDRs] = "nonsense"
	delete(s.Data, LinkKubeconfigKey)
	_, _, err = LinkFromSecret(s)
	if err == nil || !strings.Contains(err.Error(), AnnotationRemoteServiceCIDRs) || !strings.Contains(err.Error(), "kubeconfig") {
		t.Fatalf("want errors naming the bad annotation and the missing kubeconfig, got %v", err)
	}
}

// The link's policy is applied through the thin conversion: a remote range
// covering a local node's underlay address or the API server, or outside the
// agreed ranges, is refused with its reason, counted and named in the Event
// reason; the rest of the link is routed.
func TestRemotePeersGuard(t *testing.T) {
	ls := LinkSettings{Name: "west", Granularity: mesh.GranularityFull, Port: 51820,
		MeshCIDRs: []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16")},
		Allowed:   []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16"), netip.MustParsePrefix("10.52.0.0/16"), netip.MustParsePrefix("198.51.100.0/24")}}
	w1 := remoteNode(t, "w1", "a", "198.51.100.101", "10.52.1.0/24")
	w1.Annotations[convert.AnnotationAllowedLocationIPs] = "203.0.113.0/24,172.16.0.0/12"
	local := []mesh.Node{{Name: "e1", InternalIPs: []netip.Addr{netip.MustParseAddr("203.0.113.7")}}}
	guard := mesh.LocalGuard(mesh.Options{}, local, convert.APIServerAddrs(&rest.Config{Host: "https://172.16.5.5:6443"})...)
	peers, problems := RemotePeers(ls, []*corev1.Node{w1}, guard)
	if len(peers) != 1 {
		t.Fatalf("peers: %v", peers)
	}
	for _, a := range peers[0].AllowedIPs {
		if a.String() == "203.0.113.0/24" || a.String() == "172.16.0.0/12" {
			t.Errorf("refused range %s routed", a)
		}
	}
	if !slices.Contains(peers[0].AllowedIPs, netip.MustParsePrefix("10.52.1.0/24")) {
		t.Errorf("agreed pod CIDR not routed: %v", peers[0].AllowedIPs)
	}
	msg := fmt.Sprint(problems)
	for _, want := range []string{"203.0.113.0/24", "underlay address of node e1", "172.16.0.0/12", "API server"} {
		if !strings.Contains(msg, want) {
			t.Errorf("problems do not name %q: %s", want, msg)
		}
	}
	if c := CountRefusals(problems); c[mesh.RefusedProtected] != 2 {
		t.Errorf("counts %v, want 2 protected", c)
	}
	if r := RefusalEventReason(problems); r != "RangeRefused" {
		t.Errorf("event reason %q", r)
	}
}

func TestAPIServerAddrs(t *testing.T) {
	for host, want := range map[string]string{
		"https://203.0.113.2:6443": "203.0.113.2", "https://[2001:db8::1]:6443": "2001:db8::1",
		"10.0.0.1:443": "10.0.0.1", "https://api.example.com": "", "": "",
	} {
		got := convert.APIServerAddrs(&rest.Config{Host: host})
		if want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0].String() != want) {
			t.Errorf("%q: %v, want %q", host, got, want)
		}
	}
}

// The token expiry comes from the annotation meshctl link records, else from
// the token's exp claim.
func TestLinkTokenExpiry(t *testing.T) {
	at := time.Date(2027, 11, 25, 9, 0, 0, 0, time.UTC)
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationLinkTokenExpires: at.Format(time.RFC3339)}}}
	if got, ok := LinkTokenExpiry(s); !ok || !got.Equal(at) {
		t.Errorf("annotation: %v %v", got, ok)
	}
	claims := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"exp":%d,"sub":"x"}`, at.Unix())))
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nusers:\n- name: r\n  user:\n    token: eyJhbGciOiJSUzI1NiJ9.%s.c2ln\n", claims)
	s = &corev1.Secret{Data: map[string][]byte{LinkKubeconfigKey: []byte(kc)}}
	if got, ok := LinkTokenExpiry(s); !ok || !got.Equal(at) {
		t.Errorf("exp claim: %v %v", got, ok)
	}
	if _, ok := LinkTokenExpiry(&corev1.Secret{Data: map[string][]byte{LinkKubeconfigKey: []byte("nonsense")}}); ok {
		t.Error("an unreadable kubeconfig has no expiry")
	}
}

// tokenKubeconfig is a kubeconfig whose users carry JWTs with the given
// claims (in user order), the current context using the first user's.
func tokenKubeconfig(claims ...string) []byte {
	kc := "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: c, user: u0}\nusers:\n"
	for i, c := range claims {
		kc += fmt.Sprintf("- name: u%d\n  user:\n    token: eyJhbGciOiJSUzI1NiJ9.%s.c2ln\n", i, base64.RawURLEncoding.EncodeToString([]byte(c)))
	}
	return []byte(kc)
}

// An expiry outside 2000-9999 is unknown: year 10000 and later cannot be
// encoded as RFC 3339, and such an exp claim in one link Secret made
// `meshctl status -o json|yaml` fail for the whole cluster ("year outside
// of range [0,9999]"). A fractional NumericDate is read (fraction dropped).
func TestLinkTokenExpiryOutOfRange(t *testing.T) {
	for _, claims := range []string{
		`{"exp":999999999999}`, `{"exp":253402300800}`, `{"exp":-1}`, `{"exp":-62135596801}`, `{"exp":0}`,
		`{"exp":946684799}`, `{"exp":1e300}`, `{"exp":-1e300}`, `{"exp":9223372036854775807}`, `{"exp":1e400}`,
		`{"exp":"1800000000"}`, `{"exp":null}`, `{}`,
	} {
		if got, ok := LinkTokenExpiry(&corev1.Secret{Data: map[string][]byte{LinkKubeconfigKey: tokenKubeconfig(claims)}}); ok {
			t.Errorf("%s: expiry %v, want unknown", claims, got)
		}
	}
	for _, v := range []string{"10000-01-01T00:00:00Z", "9999-12-31T23:30:00-01:00", "1999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "soon"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationLinkTokenExpires: v}}}
		if got, ok := LinkTokenExpiry(s); ok {
			t.Errorf("annotation %q: expiry %v, want unknown", v, got)
		}
	}
	for claims, want := range map[string]time.Time{
		`{"exp":946684800}`:          time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
		`{"exp":253402300799}`:       time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
		`{"exp":1800000000.75}`:      time.Unix(1800000000, 0),
		`{"exp":1.8e9,"iat":-5e300}`: time.Unix(1800000000, 0),
	} {
		got, ok := LinkTokenExpiry(&corev1.Secret{Data: map[string][]byte{LinkKubeconfigKey: tokenKubeconfig(claims)}})
		if !ok || !got.Equal(want) {
			t.Errorf("%s: expiry %v %v, want %v", claims, got, ok, want)
			continue
		}
		if _, err := json.Marshal(got); err != nil {
			t.Errorf("%s: %v", claims, err)
		}
	}
	// An unbelievable annotation leaves the token's claim to say.
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationLinkTokenExpires: "10000-01-01T00:00:00Z"}},
		Data:       map[string][]byte{LinkKubeconfigKey: tokenKubeconfig(`{"exp":1800000000}`)},
	}
	if got, ok := LinkTokenExpiry(s); !ok || !got.Equal(time.Unix(1800000000, 0)) {
		t.Errorf("annotation out of range, claim in range: %v %v", got, ok)
	}
}

// With several users, the expiry is the current context's user's token's,
// else the first other user's by name: the same every time.
func TestLinkTokenExpiryUserOrder(t *testing.T) {
	kc := tokenKubeconfig(`{"exp":1800000000}`, `{"exp":1700000000}`, `{"exp":1900000000}`)
	for range 20 {
		if got, ok := LinkTokenExpiry(&corev1.Secret{Data: map[string][]byte{LinkKubeconfigKey: kc}}); !ok || !got.Equal(time.Unix(1800000000, 0)) {
			t.Fatalf("expiry %v %v, want the current context's token's", got, ok)
		}
	}
	kc = tokenKubeconfig(`{}`, `{"exp":1700000000}`, `{"exp":1900000000}`)
	for range 20 {
		if got, ok := LinkTokenExpiry(&corev1.Secret{Data: map[string][]byte{LinkKubeconfigKey: kc}}); !ok || !got.Equal(time.Unix(1700000000, 0)) {
			t.Fatalf("expiry %v %v, want user u1's", got, ok)
		}
	}
}
