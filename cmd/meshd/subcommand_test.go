package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// clusterSubcommand is a cluster-wide subcommand, for the tests all of them
// pass alike.
type clusterSubcommand struct {
	name string
	// flags returns the subcommand's flag set over a fresh config, and the
	// config's validate.
	flags func() (*pflag.FlagSet, func() error)
	// doc documents every flag as `--flag (empty: docs/flags.md only).
	doc string
	// manifest has the subcommand's container; validateManifest: its args
	// validate here too (not when they name files mounted in the Pod).
	manifest         string
	validateManifest bool
}

// clusterSubcommands are the cluster-wide subcommands.
var clusterSubcommands = []clusterSubcommand{
	{
		name:  "dns",
		flags: func() (*pflag.FlagSet, func() error) { var c dnsConfig; return newDNSFlagSet(&c), c.validate },
		doc:   "docs/mcs-dns.md", manifest: "manifests/components/mcs-dns/mcs-dns.yaml", validateManifest: true,
	},
	{
		name:  "mirror",
		flags: func() (*pflag.FlagSet, func() error) { var c mirrorConfig; return newMirrorFlagSet(&c), c.validate },
		doc:   "docs/service-mirroring.md", manifest: "manifests/components/mirror/mirror.yaml", // --remote-kubeconfig is mounted
	},
	{
		name:     "link",
		flags:    func() (*pflag.FlagSet, func() error) { var c linkConfig; return newLinkFlagSet(&c), c.validate },
		manifest: "manifests/link.yaml", validateManifest: true,
	},
}

// checkArgs: the subcommand's args (from where) parse with its flag set,
// and validate unless they name files mounted in the Pod.
func (sc clusterSubcommand) checkArgs(t *testing.T, where string, args []string) {
	t.Helper()
	fs, validate := sc.flags()
	if err := fs.Parse(args); err != nil {
		t.Errorf("%s %s args %q: %v", where, sc.name, args, err)
	} else if sc.validateManifest {
		if err := validate(); err != nil {
			t.Errorf("%s %s args %q: %v", where, sc.name, args, err)
		}
	}
}

// TestSubcommandHelp: `meshd <subcommand> --help` exits 0 and documents
// every flag, each with a description, as does the subcommand's doc.
func TestSubcommandHelp(t *testing.T) {
	for _, sc := range clusterSubcommands {
		t.Run(sc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := realMain([]string{sc.name, "--help"}, &out, &errb); code != 0 {
				t.Fatalf("meshd %s --help exited %d: %s", sc.name, code, errb.String())
			}
			var doc []byte
			if sc.doc != "" {
				var err error
				if doc, err = os.ReadFile(filepath.Join("..", "..", sc.doc)); err != nil {
					t.Fatal(err)
				}
			}
			fs, _ := sc.flags()
			fs.VisitAll(func(f *pflag.Flag) {
				if !strings.Contains(errb.String(), "--"+f.Name) {
					t.Errorf("meshd %s --help does not document --%s", sc.name, f.Name)
				}
				if f.Usage == "" {
					t.Errorf("meshd %s --%s has no description", sc.name, f.Name)
				}
				if doc != nil && !strings.Contains(string(doc), "`--"+f.Name) {
					t.Errorf("%s does not document --%s", sc.doc, f.Name)
				}
			})
		})
	}
}

// TestSubcommandBadFlags: invalid settings and stray arguments exit 2 with
// the reason.
func TestSubcommandBadFlags(t *testing.T) {
	kc := remoteKubeconfig(t)
	for _, tc := range []struct {
		sub  string
		args []string
		want string
	}{
		{"dns", []string{"--listen", "53"}, `--listen "53": want host:port`},
		{"dns", []string{"--metrics-listen", "x"}, `--metrics-listen "x": want host:port`},
		{"dns", []string{"--zone", "a..b"}, `--zone "a..b": not a domain name`},
		{"dns", []string{"--zone", "."}, `--zone ".": not a domain name`},
		{"dns", []string{"--ttl", "1500ms"}, "--ttl 1.5s: want whole seconds"},
		{"dns", []string{"--ttl", "2h"}, "--ttl 2h0m0s: want whole seconds"},
		{"dns", []string{"extra"}, `unexpected argument "extra"`},
		{"mirror", []string{"--remote-name", "c1"}, "--remote-name needs --remote-kubeconfig"},
		{"mirror", []string{"--remote-kubeconfig", kc, "--remote-name", "Not_A_Label"}, `--remote-name "Not_A_Label"`},
		{"mirror", []string{"--remote-kubeconfig", filepath.Join(filepath.Dir(kc), "missing")}, "--remote-name is not given and reading"},
		{"mirror", []string{"--grace-period", "0s"}, "--grace-period 0s: want a positive duration"},
		{"mirror", []string{"--workers", "0"}, "--workers 0: want at least 1"},
		{"mirror", []string{"--log-level", "loud"}, `--log-level "loud"`},
		{"mirror", []string{"extra"}, `unexpected argument "extra"`},
		{"link", []string{"--lease-duration", "0s"}, "--lease-duration 0s: want 2s to 1h0m0s"},
		{"link", []string{"--lease-duration", "2h"}, "--lease-duration 2h0m0s: want 2s to 1h0m0s"},
		{"link", []string{"--takeover-delay", "-1s"}, "--takeover-delay -1s: must not be negative"},
		{"link", []string{"--resync-period", "0s"}, "--resync-period 0s: want a positive duration"},
		{"link", []string{"--namespace", ""}, "--namespace is empty"},
		{"link", []string{"--lease-name", ""}, "--lease-name is empty"},
		{"link", []string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{"link", []string{"extra"}, `unexpected argument "extra"`},
		// Values the flag parser refuses (the node daemon: sub "").
		{"", []string{"--wireguard-lazy-peers=maybe"}, `meshd: invalid argument "maybe" for "--wireguard-lazy-peers" flag: "maybe" is none of auto, true and false`},
		{"", []string{"--port", "abc"}, `meshd: invalid argument "abc" for "--port" flag`},
		{"cleanup", []string{"--bogus"}, "meshd cleanup: unknown flag: --bogus"},
		{"dns", []string{"--ttl", "soon"}, `meshd dns: invalid argument "soon" for "--ttl" flag`},
	} {
		var errb bytes.Buffer
		args := tc.args
		if tc.sub != "" {
			args = append([]string{tc.sub}, tc.args...)
		}
		if code := realMain(args, &bytes.Buffer{}, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("meshd %s %q: exit %d, stderr %q; want 2 and %q", tc.sub, tc.args, code, errb.String(), tc.want)
		}
	}
}

// TestSubcommandManifestArgs: the args of each subcommand's container in
// its manifest component parse with its flag set (and validate).
func TestSubcommandManifestArgs(t *testing.T) {
	for _, sc := range clusterSubcommands {
		t.Run(sc.name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("..", "..", sc.manifest))
			if err != nil {
				t.Fatal(err)
			}
			found := 0
			for _, doc := range strings.Split(string(data), "\n---") {
				var obj any
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatal(err)
				}
				for _, args := range subcommandArgs(obj, sc.name) {
					found++
					sc.checkArgs(t, "manifest", args)
				}
			}
			if found == 0 {
				t.Fatalf("no `meshd %s` container in %s", sc.name, sc.manifest)
			}
		})
	}
}

// subcommandArgs finds container args starting with sub.
func subcommandArgs(v any, sub string) (out [][]string) {
	switch x := v.(type) {
	case map[string]any:
		if as, ok := x["args"].([]any); ok && len(as) > 0 && as[0] == sub {
			var args []string
			for _, a := range as[1:] {
				args = append(args, fmt.Sprint(a))
			}
			out = append(out, args)
		}
		for _, e := range x {
			out = append(out, subcommandArgs(e, sub)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, subcommandArgs(e, sub)...)
		}
	}
	return out
}
