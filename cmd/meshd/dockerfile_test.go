package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The image itself is built by `make image` (podman, no registry) and run as
// a node agent in e2e/image_test.go. This checks the Dockerfile's registry
// path, which needs no container engine: its Go version is go.mod's, and its
// build stage's command (CGO_ENABLED=0, -trimpath, the version linked in)
// gives static binaries that run.
func TestDockerfileBuildStage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries (-short)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindSubmatch(df)
	modVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	if goVersion == nil || modVersion == nil || string(goVersion[1]) != string(modVersion[1]) {
		t.Errorf("Dockerfile ARG GO_VERSION %q, go.mod go %q: want the same minor version", goVersion, modVersion)
	}
	for _, want := range []string{"CGO_ENABLED=0", `GOFLAGS="-trimpath -tags=grpcnotrace"`, `-X main.version=${VERSION}`, "./cmd/meshd ./cmd/meshctl",
		"iptables wireguard-tools iproute2"} {
		if !strings.Contains(string(df), want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}

	out := t.TempDir()
	cmd := exec.Command("go", "build", "-ldflags", "-s -w -X main.version=0.0.0-test", "-o", out+"/", "./cmd/meshd", "./cmd/meshctl")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-trimpath -tags=grpcnotrace")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build command failed: %v\n%s", err, b)
	}
	for _, bin := range []string{"meshd", "meshctl"} {
		f, err := elf.Open(filepath.Join(out, bin))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked (has an ELF interpreter); the runtime image wants a static binary", bin)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s needs shared libraries %v", bin, libs)
		}
		f.Close()
	}
	v, err := exec.Command(filepath.Join(out, "meshd"), "version").Output()
	if err != nil || strings.TrimSpace(string(v)) != "0.0.0-test" {
		t.Errorf("meshd version = %q, %v; want the linked version 0.0.0-test", v, err)
	}
	if v, err := exec.Command(filepath.Join(out, "meshd"), "--version").Output(); err != nil || strings.TrimSpace(string(v)) != "0.0.0-test" {
		t.Errorf("meshd --version = %q, %v; want the linked version 0.0.0-test", v, err)
	}
	if v, err := exec.Command(filepath.Join(out, "meshctl"), "version").Output(); err != nil || strings.TrimSpace(string(v)) != "0.0.0-test" {
		t.Errorf("meshctl version = %q, %v; want the linked version 0.0.0-test", v, err)
	}
	if v, err := exec.Command(filepath.Join(out, "meshctl"), "--version").Output(); err != nil || !strings.Contains(string(v), "0.0.0-test") {
		t.Errorf("meshctl --version = %q, %v; want the linked version", v, err)
	}
}
