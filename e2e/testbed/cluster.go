//go:build e2e

package testbed

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Settings of the main cluster (the testbed's own control plane), for code
// that handles the main cluster and extra clusters alike.
const (
	// PodCIDRPrefix is the main cluster's pod network: node N has
	// 10.42.N.0/24.
	PodCIDRPrefix = "10.42.0.0/16"
)

// ClusterOptions describe an extra cluster (AddCluster).
type ClusterOptions struct {
	// Name (DNS label, at most 6 characters): namespace PREFIX+"cp-"+Name,
	// directory Dir/clusters/<name>.
	Name string
	// Addr is the API server's address on the WAN segment (203.0.113.0/24,
	// e.g. 203.0.113.3; .1 is the router, .2 the main control plane, .10+
	// external hosts, .100+ NAT boxes).
	Addr netip.Addr
	// ServiceCIDR is its --service-cluster-ip-range and meshd's
	// --service-cidr. It must not overlap the main cluster's 10.96.0.0/12.
	ServiceCIDR string
	// MeshCIDR is meshd's --mesh-cidr on its nodes.
	MeshCIDR string
	// PodOctet is the second octet of its pod network: node N gets
	// 10.<PodOctet>.N.0/24 (the main cluster has 42).
	PodOctet int
}

// Cluster is an extra, independent Kubernetes control plane (its own etcd
// and kube-apiserver in namespace PREFIX+"cp-"+Name) on the same simulated
// underlay as the main one, so nodes of both can reach each other. Nodes join
// it with NodeOptions.Cluster. It lives until Reset (its processes are
// per-scenario).
type Cluster struct {
	ClusterOptions
	tb *Testbed

	NS  string // PREFIX+"cp-"+Name
	Dir string // Dir/clusters/<name>
	// Kubeconfig is the admin kubeconfig (server https://Addr:6443),
	// usable from every namespace of the testbed.
	Kubeconfig string
	Token      string
	// MeshdKubeconfig authenticates as the manifests' meshd ServiceAccount
	// (least-privilege RBAC), like the main cluster's.
	MeshdKubeconfig string
	RESTConfig      *rest.Config
	Kube            kubernetes.Interface
	Dynamic         dynamic.Interface
}

// PodCIDR is the cluster's pod network 10.<PodOctet>.0.0/16.
func (c *Cluster) PodCIDR() string { return fmt.Sprintf("10.%d.0.0/16", c.PodOctet) }

// APIServer is the cluster's API server URL.
func (c *Cluster) APIServer() string { return fmt.Sprintf("https://%s:%d", c.Addr, APIServerPort) }

// AddCluster starts an extra control plane: a namespace attached to the WAN
// bridge at o.Addr running etcd and kube-apiserver (same ports as the main
// one, in their own namespace), a kubeconfig in Dir/clusters/<name>, the
// lease namespace and the CRDs. Reset stops it and removes its namespace.
func (tb *Testbed) AddCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	if !nameRE.MatchString(o.Name) || len(o.Name) > 6 {
		return nil, fmt.Errorf("cluster name %q: want [a-z0-9-], at most 6 characters", o.Name)
	}
	if !WANPrefix.Contains(o.Addr) || o.Addr == RouterWAN || o.Addr == APIServerAddr {
		return nil, fmt.Errorf("cluster %s: address %v is not a free address of %v", o.Name, o.Addr, WANPrefix)
	}
	if o.PodOctet <= 0 || o.PodOctet > 255 || o.PodOctet == 42 {
		return nil, fmt.Errorf("cluster %s: pod octet %d: want 1-255 but not 42", o.Name, o.PodOctet)
	}
	tb.mu.Lock()
	for _, c := range tb.clusters {
		if c.Name == o.Name || c.Addr == o.Addr || c.PodOctet == o.PodOctet {
			tb.mu.Unlock()
			return nil, fmt.Errorf("cluster %s clashes with cluster %s", o.Name, c.Name)
		}
	}
	tb.mu.Unlock()
	c := &Cluster{ClusterOptions: o, tb: tb, NS: tb.Prefix + "cp-" + o.Name, Dir: filepath.Join(tb.Dir, "clusters", o.Name)}
	if err := os.MkdirAll(filepath.Join(c.Dir, "certs"), 0o700); err != nil {
		return nil, err
	}
	if err := tb.newNetns(ctx, c.NS, false); err != nil {
		return nil, err
	}
	tb.mu.Lock()
	tb.clusters = append(tb.clusters, c) // from now on Reset removes it
	tb.mu.Unlock()
	wanIdx := int(o.Addr.As4()[3])
	if err := tb.attach(ctx, tb.RouterNS, "br-wan", "v-cp-"+o.Name, c.NS,
		netip.PrefixFrom(o.Addr, 24), netip.PrefixFrom(addrAdd(RouterWAN6, 0x200+wanIdx), 64), RouterWAN, RouterWAN6); err != nil {
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Clusters returns the extra clusters.
func (tb *Testbed) Clusters() []*Cluster {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]*Cluster(nil), tb.clusters...)
}

func (c *Cluster) start(ctx context.Context) error {
	tb := c.tb
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return err
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	c.Token = hex.EncodeToString(tok)
	if err := os.WriteFile(filepath.Join(c.Dir, "tokens.csv"), []byte(c.Token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return err
	}
	etcd, err := tb.startProc("etcd-"+c.Name, filepath.Join(c.Dir, "etcd.log"), nsArgv(c.NS, nil,
		"etcd",
		"--name", c.Name,
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", c.Name+"=http://127.0.0.1:2380",
		"--log-level", "warn",
	))
	if err != nil {
		return err
	}
	apiserver, err := tb.startProc("kube-apiserver-"+c.Name, filepath.Join(c.Dir, "kube-apiserver.log"), nsArgv(c.NS, nil,
		filepath.Join(tb.KubeDir, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--cert-dir="+filepath.Join(c.Dir, "certs"),
		"--secure-port="+fmt.Sprint(APIServerPort),
		"--bind-address=0.0.0.0",
		"--advertise-address="+c.Addr.String(),
		"--token-auth-file="+filepath.Join(c.Dir, "tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(c.Dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(c.Dir, "sa.key"),
		"--service-cluster-ip-range="+c.ServiceCIDR,
		"--authorization-mode=RBAC",
		"--allow-privileged",
		"--profiling=false",
		"--v=1",
	))
	if err != nil {
		return err
	}
	if err := waitAPIServer(ctx, c.NS, c.APIServer()+"/readyz", c.Token, etcd, apiserver); err != nil {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	tb.Logf("cluster %s: kube-apiserver ready at %s (inside namespace %s)", c.Name, c.APIServer(), c.NS)

	ca, err := os.ReadFile(filepath.Join(c.Dir, "certs", "apiserver.crt"))
	if err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	kc := kubeconfig(c.Name, c.APIServer(), ca, "admin", c.Token)
	if err := os.WriteFile(c.Kubeconfig, []byte(kc), 0o600); err != nil {
		return err
	}
	if c.RESTConfig, c.Kube, c.Dynamic, err = apiClients(c.Kubeconfig, c.NS); err != nil {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: LeaseNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// The shipped RBAC and a token of the meshd ServiceAccount.
	for _, f := range []string{"namespace.yaml", "rbac.yaml", ClusterLinksRBAC} {
		if _, err := os.Stat(filepath.Join(tb.RepoRoot, "manifests", f)); os.IsNotExist(err) && f == ClusterLinksRBAC {
			continue
		}
		if out, err := c.Kubectl(ctx, "apply", "-f", filepath.Join(tb.RepoRoot, "manifests", f)); err != nil {
			return fmt.Errorf("cluster %s: applying manifests/%s: %w\n%s", c.Name, f, err, out)
		}
	}
	exp := int64(24 * 3600)
	tr, err := c.Kube.CoreV1().ServiceAccounts(LeaseNamespace).CreateToken(ctx, "meshd",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("cluster %s: requesting a token for ServiceAccount %s/meshd: %w", c.Name, LeaseNamespace, err)
	}
	c.MeshdKubeconfig = filepath.Join(c.Dir, "meshd.kubeconfig")
	mkc := kubeconfig(c.Name, c.APIServer(), ca, "meshd", tr.Status.Token)
	if err := os.WriteFile(c.MeshdKubeconfig, []byte(mkc), 0o600); err != nil {
		return err
	}
	// CRDs with kubectl (the main cluster's InstallCRDs is bound to it).
	crds := filepath.Join(tb.RepoRoot, "manifests", "crds")
	if out, err := c.Kubectl(ctx, "apply", "-f", crds); err != nil {
		return fmt.Errorf("cluster %s: installing CRDs: %w\n%s", c.Name, err, out)
	}
	// The MCS API and ClusterProperty CRDs of the optional component (not
	// its kustomization.yaml, which is no resource).
	mcs, _ := filepath.Glob(filepath.Join(tb.RepoRoot, "manifests", "components", "mcs-crds", "*_*.yaml"))
	args := []string{"apply"}
	for _, f := range mcs {
		args = append(args, "-f", f)
	}
	if len(mcs) > 0 {
		if out, err := c.Kubectl(ctx, args...); err != nil {
			return fmt.Errorf("cluster %s: installing the MCS CRDs: %w\n%s", c.Name, err, out)
		}
	}
	if out, err := c.Kubectl(ctx, "wait", "--for", "condition=Established", "--timeout", "30s", "crd", "--all"); err != nil {
		return fmt.Errorf("cluster %s: CRDs not established: %w\n%s", c.Name, err, out)
	}
	script := fmt.Sprintf("#!/bin/sh\n# kubectl against cluster %s of the %s testbed\nexec ip netns exec %s %s --kubeconfig %s \"$@\"\n",
		c.Name, tb.Prefix, c.NS, shellQuote(filepath.Join(tb.KubeDir, "kubectl")), shellQuote(c.Kubeconfig))
	_ = os.WriteFile(filepath.Join(c.Dir, "kubectl"), []byte(script), 0o755)
	return nil
}

// Kubectl runs kubectl (from KubeDir) against the cluster, inside its
// control-plane namespace.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{filepath.Join(c.tb.KubeDir, "kubectl"), "--kubeconfig", c.Kubeconfig}, args...)
	return run(ctx, nsArgv(c.NS, nil, argv...)...)
}

// EnsureKubeProxy builds kube-proxy into KubeDir with hack/kube-binaries.sh
// (a no-op once cached; about 20 s after kube-apiserver was built).
func (tb *Testbed) EnsureKubeProxy(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(tb.KubeDir, "kube-proxy")); err == nil {
		return nil
	}
	tb.Logf("building kube-proxy (hack/kube-binaries.sh kube-proxy)")
	out, err := run(ctx, "bash", filepath.Join(tb.RepoRoot, "hack", "kube-binaries.sh"), "kube-proxy")
	if err != nil {
		return fmt.Errorf("hack/kube-binaries.sh kube-proxy: %w\n%s", err, out)
	}
	return nil
}

// StartKubeProxy runs kube-proxy in iptables mode inside the node (see
// /work/shared/TESTBED.md: --conntrack-max-per-core=0 is required in a
// network namespace), with the node's cluster's kubeconfig and pod network;
// it waits until kube-proxy reports healthy. Build it first with
// EnsureKubeProxy.
func (n *Node) StartKubeProxy(ctx context.Context) (*Proc, error) {
	tb := n.tb
	p, err := tb.startProc("kube-proxy-"+n.Name, filepath.Join(n.Dir, "kube-proxy.log"), n.Argv(
		filepath.Join(tb.KubeDir, "kube-proxy"),
		"--kubeconfig", n.Kubeconfig(),
		"--hostname-override", n.Name,
		"--proxy-mode", "iptables",
		"--cluster-cidr", n.clusterPodCIDR(),
		"--conntrack-max-per-core=0",
		"--metrics-bind-address", "127.0.0.1:10249",
		"--healthz-bind-address", "127.0.0.1:10256",
		"--nodeport-addresses", "primary",
		"--v=1",
	))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, _, err := n.HTTPGet(ctx, "http://127.0.0.1:10256/healthz")
		if err == nil && code == 200 {
			return p, nil
		}
		if p.Exited() {
			return nil, fmt.Errorf("kube-proxy on %s exited: %w\n%s", n.Name, p.ExitErr(), tail(p.LogPath, 30))
		}
		if time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("kube-proxy on %s not healthy after 60s: %w\n%s", n.Name, err, tail(p.LogPath, 30))
			}
			return nil, fmt.Errorf("kube-proxy on %s not healthy after 60s (HTTP %d)\n%s", n.Name, code, tail(p.LogPath, 30))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Kubeconfig is the kubeconfig of the node's cluster.
func (n *Node) Kubeconfig() string {
	if n.Cluster != nil {
		return n.Cluster.Kubeconfig
	}
	return n.tb.Kubeconfig
}

// kube is the client of the node's cluster.
func (n *Node) kube() kubernetes.Interface {
	if n.Cluster != nil {
		return n.Cluster.Kube
	}
	return n.tb.Kube
}

func (n *Node) clusterPodCIDR() string {
	if n.Cluster != nil {
		return n.Cluster.PodCIDR()
	}
	return PodCIDRPrefix
}

// Object fetches the node's Node object from its own cluster.
func (n *Node) Object(ctx context.Context) (*corev1.Node, error) {
	return n.kube().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
}

// DeleteObject deletes the node's Node object from its own cluster (the
// namespace stays).
func (n *Node) DeleteObject(ctx context.Context) error {
	return n.kube().CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
}
