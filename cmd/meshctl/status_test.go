package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	meshdfake "meshd.io/meshd/pkg/k8s/client/clientset/versioned/fake"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
)

// TestStatusStructured: -o json and -o yaml carry the table's data, and the
// problems still make the exit code 1.
func TestStatusStructured(t *testing.T) {
	for _, format := range []string{"json", "yaml"} {
		kube, md := fixtureClients()
		r := runMeshctl(t, kube, md, "status", "-o", format)
		if r.code != 1 || !strings.Contains(r.stderr, "status lists 2 problems") {
			t.Fatalf("-o %s: exit %d, stderr %q", format, r.code, r.stderr)
		}
		var got statusReport
		var err error
		if format == "json" {
			err = json.Unmarshal([]byte(r.stdout), &got)
		} else {
			err = yaml.UnmarshalStrict([]byte(r.stdout), &got)
		}
		if err != nil {
			t.Fatalf("-o %s: %v\n%s", format, err, r.stdout)
		}
		if got.Cluster != server || got.Granularity != "location" || got.Port != 51820 || strings.Join(got.MeshCIDRs, ",") != "10.4.0.0/16" {
			t.Errorf("-o %s: header %+v", format, got)
		}
		if len(got.Nodes) != 5 {
			t.Fatalf("-o %s: %d nodes, want 5", format, len(got.Nodes))
		}
		eu1, us2, us3 := got.Nodes[0], got.Nodes[3], got.Nodes[4]
		if eu1.Name != "eu-1" || !eu1.Leader || eu1.Endpoint != "203.0.113.1:51820" || strings.Join(eu1.MeshIPs, ",") != "10.4.0.1" || !eu1.PublicKey || eu1.Live == nil || !*eu1.Live {
			t.Errorf("-o %s: eu-1 %+v", format, eu1)
		}
		if us2.Name != "us-2" || us2.Leader || us2.Live == nil || *us2.Live {
			t.Errorf("-o %s: us-2 (stale Lease) %+v", format, us2)
		}
		if us3.Name != "us-3" || us3.PublicKey || us3.Live != nil || len(us3.MeshIPs) != 0 {
			t.Errorf("-o %s: us-3 (no key, no Lease) %+v", format, us3)
		}
		if len(got.Locations) != 2 || got.Locations[0].Location != "eu" || got.Locations[0].Leader != "eu-1" || got.Locations[1].Leader != "us-1" {
			t.Errorf("-o %s: locations %+v", format, got.Locations)
		}
		if len(got.Peers) != 3 || got.Peers[0].Name != "broken" || got.Peers[0].Usable ||
			got.Peers[1].Name != "laptop" || !got.Peers[1].Usable || got.Peers[1].PersistentKeepalive != 25 ||
			got.Peers[2].Endpoint != "vpn.office.example:51821 (192.0.2.10:51821)" {
			t.Errorf("-o %s: peers %+v", format, got.Peers)
		}
		if len(got.Links) != 6 || got.Links[0] != (statusLink{From: "eu-1", To: "us-1 (location us)", RecentHandshake: true}) ||
			got.Links[1] != (statusLink{From: "eu-1", To: "peer laptop"}) {
			t.Errorf("-o %s: links %+v", format, got.Links)
		}
		if len(got.LinkedClusters) != 0 {
			t.Errorf("-o %s: linked clusters %+v", format, got.LinkedClusters)
		}
		if len(got.Problems) != 2 || !strings.HasPrefix(got.Problems[0], "node/us-2: ") || !strings.HasPrefix(got.Problems[1], "peer/broken: ") {
			t.Errorf("-o %s: problems %q", format, got.Problems)
		}
	}
}

// healthyClients is the fixture without its problems: no malformed
// annotation, no broken Peer.
func healthyClients() (*kubefake.Clientset, *meshdfake.Clientset) {
	nodes, leases, peers := fixture()
	delete(nodes[3].(*corev1.Node).Annotations, convert.AnnotationPersistentKeepalive)
	var good []runtime.Object
	for _, p := range peers {
		if p.(*v1alpha1.Peer).Name != "broken" {
			good = append(good, p)
		}
	}
	return kubefake.NewClientset(append(nodes, leases...)...), fixtureMeshd(good)
}

func TestStatusHealthyExitsZero(t *testing.T) {
	kube, md := healthyClients()
	r := runMeshctl(t, kube, md, "status", "-o", "json")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	var got statusReport
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if got.Problems == nil || len(got.Problems) != 0 || len(got.Nodes) != 5 {
		t.Errorf("problems %#v, %d nodes", got.Problems, len(got.Nodes))
	}
	if !strings.Contains(r.stdout, `"problems": []`) {
		t.Errorf("an empty problem list must be [] for scripts, got:\n%s", r.stdout)
	}
	r = runMeshctl(t, kube, md, "status")
	if r.code != 0 || strings.Contains(r.stdout, "PROBLEMS") || !strings.Contains(r.stdout, "WIREGUARD LINKS") {
		t.Errorf("table: exit %d, stdout:\n%s", r.code, r.stdout)
	}
}

// TestStatusWait: --wait reads again until the problems are gone; the
// broken Peer disappears on the third read.
func TestStatusWait(t *testing.T) {
	kube, md := fixtureClients()
	us2 := mustNode(t, kube, "us-2")
	delete(us2.Annotations, convert.AnnotationPersistentKeepalive)
	if err := kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), us2, ""); err != nil {
		t.Fatal(err)
	}
	reads := 0
	md.PrependReactor("list", "peers", func(clienttesting.Action) (bool, runtime.Object, error) {
		reads++
		if reads == 3 {
			if err := md.Tracker().Delete(v1alpha1.SchemeGroupVersion.WithResource("peers"), "", "broken"); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	fast := func(e *env) { e.pollInterval = time.Millisecond }
	r := runMeshctlWith(t, kube, md, fast, "status", "--wait", "1m", "-o", "yaml")
	if r.code != 0 || reads != 3 {
		t.Fatalf("exit %d after %d reads, stderr %q", r.code, reads, r.stderr)
	}
	if strings.Count(r.stderr, "waiting up to 1m0s: status lists 1 problem\n") != 1 {
		t.Errorf("want one waiting line (once per change), stderr %q", r.stderr)
	}
	if !strings.Contains(r.stdout, "problems: []") || strings.Contains(r.stdout, "broken") {
		t.Errorf("want the final, healthy status:\n%s", r.stdout)
	}
}

func TestStatusWaitTimeout(t *testing.T) {
	kube, md := fixtureClients()
	fast := func(e *env) { e.pollInterval = time.Millisecond }
	r := runMeshctlWith(t, kube, md, fast, "status", "--wait", "50ms")
	if r.code != 1 || !strings.Contains(r.stderr, "--wait 50ms: timed out with problems left") || !strings.Contains(r.stderr, "status lists 2 problems") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "PROBLEMS\n- node/us-2") {
		t.Errorf("want the last status with its problems:\n%s", r.stdout)
	}
	for _, tc := range []struct{ args []string }{{[]string{"status", "--wait", "-1s"}}, {[]string{"status", "-o", "wide"}}} {
		if r := runMeshctl(t, kube, md, tc.args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2; stderr %q", tc.args, r.code, r.stderr)
		}
	}
}

func mustNode(t *testing.T, kube *kubefake.Clientset, name string) *corev1.Node {
	t.Helper()
	o, err := kube.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", name)
	if err != nil {
		t.Fatal(err)
	}
	return o.(*corev1.Node)
}

// hangingClients are clients of an API server that accepts requests and
// never answers them (until the request is given up).
func hangingClients(t *testing.T) *connect.Clients {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	c, err := connect.NewClientsForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// stderrHook calls hook with every write to stderr.
type stderrHook struct {
	w    io.Writer
	hook func(string)
}

func (s stderrHook) Write(p []byte) (int, error) {
	s.hook(string(p))
	return s.w.Write(p)
}

// TestStatusWaitCutsReadsAtDeadline: --wait D ends after D even when the
// API server stops answering; each read ran with --request-timeout of its
// own, past the deadline. The last status read is printed (exit 1 for its
// problems); with none read, the error says the wait timed out.
func TestStatusWaitCutsReadsAtDeadline(t *testing.T) {
	const wait, limit = 300 * time.Millisecond, 4 * time.Second
	// The first read answers (with the fixture's problems), later ones hang.
	kube, md := fixtureClients()
	var hang atomic.Bool
	hung := hangingClients(t)
	start := time.Now()
	r := runMeshctlWith(t, kube, md, func(e *env) {
		e.pollInterval = time.Millisecond
		e.stderr = stderrHook{e.stderr, func(s string) {
			if strings.Contains(s, "waiting up to") {
				hang.Store(true)
			}
		}}
		e.newClients = func(_, _ string) (*connect.Clients, error) {
			if hang.Load() {
				return hung, nil
			}
			return &connect.Clients{Kube: kube, Meshd: md, Config: &rest.Config{Host: server}}, nil
		}
	}, "status", "--wait", wait.String(), "--request-timeout", "10s")
	if d := time.Since(start); d > limit {
		t.Errorf("status --wait %s took %s", wait, d)
	}
	if r.code != 1 || !strings.Contains(r.stderr, "--wait 300ms: timed out with problems left") || !strings.Contains(r.stdout, "PROBLEMS\n- node/us-2") {
		t.Errorf("want the last status read and its problems: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	// No read answers.
	start = time.Now()
	r = runMeshctlWith(t, kube, md, func(e *env) {
		e.newClients = func(_, _ string) (*connect.Clients, error) { return hung, nil }
	}, "status", "--wait", wait.String(), "--request-timeout", "10s")
	if d := time.Since(start); d > limit {
		t.Errorf("status --wait %s against a hung API server took %s", wait, d)
	}
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "--wait 300ms: timed out: listing Nodes on") || !strings.Contains(r.stderr, "no answer in time") {
		t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
