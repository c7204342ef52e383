//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"meshd.io/meshd/e2e/testbed"
)

// imageMaxBytes is the size budget of the meshd image.
const imageMaxBytes = 100_000_000

// TestImageNodeAgent builds the image with `make image` (podman, no
// registry) and runs meshd FROM IT as the node agent of one node, the way
// the DaemonSet of `kubectl kustomize manifests/` runs it: its container
// args, env, securityContext, volumes and readiness probe are read from the
// rendered manifests (not copied), its API access is the in-cluster config
// of the manifests' ServiceAccount. Two host-built meshd nodes run next to
// it; pods on all three reach each other (ping and TCP), and the image
// node's WireGuard, routes and iptables chains come from the image's own
// wg, ip and iptables.
func TestImageNodeAgent(t *testing.T) {
	if !meshdAvailable {
		t.Skip("./cmd/meshd does not exist yet")
	}
	ref := "localhost/meshd-e2e:" + strings.TrimSuffix(tb.Prefix, "-")
	podman := buildImage(t, ref)
	ds, c := manifestDaemonSet(t)

	s := newScenario(t, true)
	s.location("a", false)
	s.location("b", false)
	img := s.node(testbed.NodeOptions{Name: "img", Location: "a"})
	hosts := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "h1", Location: "b"}),
		s.node(testbed.NodeOptions{Name: "h2", Location: "b"}),
	}
	all := append([]*testbed.Node{img}, hosts...)

	// What an operator's overlay adds (docs/install.md: set the service
	// CIDR), plus the testbed's shorter resync and debug logs, which the
	// host-built nodes get too. Appended: a later flag wins.
	overlay := []string{"--service-cidr=" + testbed.ServiceCIDR, "--resync-period=5s", "--log-level=debug"}
	agent := podman.run(t, img, ds, c, ref, overlay)
	s.startMeshd(hosts)
	agent.waitReady(t, s.ctx, c, 90*time.Second)

	pairs(all, func(a, b *testbed.Node) {
		s.pingEventually(pod(a), pod(b).IP, 60*time.Second)
	})
	for _, h := range hosts {
		if err := pod(img).Transfer(s.ctx, pod(h), pod(h).IP, 2<<20); err != nil {
			t.Errorf("TCP img -> %s: %v", h.Name, err)
		}
		if err := pod(h).Transfer(s.ctx, pod(img), pod(img).IP, 2<<20); err != nil {
			t.Errorf("TCP %s -> img: %v", h.Name, err)
		}
	}

	// The image node is alone in its location, so it is the leader there:
	// its (userspace) WireGuard device, configured by the image's meshd and
	// readable with the host's wg through the node's UAPI socket, has the
	// other location's leader as its one peer, with a handshake.
	key := s.pubKey(img)
	s.eventually(30*time.Second, time.Second, "image node's WireGuard peer", func() error {
		d, err := img.WG(s.ctx, "meshd0")
		if err != nil {
			return err
		}
		if d.PublicKey != key {
			return fmt.Errorf("interface key %s, annotation %s", d.PublicKey, key)
		}
		if len(d.Peers) != 1 || d.Peers[0].LatestHandshake.IsZero() {
			return fmt.Errorf("peers %+v: want one with a handshake", d.Peers)
		}
		return nil
	})
	// The image's iptables (nft, the default alternative) wrote meshd's
	// chains into the node's namespace; the image's wg and ip see the device.
	if out, err := img.Exec(s.ctx, "iptables-save"); err != nil || !strings.Contains(out, ":MESHD-") {
		t.Errorf("no MESHD chains in the image node's iptables (%v):\n%s", err, out)
	}
	for _, cmd := range [][]string{{"wg", "show", "meshd0", "public-key"}, {"ip", "-br", "link", "show", "meshd0"}} {
		out, err := agent.exec(cmd...)
		if err != nil || strings.TrimSpace(out) == "" {
			t.Errorf("%s inside the container: %v\n%s", strings.Join(cmd, " "), err, out)
		} else if cmd[0] == "wg" && strings.TrimSpace(out) != key {
			t.Errorf("wg inside the container shows key %q, want %q", strings.TrimSpace(out), key)
		}
	}
	// The version the image was stamped with is the one meshd reports.
	want := strings.TrimSpace(imageGit(t, "describe", "--tags", "--always", "--dirty"))
	if v, err := agent.exec("meshd", "--version"); err != nil || strings.TrimSpace(v) != want {
		t.Errorf("meshd --version in the image = %q, %v; want %q (git describe)", strings.TrimSpace(v), err, want)
	}
	if v, err := agent.exec("meshctl", "version"); err != nil || strings.TrimSpace(v) != want {
		t.Errorf("meshctl version in the image = %q, %v; want %q", strings.TrimSpace(v), err, want)
	}
}

// podmanEnv runs podman with --runtime runc and the testbed's own
// containers.conf (empty default_ulimits: setting them fails here).
type podmanEnv struct{ conf string }

func (p podmanEnv) cmd(args ...string) *osexec.Cmd {
	c := osexec.Command("podman", append([]string{"--runtime", "runc"}, args...)...)
	c.Env = append(os.Environ(), "CONTAINERS_CONF="+p.conf)
	return c
}

func (p podmanEnv) output(args ...string) (string, error) {
	out, err := p.cmd(args...).CombinedOutput()
	return string(out), err
}

// buildImage builds ref with `make image` (which installs podman, runc and
// mmdebstrap when they are missing) and checks its size and labels. It
// skips the test when podman is missing and cannot be installed, except in
// CI ($CI set), where the scenario must run.
func buildImage(t *testing.T, ref string) podmanEnv {
	t.Helper()
	if _, err := osexec.LookPath("podman"); err != nil {
		out, err := osexec.Command(filepath.Join(tb.RepoRoot, "hack", "image-deps.sh")).CombinedOutput()
		if _, lerr := osexec.LookPath("podman"); err != nil || lerr != nil {
			msg := fmt.Sprintf("podman is not installed and hack/image-deps.sh could not install it (%v):\n%s", err, out)
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	start := time.Now()
	make := osexec.Command("make", "image", "IMAGE="+ref)
	make.Dir = tb.RepoRoot
	if out, err := make.CombinedOutput(); err != nil {
		t.Fatalf("make image IMAGE=%s: %v\n%s", ref, err, out)
	} else {
		t.Logf("make image IMAGE=%s: %s\n%s", ref, time.Since(start).Round(100*time.Millisecond), imageLastLines(string(out), 3))
	}
	p := podmanEnv{conf: filepath.Join(tb.Dir, "containers.conf")}
	if err := os.WriteFile(p.conf, []byte("[containers]\ndefault_ulimits = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := p.output("image", "inspect", "--format", "{{.Size}} {{json .Labels}}", ref)
	if err != nil {
		t.Fatalf("podman image inspect %s: %v\n%s", ref, err, out)
	}
	sizeText, labelsJSON, _ := strings.Cut(strings.TrimSpace(out), " ")
	size, _ := strconv.ParseInt(sizeText, 10, 64)
	t.Logf("image %s: %.1f MB", ref, float64(size)/1e6)
	if size <= 0 || size > imageMaxBytes {
		t.Errorf("image size %d bytes: want at most %d", size, imageMaxBytes)
	}
	var labels map[string]string
	if err := json.Unmarshal([]byte(labelsJSON), &labels); err != nil {
		t.Fatalf("image labels %q: %v", labelsJSON, err)
	}
	want := map[string]string{
		"org.opencontainers.image.version":  strings.TrimSpace(imageGit(t, "describe", "--tags", "--always", "--dirty")),
		"org.opencontainers.image.revision": strings.TrimSpace(imageGit(t, "rev-parse", "HEAD")),
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("image label %s = %q, want %q", k, labels[k], v)
		}
	}
	for _, k := range []string{"org.opencontainers.image.source", "org.opencontainers.image.created"} {
		if labels[k] == "" || labels[k] == "unknown" {
			t.Errorf("image label %s = %q, want it set", k, labels[k])
		}
	}
	return p
}

// manifestDaemonSet renders manifests/ with kustomize (the install the docs
// describe, with the kustomization's patches) and returns the DaemonSet and
// its meshd container.
func manifestDaemonSet(t *testing.T) (*appsv1.DaemonSet, *corev1.Container) {
	t.Helper()
	out := render(t, filepath.Join(tb.KubeDir, "kubectl"), "kustomize", filepath.Join(tb.RepoRoot, "manifests"))
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal(doc, &ds); err != nil {
			t.Fatalf("manifests: %v", err)
		}
		if ds.Kind != "DaemonSet" || ds.Name != "meshd" {
			continue
		}
		for i := range ds.Spec.Template.Spec.Containers {
			if c := &ds.Spec.Template.Spec.Containers[i]; c.Name == "meshd" {
				return &ds, c
			}
		}
	}
	t.Fatal("kubectl kustomize manifests/: no DaemonSet meshd with a container meshd")
	return nil, nil
}

// imageAgent is meshd running in a container inside a node's network namespace.
type imageAgent struct {
	p    podmanEnv
	n    *testbed.Node
	name string
	proc *osexec.Cmd
	done chan struct{}
}

// run starts the container the DaemonSet describes on node n: ds's meshd
// container c with image ref, args c.Args + extra, in n's network namespace.
// hostPath volumes of per-node state map to the node's own directories (each
// testbed node has its own /var/run/wireguard and state directory); the
// in-cluster API config is the meshd ServiceAccount's token.
func (p podmanEnv) run(t *testing.T, n *testbed.Node, ds *appsv1.DaemonSet, c *corev1.Container, ref string, extra []string) *imageAgent {
	t.Helper()
	name := tb.Prefix + "agent-" + n.Name
	_, _ = p.output("rm", "-f", "-t", "0", name) // a leftover of a killed run
	args := []string{"run", "--rm", "--name", name, "--pull=never",
		"--network", "ns:/run/netns/" + n.NS,
		// No seccompProfile in the pod spec: the kubelet runs it unconfined.
		"--security-opt", "seccomp=unconfined"}

	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("the meshd container has no securityContext")
	}
	if sc.Privileged != nil && *sc.Privileged {
		args = append(args, "--privileged")
	}
	if caps := sc.Capabilities; caps != nil {
		for _, d := range caps.Drop {
			args = append(args, "--cap-drop="+strings.ToLower(string(d)))
		}
		for _, a := range caps.Add {
			args = append(args, "--cap-add="+string(a))
		}
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		args = append(args, "--read-only")
	}

	env := map[string]string{} // for $(VAR) in the args, as the kubelet expands them
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			args = append(args, "--env", e.Name+"="+e.Value)
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			args = append(args, "--env", e.Name+"="+n.Name)
			env[e.Name] = n.Name
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP":
			args = append(args, "--env", e.Name+"="+n.IP.String())
			env[e.Name] = n.IP.String()
		default:
			t.Fatalf("env %s of the meshd container: this test does not know its source %+v", e.Name, e.ValueFrom)
		}
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	// Per-node host paths: where the testbed keeps each node's own copy.
	perNode := map[string]string{
		"/var/lib/meshd":     filepath.Join(n.Dir, "state"),
		"/var/run/wireguard": filepath.Join(n.Dir, "run", "wireguard"),
		"/run/wireguard":     filepath.Join(n.Dir, "run", "wireguard"),
	}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("volumeMount %s: no such volume in the DaemonSet", m.Name)
		}
		switch {
		case v.HostPath != nil:
			src := v.HostPath.Path
			if d, ok := perNode[src]; ok {
				src = d
			} else if _, err := os.Stat(src); os.IsNotExist(err) && (v.HostPath.Type == nil ||
				*v.HostPath.Type == corev1.HostPathUnset || *v.HostPath.Type == corev1.HostPathDirectoryOrCreate) {
				// The container runtime would create the missing directory
				// (e.g. /lib/modules on this kernel without modules); an
				// empty one of the node's, instead of touching the host.
				src = filepath.Join(n.Dir, "hostpath", strings.ReplaceAll(strings.Trim(src, "/"), "/", "_"))
				if err := os.MkdirAll(src, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathFileOrCreate {
				if f, err := os.OpenFile(src, os.O_CREATE|os.O_RDONLY, 0o600); err == nil {
					f.Close()
				}
			}
			opt := ""
			if m.ReadOnly {
				opt = ":ro"
			}
			args = append(args, "--volume", src+":"+m.MountPath+opt)
		case v.EmptyDir != nil:
			opt := "rw"
			if v.EmptyDir.SizeLimit != nil {
				opt += ",size=" + strconv.FormatInt(v.EmptyDir.SizeLimit.Value(), 10)
			}
			args = append(args, "--tmpfs", m.MountPath+":"+opt)
		default:
			t.Fatalf("volume %s: this test knows hostPath and emptyDir only", m.Name)
		}
	}

	// The in-cluster config: the ServiceAccount token and CA where client-go
	// looks for them, and the API server's address in the environment.
	kc, err := clientcmd.LoadFromFile(tb.MeshdKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kctx := kc.Contexts[kc.CurrentContext]
	if kctx == nil || kc.Clusters[kctx.Cluster] == nil || kc.AuthInfos[kctx.AuthInfo] == nil {
		t.Fatalf("%s: no current context with a cluster and a user", tb.MeshdKubeconfig)
	}
	sa := filepath.Join(n.Dir, "serviceaccount")
	if err := os.MkdirAll(sa, 0o700); err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string][]byte{
		"token":     []byte(kc.AuthInfos[kctx.AuthInfo].Token),
		"ca.crt":    kc.Clusters[kctx.Cluster].CertificateAuthorityData,
		"namespace": []byte(ds.Namespace),
	} {
		if err := os.WriteFile(filepath.Join(sa, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args = append(args, "--volume", sa+":/var/run/secrets/kubernetes.io/serviceaccount:ro",
		"--env", "KUBERNETES_SERVICE_HOST="+testbed.APIServerAddr.String(),
		"--env", "KUBERNETES_SERVICE_PORT="+strconv.Itoa(testbed.APIServerPort))

	args = append(args, ref)
	args = append(args, c.Command...) // none: the image's ENTRYPOINT is meshd
	for _, a := range c.Args {
		for k, v := range env {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		args = append(args, a)
	}
	args = append(args, extra...)
	t.Logf("image node %s: podman %s", n.Name, strings.Join(args, " "))

	log, err := os.OpenFile(n.MeshdLog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := p.cmd(args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("podman run: %v", err)
	}
	a := &imageAgent{p: p, n: n, name: name, proc: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(a.done) }()
	// Registered after newScenario's: runs before its reset removes the
	// node's namespace. SIGTERM (podman stop) like the kubelet.
	t.Cleanup(func() {
		if out, err := p.output("stop", "-t", "10", name); err != nil && !strings.Contains(out, "no such container") {
			t.Logf("podman stop %s: %v: %s", name, err, out)
		}
		select {
		case <-a.done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-a.done
		}
		_, _ = p.output("rm", "-f", "-t", "0", name)
	})
	return a
}

// waitReady polls the container's readiness probe (from the manifest) until
// it answers 200.
func (a *imageAgent) waitReady(t *testing.T, ctx context.Context, c *corev1.Container, timeout time.Duration) {
	t.Helper()
	rp := c.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil {
		t.Fatal("the meshd container has no HTTP readiness probe")
	}
	// The kubelet probes a host-network Pod at its pod IP: the node's.
	host := rp.HTTPGet.Host
	if host == "" {
		host = a.n.IP.String()
	}
	url := fmt.Sprintf("http://%s%s", net.JoinHostPort(host, rp.HTTPGet.Port.String()), rp.HTTPGet.Path)
	deadline := time.Now().Add(timeout)
	var last string
	for {
		select {
		case <-a.done:
			t.Fatalf("the meshd container on %s exited:\n%s", a.n.Name, testbed.Tail(a.n.MeshdLog(), 40))
		default:
		}
		code, body, err := a.n.HTTPGet(ctx, url)
		if err == nil && code == 200 {
			return
		}
		last = fmt.Sprintf("%d %s %v", code, strings.TrimSpace(body), err)
		if time.Now().After(deadline) {
			t.Fatalf("the meshd container on %s is not ready after %s (%s: %s):\n%s", a.n.Name, timeout, url, last, testbed.Tail(a.n.MeshdLog(), 40))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// exec runs cmd inside the running container.
func (a *imageAgent) exec(cmd ...string) (string, error) {
	return a.p.output(append([]string{"exec", a.name}, cmd...)...)
}

func imageGit(t *testing.T, args ...string) string {
	t.Helper()
	cmd := osexec.Command("git", args...)
	cmd.Dir = tb.RepoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

func imageLastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
