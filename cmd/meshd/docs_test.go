package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite docs/flags.md from the flag set")

// flagsDoc renders docs/flags.md from the real flag sets.
func flagsDoc() string {
	var b bytes.Buffer
	b.WriteString("# meshd flags\n\n<!-- Generated from `meshd --help` by `go test ./cmd/meshd -run TestFlagsDoc -update`; a test fails when it is stale. -->\n\n")
	b.WriteString("```\n" + usage)
	var c config
	fs := newFlagSet(&c)
	fs.SetOutput(&b)
	fs.PrintDefaults()
	b.WriteString("```\n\n## meshd device\n\n```\n")
	var dc deviceConfig
	dfs := newDeviceFlagSet(&dc)
	dfs.SetOutput(&b)
	dfs.Usage()
	b.WriteString("```\n\n## meshd mirror\n\nSee [service-mirroring.md](service-mirroring.md).\n\n```\n")
	var mc mirrorConfig
	mfs := newMirrorFlagSet(&mc)
	mfs.SetOutput(&b)
	mfs.PrintDefaults()
	b.WriteString("```\n\n## meshd link\n\nThe link controller; see [multi-cluster.md](multi-cluster.md).\n\n```\n")
	var lc linkConfig
	lfs := newLinkFlagSet(&lc)
	lfs.SetOutput(&b)
	lfs.PrintDefaults()
	b.WriteString("```\n\n## meshd dns\n\nSee [mcs-dns.md](mcs-dns.md).\n\n```\n")
	var nc dnsConfig
	nfs := newDNSFlagSet(&nc)
	nfs.SetOutput(&b)
	nfs.PrintDefaults()
	b.WriteString("```\n")
	return b.String()
}

func TestFlagsDocUpToDate(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "flags.md")
	want := flagsDoc()
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v (run: go test ./cmd/meshd -run TestFlagsDoc -update)", path, err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: run `go test ./cmd/meshd -run TestFlagsDoc -update`", path)
	}
}

// TestHelpDocumentsEveryFlag checks `meshd --help` exits 0 and names each flag.
func TestHelpDocumentsEveryFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := realMain([]string{"--help"}, &out, &errb); code != 0 {
		t.Fatalf("meshd --help exited %d", code)
	}
	var c config
	newFlagSet(&c).VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(errb.String(), "--"+f.Name) {
			t.Errorf("--help does not document --%s", f.Name)
		}
		if f.Usage == "" {
			t.Errorf("--%s has no description", f.Name)
		}
	})
}

// manifestArgs collects the meshd arguments in the manifests: container args
// of meshd images and kustomize patches that append to args.
func manifestArgs(t *testing.T) (daemon, device [][]string) {
	t.Helper()
	root := filepath.Join("..", "..", "manifests")
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || strings.Contains(path, "crds") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, doc := range strings.Split(string(data), "\n---") {
			var obj any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				return fmt.Errorf("%s document %d: %w", path, i, err)
			}
			walkArgs(obj, &daemon, &device)
			// kustomize patches are YAML strings inside the kustomization.
			if m, ok := obj.(map[string]any); ok {
				if ps, ok := m["patches"].([]any); ok {
					for _, p := range ps {
						pm, _ := p.(map[string]any)
						if s, ok := pm["patch"].(string); ok {
							var ops []map[string]any
							if yaml.Unmarshal([]byte(s), &ops) == nil {
								for _, op := range ops {
									if v, ok := op["value"].(string); ok && strings.Contains(fmt.Sprint(op["path"]), "/args") {
										daemon = append(daemon, []string{v})
									}
								}
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return daemon, device
}

func walkArgs(v any, daemon, device *[][]string) {
	switch x := v.(type) {
	case map[string]any:
		if img, ok := x["image"].(string); ok && strings.Contains(img, "meshd") {
			if as, ok := x["args"].([]any); ok {
				var args []string
				for _, a := range as {
					args = append(args, fmt.Sprint(a))
				}
				if len(args) > 0 && args[0] == "device" {
					*device = append(*device, args[1:])
				} else if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
					// another subcommand (e.g. mirror): not the daemon's flags.
				} else {
					*daemon = append(*daemon, args)
				}
			}
		}
		for _, e := range x {
			walkArgs(e, daemon, device)
		}
	case []any:
		for _, e := range x {
			walkArgs(e, daemon, device)
		}
	}
}

// TestManifestArgsParse checks the DaemonSet's arguments parse with meshd's
// real flag set and give valid options.
func TestManifestArgsParse(t *testing.T) {
	daemon, device := manifestArgs(t)
	if len(daemon) == 0 || len(device) == 0 {
		t.Fatalf("found no meshd arguments in manifests/ (daemon %d, device %d)", len(daemon), len(device))
	}
	for _, args := range daemon {
		checkDaemonArgs(t, "manifest", args)
	}
	for _, args := range device {
		checkDeviceArgs(t, "manifest", args)
	}
}

// checkDaemonArgs: the node daemon's args (from where) parse with meshd's
// real flag set and give valid options.
func checkDaemonArgs(t *testing.T, where string, args []string) {
	t.Helper()
	var c config
	if err := newFlagSet(&c).Parse(args); err != nil {
		t.Errorf("%s args %q: %v", where, args, err)
		return
	}
	c.Hostname = "node-1"
	if _, err := c.options(); err != nil {
		t.Errorf("%s args %q: %v", where, args, err)
	}
}

// checkDeviceArgs: `meshd device` args (from where) parse.
func checkDeviceArgs(t *testing.T, where string, args []string) {
	t.Helper()
	var dc deviceConfig
	if err := newDeviceFlagSet(&dc).Parse(args); err != nil {
		t.Errorf("%s device args %q: %v", where, args, err)
	}
}

// TestChartCRDsMatchManifests: the Helm chart ships the same CRDs as
// manifests/crds (copy them with `cp manifests/crds/*.yaml charts/meshd/crds/`).
func TestChartCRDsMatchManifests(t *testing.T) {
	root := filepath.Join("..", "..")
	files, err := filepath.Glob(filepath.Join(root, "manifests", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in manifests/crds: %v", err)
	}
	for _, f := range files {
		want, _ := os.ReadFile(f)
		got, err := os.ReadFile(filepath.Join(root, "charts", "meshd", "crds", filepath.Base(f)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("charts/meshd/crds/%s differs from manifests/crds (run: cp manifests/crds/*.yaml charts/meshd/crds/)", filepath.Base(f))
		}
	}
}
