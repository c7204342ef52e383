//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/e2e/testbed"
)

// installBaseManifests applies exactly what `kubectl apply -k manifests`
// installs (the DaemonSet and the link controller's Deployment too: nothing
// runs them, the testbed has no controllers) and takes away what the testbed
// adds on top of it (the RoleBinding an older cluster-links component gave
// nodes, if present). Cleanup deletes the admission policy, its binding and
// the workloads and restores the testbed's RBAC, so later scenarios (which
// use a token bound to no Pod) are unaffected.
func (s *scenario) installBaseManifests() {
	t := s.t
	t.Helper()
	manifests := filepath.Join(tb.RepoRoot, "manifests")
	rendered := render(t, filepath.Join(tb.KubeDir, "kubectl"), "kustomize", manifests)
	for _, want := range []string{"kind: ValidatingAdmissionPolicy\n", "kind: ValidatingAdmissionPolicyBinding\n", "kind: DaemonSet\n",
		// Pod hardening: the runtime's seccomp profile, metrics and probes
		// on the node's own address only, no Secret enumeration.
		"seccompProfile:\n          type: RuntimeDefault\n", "- --listen=[$(HOST_IP)]:9477\n", "fieldPath: status.hostIP\n",
		// The link controller is the one holder of link credentials, under
		// a ServiceAccount of its own.
		"kind: Deployment\n", "serviceAccountName: meshd-link\n"} {
		if !strings.Contains(string(rendered), want) {
			t.Fatalf("kubectl kustomize manifests/ renders no %q", strings.TrimSpace(want))
		}
	}
	if strings.Contains(string(rendered), "--listen=:") {
		t.Fatalf("kubectl kustomize manifests/: meshd listens on every address of the host")
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, args := range [][]string{
			{"delete", "--ignore-not-found", "validatingadmissionpolicybinding.admissionregistration.k8s.io/meshd-node-self"},
			{"delete", "--ignore-not-found", "validatingadmissionpolicy.admissionregistration.k8s.io/meshd-node-self"},
			{"delete", "--ignore-not-found", "-n", testbed.LeaseNamespace, "daemonset/meshd"},
			{"delete", "--ignore-not-found", "-n", testbed.LeaseNamespace, "deployment/meshd-link"},
			{"apply", "-f", filepath.Join(manifests, testbed.ClusterLinksRBAC)},
		} {
			if out, err := tb.Kubectl(ctx, args...); err != nil {
				t.Errorf("cleanup: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	})
	if out, err := tb.Kubectl(s.ctx, "delete", "--ignore-not-found", "-n", testbed.LeaseNamespace, "rolebinding/meshd-cluster-links", "role/meshd-cluster-links"); err != nil {
		t.Fatalf("removing the testbed's cluster-links RBAC: %v\n%s", err, out)
	}
	if out, err := kubectlIn(t, rendered, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -k manifests: %v\n%s", err, out)
	}
}

// boundKubeconfig creates a Pod of the meshd ServiceAccount assigned to node
// (spec.nodeName; nothing runs it), requests a token bound to that Pod, as
// the kubelet does for a DaemonSet Pod, and writes a kubeconfig with it.
func (s *scenario) boundKubeconfig(node string) string {
	t := s.t
	t.Helper()
	pods := tb.Kube.CoreV1().Pods(testbed.LeaseNamespace)
	name := "meshd-trust-" + node
	p, err := pods.Create(s.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName: "meshd",
			NodeName:           node,
			Containers:         []corev1.Container{{Name: "meshd", Image: "ghcr.io/meshd/meshd:0.1.0"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Pod %s on %s: %v", name, node, err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = tb.Kube.CoreV1().Pods(testbed.LeaseNamespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	exp := int64(3600)
	tr, err := tb.Kube.CoreV1().ServiceAccounts(testbed.LeaseNamespace).CreateToken(s.ctx, "meshd", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &exp,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token bound to Pod %s: %v", name, err)
	}
	// The API server says which identity the token carries.
	rev, err := tb.Kube.AuthenticationV1().TokenReviews().Create(s.ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenReview: %v", err)
	}
	if got := rev.Status.User.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != node {
		t.Fatalf("token bound to Pod %s on %s carries node-name %v (extra %v); the admission policy needs it", name, node, got, rev.Status.User.Extra)
	}
	t.Logf("token of Pod %s: user %s, node-name %v", name, rev.Status.User.Username, rev.Status.User.Extra["authentication.kubernetes.io/node-name"])
	return s.kubeconfigWithToken(node, tr.Status.Token)
}

// kubeconfigWithToken writes a copy of the admin kubeconfig whose user is token.
func (s *scenario) kubeconfigWithToken(name, token string) string {
	t := s.t
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(tb.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.Token, a.Username, a.Password, a.ClientCertificateData, a.ClientKeyData = token, "", "", nil, nil
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeFrom is a client of the testbed's API server with kubeconfig's identity.
func kubeFrom(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dial = testbed.NetnsDialer("/run/netns/" + tb.CPNS)
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// statusOf is the HTTP status code of a request's outcome.
func statusOf(err error) int {
	if err == nil {
		return 200
	}
	if st, ok := err.(apierrors.APIStatus); ok {
		return int(st.Status().Code)
	}
	return -1
}

// patchNode merge-patches node's metadata with meta, as kube; it returns the
// HTTP status and the error text.
func patchNode(ctx context.Context, kube kubernetes.Interface, node string, meta map[string]map[string]any) (int, error) {
	var parts []string
	for field, kv := range meta {
		var kvs []string
		for k, v := range kv {
			if v == nil {
				kvs = append(kvs, fmt.Sprintf("%q:null", k))
			} else {
				kvs = append(kvs, fmt.Sprintf("%q:%q", k, v))
			}
		}
		parts = append(parts, fmt.Sprintf("%q:{%s}", field, strings.Join(kvs, ",")))
	}
	patch := fmt.Sprintf(`{"metadata":{%s}}`, strings.Join(parts, ","))
	_, err := kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return statusOf(err), err
}

// renewLease bumps renewTime of Lease name as kube (retrying conflicts with
// meshd's own heartbeat); it returns the HTTP status of the update.
func renewLease(ctx context.Context, kube kubernetes.Interface, name string) (int, error) {
	for i := 0; ; i++ {
		l, err := kube.CoordinationV1().Leases(testbed.LeaseNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return statusOf(err), err
		}
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		_, err = kube.CoordinationV1().Leases(testbed.LeaseNamespace).Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && i < 5 {
			continue
		}
		return statusOf(err), err
	}
}

// TestNodeCredentials: under exactly what `kubectl apply -k manifests`
// installs, meshd runs on two nodes with ServiceAccount tokens bound to a Pod
// on each (as a DaemonSet Pod's token is) and the mesh works; node n1's
// token may write its own Node's meshd.io/* annotations and its own Lease,
// and is denied (HTTP 403) every write to n2, any non-meshd change to its
// own Node, other Leases and listing Secrets. A meshd token bound to no Pod
// may not write at all.
func TestNodeCredentials(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.installBaseManifests()
	s.location("a", false)
	s.location("b", false)
	n1 := s.node(testbed.NodeOptions{Name: "n1", Location: "a"})
	n2 := s.node(testbed.NodeOptions{Name: "n2", Location: "b"})
	kc := map[string]string{n1.Name: s.boundKubeconfig(n1.Name), n2.Name: s.boundKubeconfig(n2.Name)}

	// The policy is in force once the API server's policy cache has it:
	// wait until a harmless cross-node write is refused (one that landed
	// before is removed by the admin) before anything else.
	a := kubeFrom(t, kc[n1.Name])
	harmless := map[string]map[string]any{"annotations": {"meshd.io/trust-probe": "1"}}
	s.eventually(30*time.Second, 250*time.Millisecond, "the admission policy refuses n1 patching n2", func() error {
		if code, err := patchNode(ctx, a, n2.Name, harmless); code != 403 {
			return fmt.Errorf("HTTP %d (%v)", code, err)
		}
		return nil
	})
	if code, err := patchNode(ctx, tb.Kube, n2.Name, map[string]map[string]any{"annotations": {"meshd.io/trust-probe": nil}}); code != 200 {
		t.Fatalf("admin removing the probe annotation: HTTP %d (%v)", code, err)
	}
	probe := map[string]map[string]any{"annotations": {"meshd.io/force-endpoint": "198.51.100.250:51820"}}

	// The mesh works with these credentials (cluster links on, as in the
	// DaemonSet: the nodes read ClusterLinks, never a link Secret).
	for _, n := range []*testbed.Node{n1, n2} {
		if err := n.StartMeshd("--kubeconfig", kc[n.Name], "--listen", "0.0.0.0:9477"); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []*testbed.Node{n1, n2} {
		if err := n.WaitMeshdReady(ctx, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	pairs([]*testbed.Node{n1, n2}, func(x, y *testbed.Node) { s.pingEventually(pod(x), pod(y).IP, 60*time.Second) })
	pairs([]*testbed.Node{n1, n2}, func(x, y *testbed.Node) { s.pingOK(pod(x), pod(y).IP, 3) })
	for _, n := range []*testbed.Node{n1, n2} {
		s.pubKey(n) // published by meshd itself, through the policy
		s.eventually(30*time.Second, 500*time.Millisecond, "heartbeat Lease of "+n.Name, func() error {
			l, err := tb.Kube.CoordinationV1().Leases(testbed.LeaseNamespace).Get(ctx, "meshd-"+n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.RenewTime == nil {
				return fmt.Errorf("lease not renewed yet")
			}
			return nil
		})
	}

	type check struct {
		what string
		do   func() (int, error)
		want int
	}
	checks := []check{
		{"n1 patches n2's meshd.io/force-endpoint", func() (int, error) { return patchNode(ctx, a, n2.Name, probe) }, 403},
		{"n1 patches n2's public key", func() (int, error) {
			return patchNode(ctx, a, n2.Name, map[string]map[string]any{"annotations": {testbed.AnnotationPublicKey: randomKey()}})
		}, 403},
		{"n1 renews n2's Lease", func() (int, error) { return renewLease(ctx, a, "meshd-"+n2.Name) }, 403},
		{"n1 creates a Lease that is not its own", func() (int, error) {
			_, err := a.CoordinationV1().Leases(testbed.LeaseNamespace).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "meshd-n3"}}, metav1.CreateOptions{})
			return statusOf(err), err
		}, 403},
		{"n1 lists Secrets in " + testbed.LeaseNamespace, func() (int, error) {
			_, err := a.CoreV1().Secrets(testbed.LeaseNamespace).List(ctx, metav1.ListOptions{})
			return statusOf(err), err
		}, 403},
		{"n1 lists Secrets of all namespaces", func() (int, error) {
			_, err := a.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return statusOf(err), err
		}, 403},
		{"n1 changes a label of its own Node", func() (int, error) {
			return patchNode(ctx, a, n1.Name, map[string]map[string]any{"labels": {testbed.LabelRegion: "b"}})
		}, 403},
		{"n1 adds a non-meshd annotation to its own Node", func() (int, error) {
			return patchNode(ctx, a, n1.Name, map[string]map[string]any{"annotations": {"example.com/trust": "x"}})
		}, 403},
		{"n1 claims more ranges for itself (meshd.io/allowed-location-ips)", func() (int, error) {
			return patchNode(ctx, a, n1.Name, map[string]map[string]any{"annotations": {"meshd.io/allowed-location-ips": "172.16.0.0/12"}})
		}, 403},
		{"n1 redirects its own endpoint (meshd.io/force-endpoint)", func() (int, error) {
			return patchNode(ctx, a, n1.Name, map[string]map[string]any{"annotations": {"meshd.io/force-endpoint": "198.51.100.250:51820"}})
		}, 403},
		{"n1 writes a meshd.io annotation of its own Node", func() (int, error) {
			return patchNode(ctx, a, n1.Name, map[string]map[string]any{"annotations": {"meshd.io/trust-e2e": "1"}})
		}, 200},
		{"n1 removes that annotation again", func() (int, error) {
			return patchNode(ctx, a, n1.Name, map[string]map[string]any{"annotations": {"meshd.io/trust-e2e": nil}})
		}, 200},
		{"n1 renews its own Lease", func() (int, error) { return renewLease(ctx, a, "meshd-"+n1.Name) }, 200},
		{"n1 reads n2's Lease (every node reads every heartbeat)", func() (int, error) {
			_, err := a.CoordinationV1().Leases(testbed.LeaseNamespace).Get(ctx, "meshd-"+n2.Name, metav1.GetOptions{})
			return statusOf(err), err
		}, 200},
	}
	if _, err := os.Stat(tb.MeshdKubeconfig); err == nil {
		unbound := kubeFrom(t, tb.MeshdKubeconfig)
		checks = append(checks, check{"a meshd token bound to no Pod patches n1's meshd.io annotation", func() (int, error) {
			return patchNode(ctx, unbound, n1.Name, map[string]map[string]any{"annotations": {"meshd.io/trust-e2e": "1"}})
		}, 403})
	}
	for _, c := range checks {
		code, err := c.do()
		if code != c.want {
			t.Errorf("%s: HTTP %d, want %d (%v)", c.what, code, c.want, err)
		} else {
			t.Logf("%s: HTTP %d (%v)", c.what, code, err)
		}
	}
	// n2's Node is as meshd on n2 published it, and the mesh still works.
	if obj, err := tb.NodeObject(ctx, n2.Name); err != nil {
		t.Fatal(err)
	} else if v, ok := obj.Annotations["meshd.io/force-endpoint"]; ok {
		t.Errorf("n2 has meshd.io/force-endpoint=%q: a refused patch landed", v)
	}
	pairs([]*testbed.Node{n1, n2}, func(x, y *testbed.Node) { s.pingOK(pod(x), pod(y).IP, 3) })

	// A Peer's preshared key still reaches meshd (Secret get in
	// meshd-peers is where the base RBAC lets nodes read Secrets), and no key leaks.
	psk, laptop := randomKey(), randomKey()
	if _, err := tb.Kube.CoreV1().Secrets(testbed.PeerSecretNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "trust-psk"}, Data: map[string][]byte{"psk": []byte(psk)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tb.Kube.CoreV1().Secrets(testbed.PeerSecretNamespace).Delete(context.Background(), "trust-psk", metav1.DeleteOptions{})
	})
	if _, err := tb.Dynamic.Resource(testbed.PeerGVR).Create(ctx, peerObject("trust-laptop", map[string]any{
		"publicKey": laptop, "allowedIPs": []any{"10.5.0.1/32"},
		"presharedKeySecretRef": map[string]any{"namespace": testbed.PeerSecretNamespace, "name": "trust-psk", "key": "psk"},
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*testbed.Node{n1, n2} {
		s.eventually(30*time.Second, 500*time.Millisecond, "the Peer with its preshared key on "+n.Name, func() error {
			d, err := n.WG(ctx, "meshd0")
			if err != nil {
				return err
			}
			p := d.Peer(laptop)
			if p == nil {
				return fmt.Errorf("no peer %s", laptop)
			}
			if p.PresharedKey != psk {
				return fmt.Errorf("peer %s has another preshared key", laptop)
			}
			return nil
		})
	}
	// meshctl diagnose and check (meshd's debug endpoints, through the node
	// proxy) show that the Peer has a preshared key, never the key; the
	// settings meshd published passed the admission policy.
	diag, _, code := s.meshctlAdmin("diagnose", n1.Name)
	if code != 0 || !strings.Contains(diag, "preshared key (not shown)") || !strings.Contains(diag, `"clusterLinks":true`) {
		t.Errorf("meshctl diagnose %s: exit %d\n%s", n1.Name, code, diag)
	}
	diagJSON, _, _ := s.meshctlAdmin("diagnose", n2.Name, "-o", "json")
	checked, _, code := s.meshctlAdmin("check", "-o", "json")
	if code != 0 {
		t.Errorf("meshctl check: exit %d\n%s", code, checked)
	}
	s.assertNoKeyLeaked([]string{psk}, diag, diagJSON, checked)
	// Peer status: each node writes only its own entry (peerstatus_trust_test.go).
	checkPeerStatusTrust(s, kc[n1.Name], n1, n2, "trust-laptop")
}

// TestLinkTrust: two clusters linked with `meshctl link` (agreed ranges: pod
// CIDR, node network, mesh and service CIDRs). Cluster 2's leader then
// claims a range outside the agreement and one covering cluster 1's API
// server: cluster 1 refuses both (Warning Event on the ClusterLink, metric by
// reason, not in any WireGuard peer) while cross-cluster traffic goes on. The
// link token's expiry is a metric and in `meshctl status`; `meshctl link
// --refresh` renews the token and the link keeps working.
func TestLinkTrust(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	b := s.twoClusters(false)
	s.link(b)
	s.crossPing(b, 90*time.Second)

	sec, err := tb.Kube.CoreV1().Secrets(testbed.LeaseNamespace).Get(ctx, "meshd-link-cluster2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster 2 may claim %s", sec.Annotations["meshd.io/remote-allowed-cidrs"])
	for _, want := range []string{b.c2.PodCIDR(), "198.51.100.0/24", c2MeshCIDR, c2ServiceCIDR} {
		if !strings.Contains(sec.Annotations["meshd.io/remote-allowed-cidrs"], want) {
			t.Errorf("link Secret's agreed ranges lack %s: %q", want, sec.Annotations["meshd.io/remote-allowed-cidrs"])
		}
	}
	expires1 := sec.Annotations["meshd.io/link-token-expires"]

	l2 := s.leaderOf(b.two)
	const outside, apiRange = "172.16.0.0/24", "203.0.113.0/24" // 203.0.113.2 is cluster 1's API server
	if code, err := patchNode(ctx, b.c2.Kube, l2.Name, map[string]map[string]any{"annotations": {"meshd.io/allowed-location-ips": outside + "," + apiRange}}); code != 200 {
		t.Fatalf("annotating %s: HTTP %d (%v)", l2.Name, code, err)
	}
	s.eventually(60*time.Second, time.Second, "an Event on ClusterLink cluster2 naming both refused ranges", func() error {
		evs, err := linkEvents(ctx, tb.Kube, "cluster2")
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Reason == "RangeRefused" && strings.Contains(e.Message, outside) && strings.Contains(e.Message, "outside the ranges agreed") &&
				strings.Contains(e.Message, apiRange) && strings.Contains(e.Message, "API server") {
				t.Logf("Event %s/%s: %s", e.Type, e.Reason, e.Message)
				return nil
			}
		}
		return fmt.Errorf("%d Events, none RangeRefused naming %s and %s", len(evs), outside, apiRange)
	})
	l1 := s.leaderOf(b.one)
	s.eventually(30*time.Second, time.Second, "meshd_cluster_link_refused_ranges on "+l1.Name, func() error {
		m, err := l1.Metrics(ctx)
		if err != nil {
			return err
		}
		for _, want := range []string{
			`meshd_cluster_link_refused_ranges{cluster="cluster2",reason="not-agreed"} 1`,
			`meshd_cluster_link_refused_ranges{cluster="cluster2",reason="protected"} 1`,
			`meshd_cluster_link_refused_ranges{cluster="cluster2",reason="overlap"} 0`,
			`meshd_cluster_link_token_expiry_timestamp_seconds{cluster="cluster2"}`,
		} {
			if !strings.Contains(m, want) {
				return fmt.Errorf("metrics lack %q", want)
			}
		}
		return nil
	})
	d, err := l1.WG(ctx, "meshd0")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Peers {
		if contains(p.AllowedIPs, outside) || contains(p.AllowedIPs, apiRange) {
			t.Errorf("%s routes a refused range to peer %s: %v", l1.Name, p.PublicKey, p.AllowedIPs)
		}
	}
	// Everything else is unaffected.
	s.crossPing(b, 30*time.Second)
	for _, n := range b.one {
		if err := n.WaitMeshdReady(ctx, 10*time.Second); err != nil {
			t.Errorf("%s: %v", n.Name, err)
		}
	}

	// The token's expiry in meshctl status; --refresh renews it.
	st := s.admin(b, `meshctl --kubeconfig $KUBECONFIG1 status || [ $? -eq 1 ]` /* exit 1: problems listed; the output is checked */)
	if !strings.Contains(st, "TOKEN EXPIRES") || !strings.Contains(st, expires1) {
		t.Errorf("meshctl status does not show the token expiry %s", expires1)
	}
	time.Sleep(1100 * time.Millisecond) // expiries have second resolution
	out := s.admin(b, `meshctl link --refresh --from-kubeconfig $KUBECONFIG1 --from-name cluster1 --to-kubeconfig $KUBECONFIG2 --to-name cluster2`)
	if strings.Count(out, "renewed the token") != 2 {
		t.Errorf("meshctl link --refresh: %s", out)
	}
	sec2, err := tb.Kube.CoreV1().Secrets(testbed.LeaseNamespace).Get(ctx, "meshd-link-cluster2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if e2 := sec2.Annotations["meshd.io/link-token-expires"]; e2 <= expires1 || bytes.Equal(sec2.Data["kubeconfig"], sec.Data["kubeconfig"]) ||
		sec2.Annotations["meshd.io/remote-allowed-cidrs"] != sec.Annotations["meshd.io/remote-allowed-cidrs"] {
		t.Errorf("after --refresh: expiry %s (was %s), agreed ranges %q (was %q), token changed: %v", e2, expires1,
			sec2.Annotations["meshd.io/remote-allowed-cidrs"], sec.Annotations["meshd.io/remote-allowed-cidrs"], !bytes.Equal(sec2.Data["kubeconfig"], sec.Data["kubeconfig"]))
	}
	s.crossPing(b, 60*time.Second)
	s.assertNoKeyLeaked(nil, st, out)
}

// assertNoKeyLeaked fails the test if any node's WireGuard private key (or a
// key in keys: preshared keys, private keys rotated away), base64 or hex,
// appears in a meshd log, an Event or a Node annotation of the testbed's
// clusters, a node's metrics, or one of outputs (meshctl output of the run).
// It returns how many places it read.
func (s *scenario) assertNoKeyLeaked(keys []string, outputs ...string) int {
	t := s.t
	t.Helper()
	secrets := map[string]string{} // encoded form -> what
	addKey := func(what, b64 string) {
		k, err := wgtypes.ParseKey(strings.TrimSpace(b64))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		secrets[k.String()] = what
		secrets[hex.EncodeToString(k[:])] = what + " (hex)"
	}
	for _, n := range tb.Nodes() {
		b, err := os.ReadFile(filepath.Join(n.Dir, "state", "private-key"))
		if err != nil {
			continue // meshd never ran there
		}
		addKey("the private key of "+n.Name, string(b))
	}
	for i, k := range keys {
		addKey(fmt.Sprintf("secret key %d of the test", i), k)
	}
	if len(secrets) == 0 {
		t.Fatal("no private key found to look for")
	}
	var places []struct{ what, text string }
	add := func(what, text string) { places = append(places, struct{ what, text string }{what, text}) }
	for _, n := range tb.Nodes() {
		if b, err := os.ReadFile(n.MeshdLog()); err == nil {
			add("meshd log of "+n.Name, string(b))
		}
		if n.Meshd() != nil && !n.Meshd().Exited() {
			if m, err := n.Metrics(s.ctx); err == nil {
				add("metrics of "+n.Name, m)
			}
		}
	}
	kubes := map[string]kubernetes.Interface{"cluster 1": tb.Kube}
	for _, c := range tb.Clusters() {
		kubes["cluster "+c.Name] = c.Kube
	}
	for name, k := range kubes {
		evs, err := k.CoreV1().Events("").List(s.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			add("Event "+e.Namespace+"/"+e.Name+" in "+name, e.Message+" "+e.Reason)
		}
		nodes, err := k.CoreV1().Nodes().List(s.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes.Items {
			add("annotations of Node "+n.Name+" in "+name, fmt.Sprint(n.Annotations))
		}
	}
	for i, o := range outputs {
		add(fmt.Sprintf("meshctl output %d", i), o)
	}
	for _, p := range places {
		for enc, what := range secrets {
			if strings.Contains(p.text, enc) {
				t.Errorf("%s leaks %s", p.what, what)
			}
		}
	}
	t.Logf("no private or preshared key in %d logs, Events, annotations, metrics and outputs (%d keys looked for)", len(places), len(secrets)/2)
	return len(places)
}
