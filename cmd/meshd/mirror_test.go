package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// remoteKubeconfig writes a kubeconfig whose current context names the
// cluster paris.
func remoteKubeconfig(t *testing.T) string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "remote.kubeconfig")
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
	return kc
}

// TestMirrorFlags: the remote cluster's name and the leader Lease's name
// follow from the flags, and the defaults (bad flags: TestSubcommandBadFlags).
func TestMirrorFlags(t *testing.T) {
	kc := remoteKubeconfig(t)
	for _, tc := range []struct {
		args              []string
		remoteName, lease string
	}{
		{args: nil, lease: "meshd-mirror"},
		{args: []string{"--remote-kubeconfig", kc}, remoteName: "paris", lease: "meshd-mirror-paris"},
		{args: []string{"--remote-kubeconfig", kc, "--remote-name", "c1", "--lease-name", "x"}, remoteName: "c1", lease: "x"},
	} {
		var c mirrorConfig
		if err := newMirrorFlagSet(&c).Parse(tc.args); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if err := c.validate(); err != nil {
			t.Errorf("%q: validate() = %v", tc.args, err)
			continue
		}
		if c.RemoteName != tc.remoteName || c.LeaseName != tc.lease {
			t.Errorf("%q: remote name %q lease %q, want %q %q", tc.args, c.RemoteName, c.LeaseName, tc.remoteName, tc.lease)
		}
	}
	var c mirrorConfig
	_ = newMirrorFlagSet(&c).Parse(nil)
	if c.Namespace != "meshd-system" || c.Listen != ":9478" || c.GracePeriod != time.Minute || !c.CreateNamespaces || c.NameSuffix || !c.LeaderElect {
		t.Errorf("defaults %+v", c)
	}
}
