package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
