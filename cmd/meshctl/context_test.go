package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"meshd.io/meshd/pkg/k8s"
)

// twoContexts is a kubeconfig with the contexts east (current) and west.
const twoContexts = `apiVersion: v1
kind: Config
current-context: east
clusters:
- name: east
  cluster: {server: "https://east.example:6443"}
- name: west
  cluster: {server: "https://west.example:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: east
  context: {cluster: east, user: u}
- name: west
  context: {cluster: west, user: u}
`

func writeKubeconfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, []byte(twoContexts), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestClientsForContext(t *testing.T) {
	kc := writeKubeconfig(t)
	for ctx, want := range map[string]string{"": "https://east.example:6443", "east": "https://east.example:6443", "west": "https://west.example:6443"} {
		c, err := clientsFor(kc, ctx)
		if err != nil {
			t.Fatalf("context %q: %v", ctx, err)
		}
		if c.Config.Host != want {
			t.Errorf("context %q: server %s, want %s", ctx, c.Config.Host, want)
		}
	}
	if _, err := clientsFor(kc, "north"); err == nil || !strings.Contains(err.Error(), `"north"`) {
		t.Errorf("unknown context: error %v, want one naming it", err)
	}
}

// The global --context reaches the clients of every command that reads the
// cluster.
func TestContextFlag(t *testing.T) {
	kube, md := fixtureClients()
	var got []string
	r := runMeshctlWith(t, kube, md, func(e *env) {
		inner := e.newClients
		e.newClients = func(kubeconfig, context string) (*k8s.Clients, error) {
			got = append(got, kubeconfig+"|"+context)
			return inner(kubeconfig, context)
		}
	}, "--kubeconfig", "k.yaml", "--context", "west", "status")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if len(got) == 0 {
		t.Fatal("no clients built")
	}
	for _, g := range got {
		if g != "k.yaml|west" {
			t.Errorf("clients built for %q, want k.yaml|west", g)
		}
	}
}

// link --from-context/--to-context: two clusters of one kubeconfig, named
// after their contexts.
func TestLinkSidesFromContexts(t *testing.T) {
	kc := writeKubeconfig(t)
	from := &side{kubeconfig: kc, context: "east", granularity: "location", port: 51820}
	to := &side{context: "west", granularity: "location", port: 51820}
	fs, ts, err := settingsOf(from, to)
	if err != nil {
		t.Fatal(err)
	}
	if fs.Name != "east" || ts.Name != "west" {
		t.Errorf("names %q, %q; want east, west", fs.Name, ts.Name)
	}
	if _, _, err := settingsOf(&side{granularity: "location", port: 51820}, to); err == nil ||
		!strings.Contains(err.Error(), "--from-kubeconfig or --from-context is required") {
		t.Errorf("a side without kubeconfig and context: error %v", err)
	}
}
