package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// TestMirrorHelp checks `meshd mirror --help` exits 0 and that both it and
// docs/service-mirroring.md describe every flag.
func TestMirrorHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := realMain([]string{"mirror", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("meshd mirror --help exited %d: %s", code, errb.String())
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "service-mirroring.md"))
	if err != nil {
		t.Fatal(err)
	}
	var c mirrorConfig
	newMirrorFlagSet(&c).VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(errb.String(), "--"+f.Name) {
			t.Errorf("meshd mirror --help does not document --%s", f.Name)
		}
		if !strings.Contains(string(doc), "`--"+f.Name) {
			t.Errorf("docs/service-mirroring.md does not document --%s", f.Name)
		}
		if f.Usage == "" {
			t.Errorf("--%s has no description", f.Name)
		}
	})
}

func TestMirrorFlags(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "remote.kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters:
- name: paris
  cluster: {server: "https://paris.example:6443"}
users:
- name: reader
  user: {token: t}
contexts:
- name: ctx
  context: {cluster: paris, user: reader}
current-context: ctx
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args              []string
		ok                bool
		remoteName, lease string
	}{
		{args: nil, ok: true, lease: "meshd-mirror"},
		{args: []string{"--remote-kubeconfig", kc}, ok: true, remoteName: "paris", lease: "meshd-mirror-paris"},
		{args: []string{"--remote-kubeconfig", kc, "--remote-name", "c1", "--lease-name", "x"}, ok: true, remoteName: "c1", lease: "x"},
		{args: []string{"--remote-name", "c1"}},
		{args: []string{"--remote-kubeconfig", kc, "--remote-name", "Not_A_Label"}},
		{args: []string{"--remote-kubeconfig", filepath.Join(dir, "missing")}},
		{args: []string{"--grace-period", "0s"}},
		{args: []string{"--workers", "0"}},
		{args: []string{"--log-level", "loud"}},
	} {
		var c mirrorConfig
		fs := newMirrorFlagSet(&c)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		err := c.validate()
		if (err == nil) != tc.ok {
			t.Errorf("%q: validate() = %v, want ok=%v", tc.args, err, tc.ok)
			continue
		}
		if tc.ok && (c.RemoteName != tc.remoteName || c.LeaseName != tc.lease) {
			t.Errorf("%q: remote name %q lease %q, want %q %q", tc.args, c.RemoteName, c.LeaseName, tc.remoteName, tc.lease)
		}
	}
	var c mirrorConfig
	_ = newMirrorFlagSet(&c).Parse(nil)
	if c.Namespace != "meshd-system" || c.Listen != ":9478" || c.GracePeriod != time.Minute || !c.CreateNamespaces || c.NameSuffix || !c.LeaderElect {
		t.Errorf("defaults %+v", c)
	}
	var errb bytes.Buffer
	if code := realMain([]string{"mirror", "--remote-name", "c1"}, &bytes.Buffer{}, &errb); code != 2 {
		t.Errorf("invalid flags exited %d, want 2", code)
	}
	if code := realMain([]string{"mirror", "extra"}, &bytes.Buffer{}, &errb); code != 2 {
		t.Errorf("an extra argument exited %d, want 2", code)
	}
}

// TestMirrorManifestArgsParse checks the mirror Deployment's arguments parse
// with the mirror's flag set.
func TestMirrorManifestArgsParse(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "manifests", "components", "mirror", "mirror.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, doc := range strings.Split(string(data), "\n---") {
		var obj any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		for _, args := range mirrorArgs(obj) {
			found++
			var c mirrorConfig
			if err := newMirrorFlagSet(&c).Parse(args); err != nil {
				t.Errorf("mirror args %q: %v", args, err)
			}
		}
	}
	if found == 0 {
		t.Fatal("no `meshd mirror` container in manifests/components/mirror")
	}
}

// mirrorArgs finds container args starting with the mirror subcommand.
func mirrorArgs(v any) (out [][]string) {
	switch x := v.(type) {
	case map[string]any:
		if as, ok := x["args"].([]any); ok && len(as) > 0 && as[0] == "mirror" {
			var args []string
			for _, a := range as[1:] {
				args = append(args, fmt.Sprint(a))
			}
			out = append(out, args)
		}
		for _, e := range x {
			out = append(out, mirrorArgs(e)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, mirrorArgs(e)...)
		}
	}
	return out
}
