package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// publishSettings sets meshd.io/settings on the fixture's nodes that have a
// key, as their meshd would.
func publishSettings(t *testing.T, nodes []*corev1.Node, s convert.Settings) {
	t.Helper()
	for _, n := range nodes {
		if n.Annotations[convert.AnnotationPublicKey] != "" {
			n.Annotations[convert.AnnotationSettings] = s.Encode()
		}
	}
}

func fixtureSettings() convert.Settings {
	return convert.Settings{Version: "v1", Granularity: "full", MeshCIDRs: []string{"10.77.0.0/16"}, Port: 51999,
		TopologyLabel: convert.DefaultTopologyLabel, LeaseNamespace: liveness.DefaultNamespace, LeaseDuration: "40s", ProbePort: 51821, ClusterLinks: true, ListenPort: 9477}
}

// TestPublishedSettingsUsed: without flags, meshctl computes the mesh with
// the settings the nodes publish; a flag given wins and is noted.
func TestPublishedSettingsUsed(t *testing.T) {
	kube, md := fixtureClients()
	nodes := allNodes(t, kube)
	publishSettings(t, nodes, fixtureSettings())
	updateNodes(t, kube, nodes)

	r := runMeshctl(t, kube, md, "status", "-o", "json")
	var got statusReport
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v\n%s\n%s", err, r.stdout, r.stderr)
	}
	if got.Granularity != "full" || got.Port != 51999 || strings.Join(got.MeshCIDRs, ",") != "10.77.0.0/16" || got.SettingsFrom != "published by 4 of 4 nodes" {
		t.Errorf("published settings not used: %s %d %v %q", got.Granularity, got.Port, got.MeshCIDRs, got.SettingsFrom)
	}
	// eu-1 publishes mesh IP 10.4.0.1, outside the published 10.77.0.0/16.
	if !strings.Contains(r.stderr, "outside --mesh-cidr [10.77.0.0/16]") {
		t.Errorf("stderr %q", r.stderr)
	}

	r = runMeshctl(t, kube, md, "status", "-o", "json", "--port", "51820", "--mesh-cidr", "10.4.0.0/16")
	got = statusReport{}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if got.Granularity != "full" || got.Port != 51820 || strings.Join(got.MeshCIDRs, ",") != "10.4.0.0/16" {
		t.Errorf("flags do not override: %s %d %v", got.Granularity, got.Port, got.MeshCIDRs)
	}
	if !strings.Contains(r.stderr, "--port 51820 overrides the cluster's 51999") || !strings.Contains(r.stderr, "--mesh-cidr 10.4.0.0/16 overrides the cluster's 10.77.0.0/16") {
		t.Errorf("override not noted: %q", r.stderr)
	}
}

// TestPublishedSettingsDisagree: a node whose meshd runs with other
// settings is a problem of status, naming the node and the difference; the
// majority's settings are used.
func TestPublishedSettingsDisagree(t *testing.T) {
	kube, md := healthyClients()
	nodes := allNodes(t, kube)
	s := fixtureSettings()
	s.Granularity = "location"
	publishSettings(t, nodes, s)
	odd := s
	odd.Port, odd.Version = 51000, "v2" // the version alone is no disagreement
	for _, n := range nodes {
		if n.Name == "us-1" {
			n.Annotations[convert.AnnotationSettings] = odd.Encode()
		}
		if n.Name == "eu-2" {
			v := s
			v.Version, v.MeshCIDRs = "v0", []string{"10.77.0.0/16"}
			n.Annotations[convert.AnnotationSettings] = v.Encode()
		}
	}
	nodes[4].Annotations[convert.AnnotationSettings] = "{not json"
	updateNodes(t, kube, nodes)

	r := runMeshctl(t, kube, md, "status", "-o", "json")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1: %s", r.code, r.stderr)
	}
	var got statusReport
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if got.Port != 51999 || got.SettingsFrom != "published by 3 of 4 nodes" {
		t.Errorf("majority not used: port %d, %q", got.Port, got.SettingsFrom)
	}
	want := []string{
		"node/us-3: ignoring meshd.io/settings=",
		"node/us-1: meshd runs with other settings than 3 of 4 nodes (eu-1,eu-2,us-2): port 51000 vs 51999",
	}
	joined := strings.Join(got.Problems, "\n")
	for _, w := range want {
		if !strings.Contains(joined, w) {
			t.Errorf("problems lack %q:\n%s", w, joined)
		}
	}
	if len(got.Problems) != 2 {
		t.Errorf("problems: %q", got.Problems)
	}
}

func TestSettingsDifferences(t *testing.T) {
	a := fixtureSettings()
	b := a
	b.MeshCIDRs = []string{"fd00:4::/64", "10.77.0.0/16"}
	a.MeshCIDRs = []string{"10.77.0.0/16", "fd00:4::/64"}
	b.Interface, b.ListenPort, b.Version = "wg9", 1, "other"
	if d := a.Differences(b); len(d) != 0 {
		t.Errorf("order, interface, listen and version count: %q", d)
	}
	b.LeaseDuration, b.ClusterLinks = "1m0s", false
	if d := strings.Join(a.Differences(b), "; "); d != "lease-duration 40s vs 1m0s; cluster-links true vs false" {
		t.Errorf("differences %q", d)
	}
	got, err := convert.ParseSettings(a.Encode())
	if err != nil || got.Encode() != a.Encode() {
		t.Errorf("round trip: %v %+v", err, got)
	}
}

func allNodes(t *testing.T, kube *kubefake.Clientset) []*corev1.Node {
	t.Helper()
	var out []*corev1.Node
	for _, name := range []string{"eu-1", "eu-2", "us-1", "us-2", "us-3"} {
		out = append(out, mustNode(t, kube, name).DeepCopy())
	}
	return out
}

func updateNodes(t *testing.T, kube *kubefake.Clientset, nodes []*corev1.Node) {
	t.Helper()
	for _, n := range nodes {
		if err := kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLinkUsesPublishedSettings: meshctl link takes each cluster's mesh and
// service CIDRs, granularity and port from what its nodes publish when the
// flags are not given, and refuses clusters whose published ranges overlap.
func TestLinkUsesPublishedSettings(t *testing.T) {
	east, md := fixtureClients()
	nodes := allNodes(t, east)
	se := fixtureSettings()
	se.Granularity, se.MeshCIDRs, se.ServiceCIDRs, se.Port = "location", []string{"10.4.0.0/16"}, []string{"10.96.0.0/12"}, 51820
	publishSettings(t, nodes, se)
	updateNodes(t, east, nodes)
	sw := fixtureSettings()
	sw.MeshCIDRs, sw.ServiceCIDRs = []string{"10.5.0.0/16"}, []string{"10.112.0.0/12"}
	west := kubefake.NewClientset(node(nodeSpec{name: "w-1", region: "w", internal: "192.168.9.1", pod: "10.9.0.0/24", key: 30,
		ann: map[string]string{convert.AnnotationSettings: sw.Encode()}}))
	for i, k := range []*kubefake.Clientset{east, west} {
		if _, err := k.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "meshd-system"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		k.PrependReactor("create", "serviceaccounts", func(a clienttesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() != "token" {
				return false, nil, nil
			}
			return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{Token: fmt.Sprintf("tok-%d", i), ExpirationTimestamp: metav1.NewTime(now.Add(time.Hour))}}, nil
		})
	}
	clusters := map[string]*kubefake.Clientset{"k1": east, "k2": west}
	link := func(args ...string) result {
		return runMeshctlWith(t, east, md, func(e *env) {
			e.newClients = func(kubeconfig, _ string) (*connect.Clients, error) {
				return &connect.Clients{Kube: clusters[kubeconfig], Meshd: md, Config: &rest.Config{Host: "https://" + kubeconfig + ".example:6443"}}, nil
			}
		}, append([]string{"link", "--from-kubeconfig", "k1", "--from-name", "east", "--to-kubeconfig", "k2", "--to-name", "west", "--insecure-skip-tls-verify"}, args...)...)
	}
	r := link()
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	// West's Secret describes east, east's describes west.
	for _, c := range []struct {
		k                       *kubefake.Clientset
		secret, mesh, svc, gran string
	}{{west, "meshd-link-east", "10.4.0.0/16", "10.96.0.0/12", "location"}, {east, "meshd-link-west", "10.5.0.0/16", "10.112.0.0/12", "full"}} {
		s, err := c.k.CoreV1().Secrets("meshd-system").Get(context.Background(), c.secret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a := s.Annotations; a[clusterlink.AnnotationRemoteMeshCIDRs] != c.mesh || a[clusterlink.AnnotationRemoteServiceCIDRs] != c.svc || a[clusterlink.AnnotationRemoteGranularity] != c.gran {
			t.Errorf("%s: %v", c.secret, a)
		}
	}
	if s, _ := east.CoreV1().Secrets("meshd-system").Get(context.Background(), "meshd-link-west", metav1.GetOptions{}); s.Annotations[clusterlink.AnnotationRemotePort] != "51999" {
		t.Errorf("west's published port not recorded: %v", s.Annotations)
	}

	// West publishing east's mesh CIDR: refused once the settings are read.
	sw.MeshCIDRs = []string{"10.4.0.0/16"}
	w := mustNode(t, west, "w-1").DeepCopy()
	w.Annotations[convert.AnnotationSettings] = sw.Encode()
	updateNodes(t, west, []*corev1.Node{w})
	if r := link(); r.code != 1 || !strings.Contains(r.stderr, "10.4.0.0/16 of east overlaps 10.4.0.0/16 of west") {
		t.Errorf("overlapping published ranges: exit %d, %s", r.code, r.stderr)
	}
	// A flag given wins.
	if r := link("--to-mesh-cidr", "10.6.0.0/16"); r.code != 0 {
		t.Errorf("--to-mesh-cidr given: exit %d, %s", r.code, r.stderr)
	}
}
