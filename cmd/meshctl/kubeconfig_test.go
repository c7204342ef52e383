package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"meshd.io/meshd/pkg/k8s/connect"
)

// twoContexts writes a kubeconfig with contexts east (current) and west.
func twoContexts(t *testing.T) string {
	t.Helper()
	kc := `apiVersion: v1
kind: Config
current-context: east
clusters:
- name: east
  cluster: {server: "https://east.example:6443"}
- name: west
  cluster: {server: "https://west.example:6443"}
users:
- name: admin
  user: {token: not-a-secret}
contexts:
- name: east
  context: {cluster: east, user: admin}
- name: west
  context: {cluster: west, user: admin}
`
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNewClientsContext: the real client loader selects the context
// (default: the current one) and says which context is unknown.
func TestNewClientsContext(t *testing.T) {
	path := twoContexts(t)
	for ctx, want := range map[string]string{"": "https://east.example:6443", "east": "https://east.example:6443", "west": "https://west.example:6443"} {
		c, err := newClients(path, ctx)
		if err != nil {
			t.Fatalf("context %q: %v", ctx, err)
		}
		if c.Config.Host != want {
			t.Errorf("context %q: server %s, want %s", ctx, c.Config.Host, want)
		}
	}
	if _, err := newClients(path, "north"); err == nil || !strings.Contains(err.Error(), `context "north"`) {
		t.Errorf("unknown context: %v", err)
	}
	t.Setenv("KUBECONFIG", path)
	if c, err := newClients("", "west"); err != nil || c.Config.Host != "https://west.example:6443" {
		t.Errorf("context of $KUBECONFIG: %v", err)
	}
	if got := contextName(path, ""); got != "east" {
		t.Errorf("current context %q, want east", got)
	}
}

// TestGlobalContextFlag: --context reaches the client loader of the
// reading commands.
func TestGlobalContextFlag(t *testing.T) {
	kube, md := fixtureClients()
	var got [][2]string
	r := runMeshctlWith(t, kube, md, func(e *env) {
		e.newClients = func(kubeconfig, kubecontext string) (*connect.Clients, error) {
			got = append(got, [2]string{kubeconfig, kubecontext})
			return &connect.Clients{Kube: kube, Meshd: md, Config: &rest.Config{Host: server}}, nil
		}
	}, "--kubeconfig", "k.yaml", "--context", "west", "graph")
	if r.code != 0 || len(got) == 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	for _, g := range got {
		if g != [2]string{"k.yaml", "west"} {
			t.Errorf("clients for %q, want k.yaml and context west", g)
		}
	}
}

// TestLinkContexts: link --from-context/--to-context links two contexts of
// one kubeconfig (the global --kubeconfig); the cluster names default to
// the contexts.
func TestLinkContexts(t *testing.T) {
	path := twoContexts(t)
	kube, md := fixtureClients()
	var got [][2]string
	r := runMeshctlWith(t, kube, md, func(e *env) {
		e.newClients = func(kubeconfig, kubecontext string) (*connect.Clients, error) {
			got = append(got, [2]string{kubeconfig, kubecontext})
			return &connect.Clients{Kube: kube, Meshd: md, Config: &rest.Config{Host: server}}, nil
		}
	}, "--kubeconfig", path, "link", "--from-context", "east", "--from-mesh-cidr", "10.4.0.0/16", "--to-context", "west", "--to-mesh-cidr", "10.5.0.0/16")
	// The fake clusters have no CA: refused after connecting, naming the
	// first cluster by its context.
	if r.code != 1 || !strings.Contains(r.stderr, "cluster east") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if !slices.Equal(got, [][2]string{{path, "east"}, {path, "west"}}) {
		t.Errorf("clients for %q, want both contexts of %s", got, path)
	}
	if len(kube.Actions()) != 0 {
		t.Errorf("a refused link wrote to the cluster: %v", kube.Actions())
	}

	// The same context twice is one cluster: a usage error.
	r = runMeshctl(t, kube, md, "--kubeconfig", path, "link", "--from-context", "east", "--to-context", "east")
	if r.code != 2 || !strings.Contains(r.stderr, `both clusters are named "east"`) {
		t.Errorf("same context: exit %d, stderr %q", r.code, r.stderr)
	}
	// Neither kubeconfig nor context.
	r = runMeshctl(t, kube, md, "link", "--to-context", "west")
	if r.code != 2 || !strings.Contains(r.stderr, "--from-kubeconfig or --from-context is required") {
		t.Errorf("no from side: exit %d, stderr %q", r.code, r.stderr)
	}
}
