package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	meshdfake "meshd.io/meshd/pkg/k8s/client/clientset/versioned/fake"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
)

func linkSecret(cluster string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: clusterlink.LinkSecretPrefix + cluster, Namespace: "meshd-system",
			Labels: map[string]string{clusterlink.LabelClusterLink: "true"},
			Annotations: map[string]string{
				clusterlink.AnnotationRemoteCluster:      cluster,
				clusterlink.AnnotationRemoteServiceCIDRs: "10.112.0.0/12",
				clusterlink.AnnotationRemoteMeshCIDRs:    "10.8.0.0/16",
			},
		},
		Data: map[string][]byte{clusterlink.LinkKubeconfigKey: []byte("kubeconfig of " + cluster)},
	}
}

// statusWithLinks runs meshctl status over the fixture plus the given local
// objects, with remote clusters served by remotes (by kubeconfig content).
func statusWithLinks(t *testing.T, local []runtime.Object, remotes map[string]*kubefake.Clientset, react func(*kubefake.Clientset)) result {
	t.Helper()
	nodes, leases, peers := fixture()
	kube, md := kubefake.NewClientset(append(append(nodes, leases...), local...)...), meshdfake.NewSimpleClientset(peers...)
	if react != nil {
		react(kube)
	}
	return runMeshctlWith(t, kube, md, func(e *env) {
		e.remoteClients = func(kc []byte) (*connect.Clients, error) {
			cluster := strings.TrimPrefix(string(kc), "kubeconfig of ")
			r, ok := remotes[cluster]
			if !ok {
				return nil, fmt.Errorf("no fake cluster %q", cluster)
			}
			return &connect.Clients{Kube: r, Config: &rest.Config{Host: "https://" + cluster + ".example:6443"}}, nil
		}
	}, "status")
}

func TestStatusShowsLinkedClusters(t *testing.T) {
	// eu-1 (leader of eu) discovered c2's leader's endpoint: a recent handshake.
	nodes, _, _ := fixture()
	eu1 := nodes[0].(*corev1.Node)
	eu1.Annotations[convert.AnnotationDiscoveredEndpoints] = fmt.Sprintf(`{%q: "198.51.100.9:51820"}`, pub(20).String())
	c2 := kubefake.NewClientset(
		node(nodeSpec{name: "c2-a", region: "x", internal: "192.168.9.1", external: "198.51.100.9", pod: "10.9.0.0/24", key: 20}),
		// Its pod range overlaps eu-1's: reported, not routed.
		node(nodeSpec{name: "c2-b", region: "y", internal: "192.168.9.2", external: "198.51.100.10", pod: "10.1.0.0/25", key: 21}),
	)
	down := kubefake.NewClientset()
	down.PrependReactor("list", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 198.51.100.99:6443: connect: connection refused")
	})
	s2, s3 := linkSecret("c2"), linkSecret("c3")
	s2.Annotations[clusterlink.AnnotationLinkTokenExpires] = now.Add(30 * 24 * time.Hour).UTC().Format(time.RFC3339)
	s3.Annotations[clusterlink.AnnotationLinkTokenExpires] = now.Add(-time.Hour).UTC().Format(time.RFC3339)
	r := statusWithLinks(t, []runtime.Object{s2, s3}, map[string]*kubefake.Clientset{"c2": c2, "c3": down},
		func(kube *kubefake.Clientset) {
			// Replace eu-1 with the copy carrying the handshake.
			if _, err := kube.CoreV1().Nodes().Update(context.Background(), eu1, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		})
	// Problems (the fixture's, the overlap, the unreadable c3): exit 1.
	if r.code != 1 || !strings.Contains(r.stderr, "status lists 4 problems") {
		t.Fatalf("exit %d, stderr %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"LINKED CLUSTERS",
		"- linked cluster c3 (Secret meshd-link-c3) not readable: cluster c3: listing its Nodes: ",
		"c2       meshd-link-c2  https://c2.example:6443  10.112.0.0/12",
		"cluster-c2-c2-a,cluster-c2-c2-b",
		"c3       meshd-link-c3  https://c3.example:6443",
		"cluster c3: listing its Nodes: ",
		"eu-1  cluster c2: cluster-c2-c2-a",
		"cluster c2: 10.1.0.0/25 (via c2-b) overlaps local range 10.1.0.0/24: not routed",
		"TOKEN EXPIRES",
		now.Add(30*24*time.Hour).UTC().Format(time.RFC3339) + " (in 30d)",
		now.Add(-time.Hour).UTC().Format(time.RFC3339) + " (EXPIRED: meshctl link --refresh)",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, r.stdout)
		}
	}
	// The recent handshake is on eu-1's link to c2-a.
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(l, "eu-1") && strings.Contains(l, "cluster-c2-c2-a") && !strings.HasSuffix(strings.TrimSpace(l), recentHandshake) {
			t.Errorf("link line %q: want a recent handshake (%s)", l, recentHandshake)
		}
	}
}

func TestStatusLinkSecretsForbidden(t *testing.T) {
	r := statusWithLinks(t, nil, nil, func(kube *kubefake.Clientset) {
		kube.PrependReactor("list", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), "", errors.New("no"))
		})
	})
	if r.code != 1 || !strings.Contains(r.stderr, "linked clusters not shown: not allowed to list Secrets in namespace meshd-system") {
		t.Errorf("code %d stderr %q", r.code, r.stderr)
	}
	if strings.Contains(r.stdout, "LINKED CLUSTERS") || !strings.Contains(r.stdout, "WIREGUARD LINKS") {
		t.Errorf("status without links:\n%s", r.stdout)
	}
}

// TestStatusShowsClusterLinks: with the link controller, status shows its
// ClusterLinks (what the nodes peer with) and lists a link that is not
// synced or not reachable as a problem; without the CRD there is no section.
func TestStatusShowsClusterLinks(t *testing.T) {
	cond := func(typ string, st metav1.ConditionStatus, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: st, Reason: "Test", Message: msg}
	}
	ok := &v1alpha1.ClusterLink{ObjectMeta: metav1.ObjectMeta{Name: "c2"}, Status: v1alpha1.ClusterLinkStatus{
		Leaders:    []v1alpha1.ClusterLinkLeader{{Name: "c2-a"}, {Name: "c2-b"}},
		Conditions: []metav1.Condition{cond(clusterlink.ConditionSynced, metav1.ConditionTrue, ""), cond(clusterlink.ConditionReachable, metav1.ConditionTrue, "")},
	}}
	down := &v1alpha1.ClusterLink{ObjectMeta: metav1.ObjectMeta{Name: "c3"}, Status: v1alpha1.ClusterLinkStatus{
		Leaders: []v1alpha1.ClusterLinkLeader{{Name: "c3-a"}},
		Conditions: []metav1.Condition{cond(clusterlink.ConditionSynced, metav1.ConditionTrue, ""),
			cond(clusterlink.ConditionReachable, metav1.ConditionFalse, "cluster c3: connection refused; last known leaders kept")},
	}}
	nodes, leases, peers := fixture()
	kube := kubefake.NewClientset(append(nodes, leases...)...)
	md := meshdfake.NewSimpleClientset(append(peers, ok, down)...)
	r := runMeshctlWith(t, kube, md, nil, "status")
	for _, want := range []string{
		"CLUSTER LINKS (link controller)",
		"c2    True    True       c2-a,c2-b",
		"c3    True    False      c3-a            cluster c3: connection refused; last known leaders kept",
		"- cluster link c3 (link controller): synced True, reachable False: cluster c3: connection refused; last known leaders kept",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "cluster link c2 ") {
		t.Errorf("a synced, reachable link listed as a problem:\n%s", r.stdout)
	}
	j := runMeshctlWith(t, kube, md, nil, "status", "-o", "json")
	if !strings.Contains(j.stdout, `"clusterLinks": [`) || !strings.Contains(j.stdout, `"reachable": "False"`) {
		t.Errorf("json lacks the cluster links:\n%s", j.stdout)
	}

	// No CRD (the link controller is not installed): no section, no note.
	md2 := meshdfake.NewSimpleClientset(peers...)
	md2.PrependReactor("list", "clusterlinks", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(v1alpha1.Resource("clusterlinks"), "")
	})
	r = runMeshctlWith(t, kube, md2, nil, "status")
	if strings.Contains(r.stdout, "CLUSTER LINKS") || strings.Contains(r.stderr, "cluster links") {
		t.Errorf("cluster links shown without the CRD:\nstdout %s\nstderr %s", r.stdout, r.stderr)
	}
}

// TestAPIServerAddrs: meshctl protects the API server as the nodes do, the
// address it dials and the endpoints of the EndpointSlice default/kubernetes;
// without the slice (or the right to read it), the first alone.
func TestAPIServerAddrs(t *testing.T) {
	cfg := &rest.Config{Host: "https://10.96.0.1:443"}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"203.0.113.2"}}},
	}
	ctx := context.Background()
	if got := fmt.Sprint(apiServerAddrs(ctx, &connect.Clients{Kube: kubefake.NewClientset(slice), Config: cfg})); got != "[10.96.0.1 203.0.113.2]" {
		t.Errorf("with the slice: %s", got)
	}
	if got := fmt.Sprint(apiServerAddrs(ctx, &connect.Clients{Kube: kubefake.NewClientset(), Config: cfg})); got != "[10.96.0.1]" {
		t.Errorf("without the slice: %s", got)
	}
}

// meshctl status reads every link Secret's kubeconfig to show the linked
// clusters; whoever may write a Secret in the namespace must not get a
// command run on the machine of the operator running it: an exec
// credential plugin is refused (and said), never run.
func TestStatusRefusesLinkExecPlugin(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	kc := `apiVersion: v1
kind: Config
clusters:
- name: c9
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
contexts:
- name: c9
  context: {cluster: c9, user: u}
current-context: c9
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      interactiveMode: Never
      command: /bin/sh
      args: ["-c", "touch ` + marker + `; echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"x\"}}'"]
`
	s := linkSecret("c9")
	s.Data[clusterlink.LinkKubeconfigKey] = []byte(kc)
	nodes, leases, peers := fixture()
	kube := kubefake.NewClientset(append(append(nodes, leases...), s)...)
	r := runMeshctlWith(t, kube, meshdfake.NewSimpleClientset(peers...), nil, "status")
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("meshctl status ran the exec credential plugin of link Secret %s; stderr:\n%s", s.Name, r.stderr)
	}
	if out := r.stdout + r.stderr; !strings.Contains(out, "exec credential plugin") {
		t.Errorf("the refusal is not shown:\n%s", out)
	}
}

// A link Secret whose token carries an exp claim past year 9999 (and no
// meshd.io/link-token-expires) made `meshctl status -o json|yaml` fail for
// the whole cluster: "Time.MarshalJSON: year outside of range [0,9999]".
// Such an expiry is unknown.
func TestStatusStructuredAbsurdTokenExpiry(t *testing.T) {
	for _, exp := range []string{"999999999999", "-99999999999"} {
		payload := base64.RawURLEncoding.EncodeToString([]byte(`{"exp":` + exp + `}`))
		kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://c9.example:6443\"}\nusers:\n- name: u\n  user: {token: \"x." + payload + ".y\"}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
		s := linkSecret("c9")
		s.Data[clusterlink.LinkKubeconfigKey] = []byte(kc)
		nodes, leases, peers := fixture()
		kube := kubefake.NewClientset(append(append(nodes, leases...), s)...)
		for _, format := range []string{"json", "yaml"} {
			r := runMeshctlWith(t, kube, meshdfake.NewSimpleClientset(peers...), func(e *env) {
				e.remoteClients = func([]byte) (*connect.Clients, error) {
					return &connect.Clients{Kube: kubefake.NewClientset(), Config: &rest.Config{Host: "https://c9.example:6443"}}, nil
				}
			}, "status", "-o", format)
			var st statusReport
			if err := yaml.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.LinkedClusters) != 1 {
				t.Fatalf("exp %s, -o %s: exit %d, %v, stdout %q, stderr %q", exp, format, r.code, err, r.stdout, r.stderr)
			}
			if lc := st.LinkedClusters[0]; lc.Name != "c9" || lc.TokenExpires != nil || lc.TokenExpired {
				t.Errorf("exp %s, -o %s: linked cluster %+v, want c9 with an unknown expiry", exp, format, lc)
			}
		}
	}
}
