package clusterlink

import (
	"net/netip"
	"reflect"
	"testing"

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
