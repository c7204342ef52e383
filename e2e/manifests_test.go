//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// kubectlIn runs the testbed's kubectl with stdin, inside the control-plane
// namespace (where the API server is reachable).
func kubectlIn(t *testing.T, stdin []byte, args ...string) (string, error) {
	t.Helper()
	argv := append([]string{"netns", "exec", tb.CPNS, filepath.Join(tb.KubeDir, "kubectl"), "--kubeconfig", tb.Kubeconfig}, args...)
	cmd := osexec.Command("ip", argv...)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// render runs a local command (kustomize, helm) and returns its stdout.
func render(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := osexec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// overlayOf writes, in a temporary directory it returns, a kustomization of
// manifests with those of the named components that exist.
func overlayOf(t *testing.T, manifests string, components ...string) string {
	t.Helper()
	dir := t.TempDir()
	var lines []string
	for _, c := range components {
		if _, err := os.Stat(filepath.Join(manifests, "components", c)); err == nil {
			rel, _ := filepath.Rel(dir, filepath.Join(manifests, "components", c))
			lines = append(lines, "- "+rel)
		}
	}
	rel, _ := filepath.Rel(dir, manifests)
	kust := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\ncomponents:\n%s\n", rel, strings.Join(lines, "\n"))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestManifestsAcceptedByAPIServer: every object meshd ships — the default
// kustomization, each optional component and the Helm chart with its options
// on — is accepted by the real API server (server-side dry run: admission,
// schema, CEL), so `kubectl apply -k manifests/` cannot fail on a typo.
func TestManifestsAcceptedByAPIServer(t *testing.T) {
	newScenario(t, false)
	kubectl := filepath.Join(tb.KubeDir, "kubectl")
	manifests := filepath.Join(tb.RepoRoot, "manifests")

	// An overlay with every component whose API exists on a bare cluster
	// (components/prometheus needs the prometheus-operator CRDs), and one
	// without cluster links.
	overlay := overlayOf(t, manifests, "userspace-sidecar", "mirror", "cluster-links", "mcs-crds")
	noLinks := overlayOf(t, manifests, "no-cluster-links")
	withoutLinks := render(t, kubectl, "kustomize", noLinks)
	if bytes.Contains(withoutLinks, []byte("meshd-link")) || !bytes.Contains(withoutLinks, []byte("- --cluster-links=false\n")) {
		t.Errorf("components/no-cluster-links leaves link controller objects or cluster links on:\n%s", withoutLinks)
	}

	docs := map[string][]byte{
		"kubectl kustomize manifests/":     render(t, kubectl, "kustomize", manifests),
		"manifests/ with the components":   render(t, kubectl, "kustomize", overlay),
		"manifests/ without cluster links": withoutLinks,
	}
	if helm, err := osexec.Command(filepath.Join(tb.RepoRoot, "hack", "helm.sh"), "--bin").Output(); err == nil {
		h := strings.TrimSpace(string(helm))
		chart := filepath.Join(tb.RepoRoot, "charts", "meshd")
		// The chart's kubeVersion is checked against this (helm's default is v1.20).
		kv := os.Getenv("KUBE_VERSION")
		if kv == "" {
			kv = "v1.36.3"
		}
		docs["helm template (defaults)"] = render(t, h, "template", "meshd", chart, "-n", "meshd-system", "--include-crds", "--kube-version", kv)
		docs["helm template (sidecar, mirror)"] = render(t, h, "template", "meshd", chart, "-n", "meshd-system", "--kube-version", kv,
			"--set", "userspaceSidecar=true", "--set", "mirror.enabled=true", "--set", "meshGranularity=full",
			"--set", "clusterLinks.enabled=true", "--set", "mcsCRDs.install=true",
			// The dashboard ConfigMap is core; PodMonitor/PrometheusRule need CRDs the testbed lacks.
			"--set", "metrics.dashboard.enabled=true", "--set", "updateStrategy.maxUnavailable=25%")
	} else if os.Getenv("CI") != "" {
		t.Fatalf("hack/helm.sh --bin: %v (make test builds helm first)", err)
	} else {
		t.Logf("helm not available (%v): chart not dry-run here; `make charts` builds it", err)
	}
	for what, data := range docs {
		if !bytes.Contains(data, []byte("kind: DaemonSet")) {
			t.Errorf("%s renders no DaemonSet", what)
		}
		out, err := kubectlIn(t, data, "apply", "--dry-run=server", "-f", "-")
		if err != nil {
			t.Errorf("%s: the API server refuses it: %v\n%s", what, err, out)
			continue
		}
		t.Logf("%s: accepted (%d objects)", what, strings.Count(out, "(server dry run)"))
	}
}
