package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// chartHelm is the helm that hack/helm.sh builds (`make charts`), or "" when
// it has not been built: this test builds nothing.
func chartHelm(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("MESHD_CACHE")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(home, ".cache", "meshd")
	}
	helm := filepath.Join(dir, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no helm at %s: `make test` runs `make charts` first", helm)
		}
		t.Skipf("no helm at %s (`make charts` builds it)", helm)
	}
	return helm
}

// TestChartArgs renders the Helm chart, with its defaults and with every
// component on, and checks the args of every meshd container parse with that
// subcommand's real flag set and validate, as TestManifestArgsParse and
// TestSubcommandManifestArgs do for manifests/. It also checks the values
// that set flags (logLevel, logFormat) reach every meshd container, and
// maxUnavailable the DaemonSet.
func TestChartArgs(t *testing.T) {
	helm := chartHelm(t)
	chart := filepath.Join("..", "..", "charts", "meshd")
	all := []string{"--set", "userspaceSidecar=true,mirror.enabled=true,mcsDNS.enabled=true,clusterLinks.enabled=true",
		"--set", "logLevel=debug,logFormat=json,maxUnavailable=3"}
	for _, tc := range []struct {
		name string
		set  []string
		// want: args every meshd container has; maxUnavailable: the DaemonSet's.
		want           []string
		maxUnavailable string
		// containers: how many meshd containers at least.
		containers int
	}{
		{"defaults", nil, []string{"--log-level=info", "--log-format=text"}, "1", 2},
		{"every component", all, []string{"--log-level=debug", "--log-format=json"}, "3", 5},
		{"updateStrategy.maxUnavailable", []string{"--set", "updateStrategy.maxUnavailable=10%"}, nil, "10%", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "meshd", chart, "-n", "meshd-system", "--kube-version", "v1.36.3"}, tc.set...)
			var stderr bytes.Buffer
			cmd := exec.Command(helm, args...)
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
			}
			containers := 0
			for _, doc := range strings.Split(string(out), "\n---") {
				var obj map[string]any
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatal(err)
				}
				if obj["kind"] == "DaemonSet" {
					v, _, _ := unstructured.NestedFieldNoCopy(obj, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable")
					if got := fmt.Sprint(v); got != tc.maxUnavailable {
						t.Errorf("DaemonSet maxUnavailable %q, want %q", got, tc.maxUnavailable)
					}
				}
				var daemon, device [][]string
				walkArgs(obj, &daemon, &device)
				for _, a := range daemon {
					containers++
					hasArgs(t, "meshd", a, tc.want)
					checkDaemonArgs(t, "chart", a)
				}
				for _, a := range device {
					containers++
					hasArgs(t, "meshd device", a, tc.want)
					checkDeviceArgs(t, "chart", a)
				}
				for _, sc := range clusterSubcommands {
					for _, a := range subcommandArgs(obj, sc.name) {
						containers++
						hasArgs(t, "meshd "+sc.name, a, tc.want)
						sc.checkArgs(t, "chart", a)
					}
				}
			}
			if containers < tc.containers {
				t.Errorf("%d meshd containers, want at least %d", containers, tc.containers)
			}
		})
	}
}

// hasArgs: args (of what) include every one of want.
func hasArgs(t *testing.T, what string, args, want []string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(args, w) {
			t.Errorf("%s args %q lack %s", what, args, w)
		}
	}
}

// TestChartMCSCRDs: with mcsCRDs.install the chart renders the CRDs of
// manifests/components/mcs-crds unchanged but for the annotation
// helm.sh/resource-policy: keep, so that switching the value off or
// `helm uninstall` does not delete the CRDs and with them every
// ServiceExport and ServiceImport.
func TestChartMCSCRDs(t *testing.T) {
	helm := chartHelm(t)
	root := filepath.Join("..", "..")
	chart := filepath.Join(root, "charts", "meshd")
	cmd := exec.Command(helm, "template", "meshd", chart, "-n", "meshd-system", "--kube-version", "v1.36.3",
		"--set", "mcsCRDs.install=true", "--show-only", "templates/mcs-crds.yaml")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	rendered := map[string]map[string]any{}
	for _, doc := range strings.Split(string(out), "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj == nil {
			continue
		}
		name, _, _ := unstructured.NestedString(obj, "metadata", "name")
		rendered[name] = obj
	}
	files, err := filepath.Glob(filepath.Join(root, "manifests", "components", "mcs-crds", "*_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in manifests/components/mcs-crds: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		if err := yaml.Unmarshal(data, &want); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		name, _, _ := unstructured.NestedString(want, "metadata", "name")
		got, ok := rendered[name]
		if !ok {
			t.Errorf("the chart does not render %s (%s)", name, filepath.Base(f))
			continue
		}
		delete(rendered, name)
		if err := unstructured.SetNestedField(want, "keep", "metadata", "annotations", "helm.sh/resource-policy"); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("the chart's %s is not %s plus helm.sh/resource-policy: keep; differing: %v", name, filepath.Base(f), differingKeys(want, got, ""))
		}
	}
	for name := range rendered {
		t.Errorf("the chart renders %s, which manifests/components/mcs-crds lacks", name)
	}
}

// differingKeys lists the paths (down to two levels) where a and b differ.
func differingKeys(a, b map[string]any, prefix string) []string {
	var out []string
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		if reflect.DeepEqual(a[k], b[k]) {
			continue
		}
		am, aok := a[k].(map[string]any)
		bm, bok := b[k].(map[string]any)
		if aok && bok && prefix == "" {
			out = append(out, differingKeys(am, bm, k+".")...)
		} else {
			out = append(out, prefix+k)
		}
	}
	slices.Sort(out)
	return out
}

// TestChartRefusesWhatMeshdRefuses: docs/install.md says values.schema.json
// and the templates fail helm install, upgrade, template and lint on a value
// meshd refuses, instead of a DaemonSet that crash-loops on every node. Each
// refused case names the meshd flags its value becomes, which meshd must
// refuse too (so the list stays honest); each accepted case is a near miss
// that must render into args meshd accepts.
func TestChartRefusesWhatMeshdRefuses(t *testing.T) {
	helm := chartHelm(t)
	chart := filepath.Join("..", "..", "charts", "meshd")
	render := func(t *testing.T, set []string) ([]byte, error) {
		t.Helper()
		args := []string{"template", "meshd", chart, "-n", "meshd-system", "--kube-version", "v1.36.3"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		var stderr bytes.Buffer
		cmd := exec.Command(helm, args...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		return out, nil
	}
	longPrefix := strings.Repeat("a", 254) + "/zone"
	for _, tc := range []struct {
		set  []string
		args []string // the same as meshd flags
	}{
		{[]string{"meshCIDRs={10.4.0.0/16,10.5.0.0/16}"}, []string{"--mesh-cidr=10.4.0.0/16", "--mesh-cidr=10.5.0.0/16"}},
		{[]string{"meshCIDRs={fd00:1::/64,fd00:2::/64}"}, []string{"--mesh-cidr=fd00:1::/64", "--mesh-cidr=fd00:2::/64"}},
		{[]string{"serviceCIDRs={10.4.0.0/16}"}, []string{"--service-cidr=10.4.0.0/16"}},
		{[]string{"serviceCIDRs={10.0.0.0/8}"}, []string{"--service-cidr=10.0.0.0/8"}},
		{[]string{"serviceCIDRs={10.96.0.0/12,10.4.128.0/20}"}, []string{"--service-cidr=10.96.0.0/12", "--service-cidr=10.4.128.0/20"}},
		{[]string{"meshCIDRs={10.4.0.0/16,fd6d:6573:6864::/64}", "serviceCIDRs={fd6d:6573:6864:0:1::/108}"},
			[]string{"--mesh-cidr=10.4.0.0/16", "--mesh-cidr=fd6d:6573:6864::/64", "--service-cidr=fd6d:6573:6864:0:1::/108"}},
		{[]string{"serviceCIDRs={999.1.1.1/8}"}, []string{"--service-cidr=999.1.1.1/8"}},
		{[]string{"serviceCIDRs={10.96.0.0/33}"}, []string{"--service-cidr=10.96.0.0/33"}},
		{[]string{"serviceCIDRs={010.96.0.0/12}"}, []string{"--service-cidr=010.96.0.0/12"}},
		{[]string{"meshCIDRs={fd00::1::/64}"}, []string{"--mesh-cidr=fd00::1::/64"}},
		{[]string{"port=51821"}, []string{"--port=51821"}},
		{[]string{"topologyLabel=not a label"}, []string{"--topology-label=not a label"}},
		{[]string{"topologyLabel=Example.com/zone"}, []string{"--topology-label=Example.com/zone"}},
		{[]string{"topologyLabel=" + longPrefix}, []string{"--topology-label=" + longPrefix}},
		{[]string{"interface=.."}, []string{"--interface=.."}},
		{[]string{"interface=."}, []string{"--interface=."}},
		{[]string{"metricsAddress=::"}, []string{"--listen=:::9477"}},
	} {
		t.Run("refused "+caseName(tc.set), func(t *testing.T) {
			var c config
			if err := newFlagSet(&c).Parse(tc.args); err == nil {
				c.Hostname = "node-1"
				if _, err := c.options(); err == nil {
					t.Fatalf("meshd accepts %q: not a case for this test", tc.args)
				}
			}
			if _, err := render(t, tc.set); err == nil {
				t.Errorf("helm template accepted --set %s, which meshd refuses (%q)", strings.Join(tc.set, " --set "), tc.args)
			} else {
				t.Logf("refused: %v", err)
			}
		})
	}
	for _, set := range [][]string{
		{"meshCIDRs={10.4.0.0/16,fd6d:6573:6864::/64}", "serviceCIDRs={10.96.0.0/12,fd00:10:96::/108}"},
		{"meshCIDRs={FD6D:6573:6864::/64}", "serviceCIDRs={fd6d:6573:6865::/64,10.4.0.0/16}"},
		{"serviceCIDRs={10.5.0.0/16,10.3.255.0/24}"},
		{"port=51822", "interface=wg.mesh-0", "metricsAddress=[::1]", "topologyLabel=example.com/zone"},
		{"topologyLabel=" + strings.Repeat("a", 253) + "/" + strings.Repeat("z", 63)},
	} {
		t.Run("accepted "+caseName(set), func(t *testing.T) {
			out, err := render(t, set)
			if err != nil {
				t.Fatalf("helm template refused --set %s: %v", strings.Join(set, " --set "), err)
			}
			n := 0
			for _, doc := range strings.Split(string(out), "\n---") {
				var obj map[string]any
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatal(err)
				}
				var daemon, device [][]string
				walkArgs(obj, &daemon, &device)
				for _, a := range daemon {
					n++
					checkDaemonArgs(t, "chart", a)
				}
			}
			if n == 0 {
				t.Error("no meshd container rendered")
			}
		})
	}
}

// caseName names a subtest after its --set values, long ones shortened.
func caseName(set []string) string {
	var parts []string
	for _, s := range set {
		if len(s) > 48 {
			s = s[:40] + fmt.Sprintf("...(%d)", len(s))
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// TestChartSchemaPatterns: the patterns of values.schema.json accept what
// meshd parses: a CIDR what netip.ParsePrefix accepts (but IPv6 with an
// embedded dotted IPv4 address, which the schema refuses on purpose), a
// topology label what validation.IsQualifiedName accepts (the templates
// check the prefix's length). Edge cases, then random strings.
func TestChartSchemaPatterns(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "charts", "meshd", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Definitions struct {
			CIDR struct{ Pattern string } `json:"cidr"`
		}
		Properties struct {
			TopologyLabel struct{ Pattern string } `json:"topologyLabel"`
		}
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	cidr := regexp.MustCompile(schema.Definitions.CIDR.Pattern)
	label := regexp.MustCompile(schema.Properties.TopologyLabel.Pattern)
	checkCIDR := func(s string) {
		p, err := netip.ParsePrefix(s)
		want := err == nil && !(p.Addr().Is6() && strings.Contains(s, "."))
		if got := cidr.MatchString(s); got != want {
			t.Errorf("schema cidr pattern matches %q: %v; netip.ParsePrefix: %v", s, got, err)
		}
	}
	checkLabel := func(s string) {
		errs := validation.IsQualifiedName(s)
		got := label.MatchString(s)
		if prefix, _, ok := strings.Cut(s, "/"); ok && len(prefix) > 253 {
			got = false // the templates' check
		}
		if got != (len(errs) == 0) {
			t.Errorf("schema topologyLabel pattern matches %q: %v; IsQualifiedName: %v", s, got, errs)
		}
	}
	for _, s := range []string{"10.4.0.0/16", "0.0.0.0/0", "255.255.255.255/32", "999.1.1.1/8", "10.04.0.0/16",
		"10.4.0.0/08", "10.4.0.0/33", "10.4.0/16", "10.4.0.0", "10.4.0.0/", " 10.4.0.0/16", "::/0", "::1/128",
		"fd6d:6573:6864::/64", "1:2:3:4:5:6:7:8/64", "1:2:3:4:5:6:7::/64", "::2:3:4:5:6:7:8/64",
		"1::2:3:4:5:6:7:8/64", "1:2:3:4:5:6:7:8:9/64", "1:::2/64", "fd00::1::/64", "::ffff:1.2.3.4/120",
		"fe80::1%eth0/64", "0000:0000::/32", "00000::/32", "1::/129", "1::/0128", "1.2.3.4/+3", "FD6D::/64",
		"256.0.0.0/8", "10.256.0.0/16", "1.2.3.300/32", "249.250.251.252/30"} {
		checkCIDR(s)
	}
	for _, s := range []string{"topology.kubernetes.io/region", "zone", "a", "-a", "a-", "a_b.c", "not a label",
		"Example.com/zone", "example.com/", "/zone", "a/b/c", "example..com/zone", strings.Repeat("z", 63),
		strings.Repeat("z", 64), strings.Repeat("a", 253) + "/z", strings.Repeat("a", 254) + "/z"} {
		checkLabel(s)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	cidrParts := []string{"0", "1", "9", "f", "F", "g", ":", "::", ".", "/", "25", "255", "256", "00", "01", "ffff", "12345", "128", "129", "32", "33", "%"}
	labelParts := []string{"a", "Z", "0", "-", "_", ".", "/", " ", "example", "com", "..", "x"}
	random := func(parts []string) string {
		var b strings.Builder
		for range 1 + rng.IntN(12) {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		return b.String()
	}
	for range 100000 {
		checkCIDR(random(cidrParts))
		checkLabel(random(labelParts))
	}
	// Near misses: dotted quads with octets up to 299 (some with a leading
	// zero), IPv6 with 6 to 9 groups of 1 to 5 digits and at most two "::".
	for range 50000 {
		var b strings.Builder
		for i := range 4 {
			if i > 0 {
				b.WriteByte('.')
			}
			if rng.IntN(20) == 0 {
				b.WriteByte('0')
			}
			fmt.Fprint(&b, rng.IntN(300))
		}
		fmt.Fprintf(&b, "/%d", rng.IntN(35))
		checkCIDR(b.String())
		b.Reset()
		groups := 6 + rng.IntN(4)
		for i := range groups {
			if i > 0 {
				b.WriteByte(':')
			}
			if rng.IntN(6) == 0 {
				continue // an empty group: "::" with its neighbour
			}
			for range 1 + rng.IntN(5) {
				b.WriteByte("0123456789abcdefABCDEF"[rng.IntN(22)])
			}
		}
		fmt.Fprintf(&b, "/%d", rng.IntN(131))
		checkCIDR(b.String())
	}
	// Valid prefixes of both families, in short and expanded form.
	for range 20000 {
		addr := randomAddr(rng)
		bits := rng.IntN(addr.BitLen() + 3)
		checkCIDR(fmt.Sprintf("%s/%d", addr, bits))
		checkCIDR(fmt.Sprintf("%s/%d", addr.StringExpanded(), bits))
	}
}

// TestChartCIDRBits: the chart's meshd.cidrBits (behind its mesh CIDR family
// and overlap checks) gives the family and network bits netip gives, for
// random CIDRs of both families in short and expanded, lower and upper case
// form. It renders them from a copy of the chart with one more template.
func TestChartCIDRBits(t *testing.T) {
	helm := chartHelm(t)
	chart := filepath.Join(t.TempDir(), "meshd")
	if err := os.CopyFS(chart, os.DirFS(filepath.Join("..", "..", "charts", "meshd"))); err != nil {
		t.Fatal(err)
	}
	// The schema refuses the extra value.
	if err := os.Remove(filepath.Join(chart, "values.schema.json")); err != nil {
		t.Fatal(err)
	}
	tpl := `apiVersion: v1
kind: ConfigMap
metadata: {name: cidr-bits}
data:
{{- range $i, $c := .Values.testCIDRs }}
  c{{ $i }}: {{ include "meshd.cidrBits" $c | quote }}
{{- end }}
`
	if err := os.WriteFile(filepath.Join(chart, "templates", "cidr-bits.yaml"), []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var cidrs, want []string
	for _, s := range []string{"0.0.0.0/0", "10.4.0.0/16", "255.255.255.255/32", "::/0", "::/128", "::1/128", "1::/16", "fd6d:6573:6864::/64"} {
		p := netip.MustParsePrefix(s)
		cidrs, want = append(cidrs, s), append(want, bitsOf(p))
	}
	for range 2000 {
		addr := randomAddr(rng)
		s := addr.String()
		switch rng.IntN(3) {
		case 0:
			s = addr.StringExpanded()
		case 1:
			s = strings.ToUpper(s)
		}
		p := netip.PrefixFrom(addr, rng.IntN(addr.BitLen()+1))
		cidrs, want = append(cidrs, fmt.Sprintf("%s/%d", s, p.Bits())), append(want, bitsOf(p))
	}
	list, err := json.Marshal(cidrs)
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helm, "template", "meshd", chart, "-n", "meshd-system", "--kube-version", "v1.36.3",
		"--show-only", "templates/cidr-bits.yaml", "--set-json", "testCIDRs="+string(list))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	var cm struct{ Data map[string]string }
	if err := yaml.Unmarshal(out, &cm); err != nil {
		t.Fatal(err)
	}
	for i, c := range cidrs {
		if got := cm.Data[fmt.Sprintf("c%d", i)]; got != want[i] {
			t.Errorf("meshd.cidrBits %s = %q, want %q", c, got, want[i])
		}
	}
}

// bitsOf is what meshd.cidrBits gives for p: "4:" or "6:", then the first
// p.Bits() bits of the address.
func bitsOf(p netip.Prefix) string {
	var b strings.Builder
	b.WriteString("6:")
	if p.Addr().Is4() {
		b.Reset()
		b.WriteString("4:")
	}
	for _, x := range p.Addr().AsSlice() {
		fmt.Fprintf(&b, "%08b", x)
	}
	return b.String()[:2+p.Bits()]
}

// randomAddr is an IPv4 or IPv6 address, a third of its bytes zero (so
// short forms with "::" come up).
func randomAddr(rng *rand.Rand) netip.Addr {
	var a [16]byte
	for i := range a {
		if rng.IntN(3) > 0 {
			a[i] = byte(rng.IntN(256))
		}
	}
	if rng.IntN(2) == 0 {
		return netip.AddrFrom4([4]byte(a[:4]))
	}
	return netip.AddrFrom16(a)
}
