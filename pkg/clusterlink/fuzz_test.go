package clusterlink

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// fuzzKeyText is a deterministic key's base64 text.
func fuzzKeyText(i int) string { return wgtypes.Key(sha256.Sum256([]byte{byte(i)})).String() }

// checkEndpoint checks that e is empty, an IP endpoint with a port, or a
// DNS name with a port.
func checkEndpoint(t *testing.T, e mesh.Endpoint) {
	t.Helper()
	if e.IsZero() {
		return
	}
	a := e.Addr.Addr()
	if e.Host != "" {
		if a.IsValid() || e.Addr.Port() == 0 {
			t.Errorf("DNS endpoint %q has address %v", e.Host, e.Addr)
		}
		return
	}
	if e.Addr.Port() == 0 || a.Is4In6() || a.Zone() != "" {
		t.Errorf("endpoint %v is not usable", e.Addr)
	}
}

// fuzzReader hands out the fuzzer's bytes one decision at a time (zero once
// they run out).
type fuzzReader []byte

func (b *fuzzReader) n(m int) int {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return int(c) % m
}

// remoteNodes decodes a linked cluster's nodes: names, regions, keys,
// internal and external IPs of both families, pod CIDRs and published mesh
// IPs from small universes, so that overlaps with the local ranges are
// frequent.
func remoteNodes(data []byte) []*corev1.Node {
	b := fuzzReader(data)
	var nodes []*corev1.Node
	for range b.n(6) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("w%d", b.n(5)),
			Labels:      map[string]string{convert.DefaultTopologyLabel: []string{"a", "b", ""}[b.n(3)]},
			Annotations: map[string]string{},
		}}
		if k := b.n(5); k > 0 {
			n.Annotations[convert.AnnotationPublicKey] = fuzzKeyText(k)
		}
		v4 := func() string { return fmt.Sprintf("10.%d.%d.%d", []int{4, 42, 43, 96}[b.n(4)], b.n(3), b.n(4)) }
		v6 := func() string { return fmt.Sprintf("fd%02x::%x", []int{0x4e, 0x42, 0x43, 0x96}[b.n(4)], b.n(4)) }
		if b.n(2) == 1 {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: v4()})
		}
		if b.n(2) == 1 {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: v6()})
		}
		if b.n(3) == 0 {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: fmt.Sprintf("198.51.100.%d", b.n(4))})
		}
		for range b.n(3) {
			if b.n(2) == 0 {
				n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, v4()+"/"+strconv.Itoa([]int{16, 24, 32, 8}[b.n(4)]))
			} else {
				n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, v6()+"/"+strconv.Itoa([]int{64, 112, 128, 16}[b.n(4)]))
			}
		}
		if b.n(2) == 1 {
			n.Annotations[convert.AnnotationWireGuardIP] = v4()
		}
		if b.n(3) == 0 {
			n.Annotations[convert.AnnotationAllowedLocationIPs] = v4() + "/24"
		}
		if b.n(4) == 0 {
			n.Annotations[convert.AnnotationLeader] = "true"
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// FuzzLinkFromSecret reads a link Secret with fuzzed annotations, then
// computes the linked cluster's peers from fuzzed remote nodes. A read
// Secret's settings written back as annotations read the same; no remote
// peer's allowed IP overlaps a local range, the remote service CIDRs go to
// at most one peer, and every peer is usable.
func FuzzLinkFromSecret(f *testing.F) {
	f.Add("west", "10.97.0.0/16", "location", "10.5.0.0/16", "", "51820", []byte("kubeconfig"), []byte{3, 0, 0, 1, 1, 1, 0, 2, 1, 1, 1, 1, 1, 0, 1, 1, 2, 0, 1, 1, 1, 3, 1, 1, 1}, "10.42.0.0/16,10.96.0.0/12,10.4.0.0/16")
	f.Add("east", "10.96.0.0/12,fd96::/108", "full", "10.4.0.0/16,fd4e::/64", "zone", "4000", []byte("k"), []byte("\x05some nodes with overlapping pod CIDRs and keys"), "10.42.0.0/16,fd42::/48,10.96.0.0/12")
	f.Add("", "", "", "", "", "0", []byte(nil), []byte{}, "")
	f.Add("x", "bad", "mesh", "10.4.0.0/31,fd00::/127", "", "65536", []byte("k"), []byte{1, 1, 1, 1}, "0.0.0.0/0")
	f.Fuzz(func(t *testing.T, cluster, services, granularity, meshCIDRs, topology, port string, kubeconfig, nodeBytes []byte, localRanges string) {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "meshd", Name: LinkSecretPrefix + "x", Annotations: map[string]string{}},
			Data:       map[string][]byte{LinkKubeconfigKey: kubeconfig},
		}
		for k, v := range map[string]string{
			AnnotationRemoteCluster: cluster, AnnotationRemoteServiceCIDRs: services, AnnotationRemoteGranularity: granularity,
			AnnotationRemoteMeshCIDRs: meshCIDRs, AnnotationRemoteTopologyLabel: topology, AnnotationRemotePort: port,
		} {
			if v != "" {
				s.Annotations[k] = v
			}
		}
		ls, kc, err := LinkFromSecret(s)
		if err != nil {
			if kc != nil {
				t.Errorf("error %v with a kubeconfig", err)
			}
		} else {
			if !bytes.Equal(kc, kubeconfig) || len(kc) == 0 {
				t.Errorf("kubeconfig %q, want %q", kc, kubeconfig)
			}
			// Written back as GrantLink writes it, it reads the same.
			s2 := s.DeepCopy()
			s2.Annotations = ls.annotations()
			ls2, _, err := LinkFromSecret(s2)
			if err != nil {
				t.Fatalf("settings %+v written back do not read: %v", ls, err)
			}
			if !reflect.DeepEqual(ls, ls2) {
				t.Fatalf("read, write, read: %+v became %+v", ls, ls2)
			}
		}
		if ls.Port < 1 || ls.Port > 65535 || len(ls.MeshCIDRs) == 0 || ls.Granularity == "" || ls.TopologyLabel == "" {
			t.Errorf("settings not defaulted: %+v", ls)
		}

		var local []netip.Prefix
		for _, r := range strings.Split(localRanges, ",") {
			if p, err := netip.ParsePrefix(strings.TrimSpace(r)); err == nil {
				local = append(local, p.Masked())
			}
		}
		nodes := remoteNodes(nodeBytes)
		peers, problems := RemotePeers(ls, nodes, mesh.RemoteGuard{Local: local})
		for _, p := range problems {
			if p == nil || !strings.Contains(p.Error(), ls.Name) {
				t.Errorf("problem %v does not name cluster %q", p, ls.Name)
			}
		}
		withServices := 0
		names := map[string]bool{}
		for _, p := range peers {
			if p.PublicKey == (wgtypes.Key{}) || len(p.AllowedIPs) == 0 || !strings.HasPrefix(p.Name, "cluster-"+ls.Name+"-") || names[p.Name] {
				t.Errorf("unusable or duplicate peer %+v", p)
			}
			names[p.Name] = true
			checkEndpoint(t, p.Endpoint)
			hasService := false
			for _, a := range p.AllowedIPs {
				for _, l := range local {
					if a.Overlaps(l) {
						t.Errorf("peer %s: allowed IP %v overlaps local range %v", p.Name, a, l)
					}
				}
				for _, svc := range ls.ServiceCIDRs {
					hasService = hasService || a == svc
				}
			}
			if hasService {
				withServices++
			}
		}
		if withServices > 1 {
			t.Errorf("the remote service CIDRs go to %d peers", withServices)
		}
	})
}
