package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// TestDNSHelp: `meshd dns --help` exits 0 and documents every flag.
func TestDNSHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := realMain([]string{"dns", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("meshd dns --help exited %d: %s", code, errb.String())
	}
	var c dnsConfig
	newDNSFlagSet(&c).VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(errb.String(), "--"+f.Name) || f.Usage == "" {
			t.Errorf("meshd dns --help does not document --%s", f.Name)
		}
	})
}

// TestDNSBadFlags: invalid settings exit 2 with the reason.
func TestDNSBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "53"}, `--listen "53": want host:port`},
		{[]string{"--metrics-listen", "x"}, `--metrics-listen "x": want host:port`},
		{[]string{"--zone", "a..b"}, `--zone "a..b": not a domain name`},
		{[]string{"--zone", "."}, `--zone ".": not a domain name`},
		{[]string{"--ttl", "1500ms"}, "--ttl 1.5s: want whole seconds"},
		{[]string{"--ttl", "2h"}, "--ttl 2h0m0s: want whole seconds"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		var errb bytes.Buffer
		if code := realMain(append([]string{"dns"}, tc.args...), &bytes.Buffer{}, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("meshd dns %v: exit %d, stderr %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
	c := dnsConfig{Listen: ":53", MetricsListen: ":9479", Zone: " ClusterSet.Local ", LogLevel: "info", LogFormat: "text"}
	if err := c.validate(); err != nil || c.Zone != "clusterset.local." {
		t.Errorf("zone normalized to %q, %v; want clusterset.local.", c.Zone, err)
	}
}

// TestDNSManifestArgsParse: the mcs-dns component's container args parse
// with the dns flag set and validate.
func TestDNSManifestArgsParse(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "manifests", "components", "mcs-dns", "mcs-dns.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, doc := range strings.Split(string(data), "\n---") {
		var obj any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		for _, args := range subcommandArgs(obj, "dns") {
			found++
			var c dnsConfig
			if err := newDNSFlagSet(&c).Parse(args); err != nil {
				t.Errorf("dns args %q: %v", args, err)
			} else if err := c.validate(); err != nil {
				t.Errorf("dns args %q: %v", args, err)
			}
		}
	}
	if found == 0 {
		t.Fatal("no `meshd dns` container in manifests/components/mcs-dns")
	}
}

// subcommandArgs finds container args starting with sub.
func subcommandArgs(v any, sub string) (out [][]string) {
	switch x := v.(type) {
	case map[string]any:
		if as, ok := x["args"].([]any); ok && len(as) > 0 && as[0] == sub {
			var args []string
			for _, a := range as[1:] {
				args = append(args, a.(string))
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

// TestReleaseBuildLinksNoTemplates: with the build tags of make build, the
// Dockerfile and hack/image.sh (grpcnotrace), meshd links neither
// text/template nor html/template. gRPC (linked by CoreDNS's server) reaches
// them through golang.org/x/net/trace without the tag, and their reflective
// method calls make the linker keep every exported method: 34.6 MB became
// 67.2 MB (stripped), 36.2 MB with the tag.
func TestReleaseBuildLinksNoTemplates(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list (-short)")
	}
	out, err := exec.Command("go", "list", "-tags", "grpcnotrace", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "text/template" || p == "html/template" {
			t.Errorf("meshd (-tags grpcnotrace) links %s", p)
		}
	}
}
