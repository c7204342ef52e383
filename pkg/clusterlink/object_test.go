package clusterlink

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
)

// The mesh CIDRs of a link come from its ClusterLink's spec; an entry that
// does not parse is skipped.
func TestRemoteFromObjectMeshCIDRs(t *testing.T) {
	cl := &v1alpha1.ClusterLink{Spec: v1alpha1.ClusterLinkSpec{MeshCIDRs: []string{"10.5.0.0/16", "bad", "fd00::/64"}}}
	got := RemoteFromObject(cl).Link.MeshCIDRs
	want := []netip.Prefix{netip.MustParsePrefix("10.5.0.0/16"), netip.MustParsePrefix("fd00::/64")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("RemoteFromObject(...).Link.MeshCIDRs = %v, want %v", got, want)
	}
}

// A leader of a ClusterLink's status is read only as something this
// cluster can configure: an endpoint with a zone (it names a link of the
// writer's, and matches no allowed IP, so a range covering it would not be
// refused) or a keepalive outside 0-65535 s makes that leader unusable,
// said in the Remote's error; allowed IPs are taken masked.
func TestRemoteFromObjectLeaderChecks(t *testing.T) {
	key := "YPbD2Qm1Pq8nJCr7uqQH2VoHGeTwE6xbm9Qy5cxTiW0="
	leader := func(mod func(*v1alpha1.ClusterLinkLeader)) *v1alpha1.ClusterLink {
		l := v1alpha1.ClusterLinkLeader{Name: "c2-a", PublicKey: key, Endpoint: "192.0.2.10:51820", AllowedIPs: []string{"10.9.0.1/16"}}
		mod(&l)
		return &v1alpha1.ClusterLink{ObjectMeta: metav1.ObjectMeta{Name: "c2"}, Status: v1alpha1.ClusterLinkStatus{Leaders: []v1alpha1.ClusterLinkLeader{l}}}
	}
	r := RemoteFromObject(leader(func(*v1alpha1.ClusterLinkLeader) {}))
	if r.Err != nil || len(r.Leaders) != 1 || r.Leaders[0].AllowedIPs[0] != netip.MustParsePrefix("10.9.0.0/16") {
		t.Fatalf("a good leader: %+v (err %v), want it with 10.9.0.0/16", r.Leaders, r.Err)
	}
	for _, c := range []struct {
		name, want string
		mod        func(*v1alpha1.ClusterLinkLeader)
	}{
		{"endpoint with a zone", "zone", func(l *v1alpha1.ClusterLinkLeader) { l.Endpoint = "[fe80::1%eth0]:51820" }},
		{"negative keepalive", "keepalive", func(l *v1alpha1.ClusterLinkLeader) { l.PersistentKeepalive = -5 }},
		{"keepalive over 65535 s", "keepalive", func(l *v1alpha1.ClusterLinkLeader) { l.PersistentKeepalive = 70000 }},
	} {
		r := RemoteFromObject(leader(c.mod))
		if len(r.Leaders) != 0 || r.Err == nil || !strings.Contains(r.Err.Error(), c.want) {
			t.Errorf("%s: leaders %+v, error %v; want none, an error naming the %s", c.name, r.Leaders, r.Err, c.want)
		}
	}
}
