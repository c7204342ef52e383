//go:build e2e

package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// startControlPlane runs etcd and kube-apiserver inside the control-plane
// namespace (203.0.113.2 on the WAN segment), waits for /readyz, writes the
// kubeconfig, builds the clients, creates the lease namespace and installs
// the CRDs.
func (tb *Testbed) startControlPlane(ctx context.Context) error {
	cp := filepath.Join(tb.Dir, "controlplane")
	if err := os.MkdirAll(filepath.Join(cp, "certs"), 0o700); err != nil {
		return err
	}
	// Service-account signing key and the static admin token.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cp, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cp, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return err
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	tb.Token = hex.EncodeToString(tok)
	if err := os.WriteFile(filepath.Join(cp, "tokens.csv"), []byte(tb.Token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return err
	}

	logs := filepath.Join(tb.Dir, "logs")
	etcd, err := tb.startProc("etcd", filepath.Join(logs, "etcd.log"), nsArgv(tb.CPNS, nil,
		"etcd",
		"--name", "me2e",
		"--data-dir", filepath.Join(cp, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "me2e=http://127.0.0.1:2380",
		"--log-level", "warn",
	))
	if err != nil {
		return err
	}
	apiserver, err := tb.startProc("kube-apiserver", filepath.Join(logs, "kube-apiserver.log"), nsArgv(tb.CPNS, nil,
		filepath.Join(tb.KubeDir, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--cert-dir="+filepath.Join(cp, "certs"),
		"--secure-port="+fmt.Sprint(APIServerPort),
		"--bind-address=0.0.0.0",
		"--advertise-address="+APIServerAddr.String(),
		"--token-auth-file="+filepath.Join(cp, "tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(cp, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(cp, "sa.key"),
		"--service-cluster-ip-range="+ServiceCIDR,
		"--authorization-mode=RBAC",
		"--allow-privileged",
		"--profiling=false",
		// The node proxy (meshctl diagnose, check) dials a node's
		// InternalIP, as kubeadm configures it; the testbed's Hostname
		// addresses resolve nowhere.
		"--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
		"--v=1",
	))
	if err != nil {
		return err
	}

	// They outlive Reset.
	tb.mu.Lock()
	tb.procs = tb.procs[:len(tb.procs)-2]
	tb.cpProcs = append(tb.cpProcs, etcd, apiserver)
	tb.mu.Unlock()

	// The API server's self-signed certificate file holds the serving
	// certificate and its CA; it is written right at startup.
	certFile := filepath.Join(cp, "certs", "apiserver.crt")
	tb.Kubeconfig = filepath.Join(tb.Dir, "kubeconfig")
	url := fmt.Sprintf("https://%s:%d/readyz", APIServerAddr, APIServerPort)
	if err := waitAPIServer(ctx, tb.CPNS, url, tb.Token, etcd, apiserver); err != nil {
		return err
	}
	tb.Logf("kube-apiserver ready at https://%s:%d (inside namespace %s)", APIServerAddr, APIServerPort, tb.CPNS)

	ca, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	kc := kubeconfig("me2e", fmt.Sprintf("https://%s:%d", APIServerAddr, APIServerPort), ca, "admin", tb.Token)
	if err := os.WriteFile(tb.Kubeconfig, []byte(kc), 0o600); err != nil {
		return err
	}
	if tb.RESTConfig, tb.Kube, tb.Dynamic, err = apiClients(tb.Kubeconfig, tb.CPNS); err != nil {
		return err
	}

	if _, err := tb.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: LeaseNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := tb.InstallCRDs(ctx); err != nil {
		return err
	}
	tb.writeHelpers()
	return tb.installRBAC(ctx, ca)
}

// ClusterLinksRBAC is the ServiceAccount and RBAC of the link controller
// (`meshd link`), relative to manifests/. It gives the meshd nodes nothing.
const ClusterLinksRBAC = "link-rbac.yaml"

// installRBAC applies the shipped namespace and RBAC manifests and writes
// MeshdKubeconfig with a token of the meshd ServiceAccount.
func (tb *Testbed) installRBAC(ctx context.Context, ca []byte) error {
	// meshd runs with --cluster-links (its default, as in manifests/) here;
	// the link controller runs where a test starts it.
	for _, f := range []string{"namespace.yaml", "rbac.yaml", ClusterLinksRBAC} {
		data, err := os.ReadFile(filepath.Join(tb.RepoRoot, "manifests", f))
		if os.IsNotExist(err) && f == ClusterLinksRBAC {
			continue
		}
		if err != nil {
			return err
		}
		argv := append([]string{filepath.Join(tb.KubeDir, "kubectl"), "--kubeconfig", tb.Kubeconfig}, "apply", "-f", "-")
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", tb.CPNS}, argv...)...)
		cmd.Stdin = bytes.NewReader(data)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("applying manifests/%s: %w\n%s", f, err, out)
		}
	}
	exp := int64(24 * 3600)
	tr, err := tb.Kube.CoreV1().ServiceAccounts(LeaseNamespace).CreateToken(ctx, "meshd",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token for ServiceAccount %s/meshd: %w", LeaseNamespace, err)
	}
	kc := kubeconfig("me2e", fmt.Sprintf("https://%s:%d", APIServerAddr, APIServerPort), ca, "meshd", tr.Status.Token)
	tb.MeshdKubeconfig = filepath.Join(tb.Dir, "meshd.kubeconfig")
	return os.WriteFile(tb.MeshdKubeconfig, []byte(kc), 0o600)
}

// writeHelpers writes small scripts for humans into Dir: kubectl runs
// kubectl inside the control-plane namespace with the admin kubeconfig.
func (tb *Testbed) writeHelpers() {
	kubectl := filepath.Join(tb.KubeDir, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		kubectl = "kubectl"
	}
	script := fmt.Sprintf("#!/bin/sh\n# kubectl against the %s testbed (the API server lives in namespace %s)\nexec ip netns exec %s %s --kubeconfig %s \"$@\"\n",
		tb.Prefix, tb.CPNS, tb.CPNS, shellQuote(kubectl), shellQuote(tb.Kubeconfig))
	_ = os.WriteFile(filepath.Join(tb.Dir, "kubectl"), []byte(script), 0o755)
}

// Kubectl runs kubectl (from KubeDir) inside the control-plane namespace.
func (tb *Testbed) Kubectl(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{filepath.Join(tb.KubeDir, "kubectl"), "--kubeconfig", tb.Kubeconfig}, args...)
	return run(ctx, nsArgv(tb.CPNS, nil, argv...)...)
}

// InstallCRDs creates or updates every CustomResourceDefinition found in
// RepoRoot/manifests/crds/*.yaml and manifests/components/mcs-crds and waits
// until they are Established.
func (tb *Testbed) InstallCRDs(ctx context.Context) error {
	dir := filepath.Join(tb.RepoRoot, "manifests", "crds")
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	more, _ := filepath.Glob(filepath.Join(dir, "*.yml"))
	files = append(files, more...)
	// The MCS API (ServiceExport, ServiceImport) and ClusterProperty CRDs
	// of the optional component the testbed's clusters use.
	mcs, _ := filepath.Glob(filepath.Join(tb.RepoRoot, "manifests", "components", "mcs-crds", "*_*.yaml"))
	files = append(files, mcs...)
	sort.Strings(files)
	if len(files) == 0 {
		tb.Logf("WARNING: no CRDs in %s", dir)
		return nil
	}
	cs, err := apiextensions.NewForConfig(tb.RESTConfig)
	if err != nil {
		return err
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		rd := utilyaml.NewYAMLReader(bufioReader(data))
		for {
			doc, err := rd.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			var crd apiextensionsv1.CustomResourceDefinition
			if err := yaml.UnmarshalStrict(doc, &crd); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if crd.Kind != "CustomResourceDefinition" {
				continue
			}
			existing, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, err = cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{})
			case err == nil:
				crd.ResourceVersion = existing.ResourceVersion
				_, err = cs.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, &crd, metav1.UpdateOptions{})
			}
			if err != nil {
				return fmt.Errorf("installing CRD %s from %s: %w", crd.Name, f, err)
			}
			names = append(names, crd.Name)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range names {
		for {
			crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err == nil && crdEstablished(crd) {
				break
			}
			if time.Now().After(deadline) {
				if err != nil {
					return fmt.Errorf("CRD %s not established after 30s: %w", name, err)
				}
				return fmt.Errorf("CRD %s not established after 30s", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	tb.Logf("CRDs established: %s", strings.Join(names, ", "))
	return nil
}

func crdEstablished(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// kubeconfig renders a kubeconfig for one API server and one token user.
func kubeconfig(name, server string, ca []byte, user, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    certificate-authority-data: %[3]s
contexts:
- name: %[1]s
  context: {cluster: %[1]s, user: %[4]s}
current-context: %[1]s
users:
- name: %[4]s
  user: {token: %[5]s}
`, name, server, b64(ca), user, token)
}

// apiClients builds the clients of the API server that lives in network
// namespace ns from its admin kubeconfig (connections are dialled inside ns),
// and checks the kubeconfig's CA really verifies (meshd uses it too).
func apiClients(kubeconfig, ns string) (*rest.Config, kubernetes.Interface, dynamic.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, nil, nil, err
	}
	cfg.Dial = NetnsDialer(netnsPath(ns))
	cfg.QPS = 100
	cfg.Burst = 200
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	if _, err := kube.Discovery().ServerVersion(); err != nil {
		return nil, nil, nil, fmt.Errorf("talking to the API server in %s with %s: %w", ns, kubeconfig, err)
	}
	return cfg, kube, dyn, nil
}

// waitAPIServer polls url (an API server's /readyz inside network namespace
// ns) until it answers 200, failing early with the log tail if etcd or the
// API server exits, and after 90 s.
func waitAPIServer(ctx context.Context, ns, url, token string, etcd, apiserver *Proc) error {
	httpc := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			DialContext:     NetnsDialer(netnsPath(ns)),
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		},
	}
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for {
		if etcd.Exited() {
			return fmt.Errorf("etcd exited: %w\n%s", etcd.ExitErr(), tail(etcd.LogPath, 30))
		}
		if apiserver.Exited() {
			return fmt.Errorf("kube-apiserver exited: %w\n%s", apiserver.ExitErr(), tail(apiserver.LogPath, 30))
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := httpc.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after 90s: %s\n%s", last, tail(apiserver.LogPath, 30))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
