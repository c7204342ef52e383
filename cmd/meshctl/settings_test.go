package main

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"meshd.io/meshd/pkg/k8s"
)

// publishSettings sets meshd.io/settings on the fixture's nodes that have a
// key, as their meshd would.
func publishSettings(t *testing.T, nodes []*corev1.Node, s k8s.Settings) {
	t.Helper()
	for _, n := range nodes {
		if n.Annotations[k8s.AnnotationPublicKey] != "" {
			n.Annotations[k8s.AnnotationSettings] = s.Encode()
		}
	}
}

func fixtureSettings() k8s.Settings {
	return k8s.Settings{Version: "v1", Granularity: "full", MeshCIDRs: []string{"10.77.0.0/16"}, Port: 51999,
		TopologyLabel: k8s.DefaultTopologyLabel, LeaseNamespace: k8s.DefaultNamespace, LeaseDuration: "40s", ProbePort: 51821, ClusterLinks: true, ListenPort: 9477}
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
			n.Annotations[k8s.AnnotationSettings] = odd.Encode()
		}
		if n.Name == "eu-2" {
			v := s
			v.Version, v.MeshCIDRs = "v0", []string{"10.77.0.0/16"}
			n.Annotations[k8s.AnnotationSettings] = v.Encode()
		}
	}
	nodes[4].Annotations[k8s.AnnotationSettings] = "{not json"
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
	got, err := k8s.ParseSettings(a.Encode())
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
