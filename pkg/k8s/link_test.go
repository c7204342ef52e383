package k8s

import (
	"net/netip"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
			Labels:      map[string]string{DefaultTopologyLabel: region},
			Annotations: map[string]string{AnnotationPublicKey: k.PublicKey().String()}},
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
	peers, problems := RemotePeers(ls, nodes, []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16")})
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
	peers, problems := RemotePeers(ls, nodes, local)
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
		len(ls.MeshCIDRs) != 1 || len(ls.ServiceCIDRs) != 1 || string(kc) != "kc" {
		t.Fatalf("round trip: %+v %q", ls, kc)
	}
	s.Annotations[AnnotationRemoteServiceCIDRs] = "nonsense"
	delete(s.Data, LinkKubeconfigKey)
	_, _, err = LinkFromSecret(s)
	if err == nil || !strings.Contains(err.Error(), AnnotationRemoteServiceCIDRs) || !strings.Contains(err.Error(), "kubeconfig") {
		t.Fatalf("want errors naming the bad annotation and the missing kubeconfig, got %v", err)
	}
}
