package clusterlink

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func linkKubeconfig(t *testing.T, adjust func(*clientcmdapi.Config)) []byte {
	t.Helper()
	cfg := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"c2": {Server: "https://192.0.2.10:6443", CertificateAuthorityData: []byte("ca")}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{LinkReader: {Token: "tok"}},
		Contexts:       map[string]*clientcmdapi.Context{"c2": {Cluster: "c2", AuthInfo: LinkReader}},
		CurrentContext: "c2",
	}
	if adjust != nil {
		adjust(&cfg)
	}
	kc, err := clientcmd.Write(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// A link Secret's kubeconfig is data whoever may write Secrets in the
// namespace can change, read by the link controller and mirror pods and by
// meshctl on an operator's machine: one that would run a program or read
// the reader's files is refused, saying what and how a link kubeconfig
// looks; the inline one `meshctl link` writes is taken.
func TestRESTConfigRefusesPluginsAndFiles(t *testing.T) {
	cfg, err := RESTConfig(linkKubeconfig(t, nil))
	if err != nil {
		t.Fatalf("the kubeconfig meshctl link writes: %v", err)
	}
	if cfg.Host != "https://192.0.2.10:6443" || cfg.BearerToken != "tok" || string(cfg.CAData) != "ca" {
		t.Errorf("config %+v", cfg)
	}
	certs := linkKubeconfig(t, func(c *clientcmdapi.Config) {
		c.AuthInfos[LinkReader] = &clientcmdapi.AuthInfo{ClientCertificateData: []byte("cert"), ClientKeyData: []byte("key")}
	})
	if _, err := RESTConfig(certs); err != nil {
		t.Errorf("inline client certificate data: %v", err)
	}

	marker := filepath.Join(t.TempDir(), "ran")
	for _, c := range []struct {
		name, want string
		adjust     func(*clientcmdapi.Config)
	}{
		{"exec plugin", `runs an exec credential plugin ("/bin/sh")`, func(c *clientcmdapi.Config) {
			c.AuthInfos[LinkReader].Exec = &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh",
				Args: []string{"-c", "touch " + marker}, InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
		}},
		{"exec plugin of a user no context names", "runs an exec credential plugin", func(c *clientcmdapi.Config) {
			c.AuthInfos["other"] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{Command: "/bin/sh"}}
		}},
		{"auth-provider", `uses the auth-provider plugin "oidc"`, func(c *clientcmdapi.Config) {
			c.AuthInfos[LinkReader].AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc"}
		}},
		{"token file", `reads the file tokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token"`, func(c *clientcmdapi.Config) {
			c.AuthInfos[LinkReader] = &clientcmdapi.AuthInfo{TokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token"}
		}},
		{"client certificate file", `reads the file client-certificate: "/etc/kubernetes/pki/admin.crt"`, func(c *clientcmdapi.Config) {
			c.AuthInfos[LinkReader] = &clientcmdapi.AuthInfo{ClientCertificate: "/etc/kubernetes/pki/admin.crt", ClientKeyData: []byte("key")}
		}},
		{"client key file", `reads the file client-key: "/etc/kubernetes/pki/admin.key"`, func(c *clientcmdapi.Config) {
			c.AuthInfos[LinkReader] = &clientcmdapi.AuthInfo{ClientCertificateData: []byte("cert"), ClientKey: "/etc/kubernetes/pki/admin.key"}
		}},
		{"CA file", `cluster "c2" reads the file certificate-authority: "/etc/kubernetes/pki/ca.crt"`, func(c *clientcmdapi.Config) {
			c.Clusters["c2"] = &clientcmdapi.Cluster{Server: "https://192.0.2.10:6443", CertificateAuthority: "/etc/kubernetes/pki/ca.crt"}
		}},
	} {
		_, err := RESTConfig(linkKubeconfig(t, c.adjust))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "only carry inline credentials") {
			t.Errorf("%s: RESTConfig error %v, want one saying %q", c.name, err, c.want)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the exec plugin ran")
	}
	if _, err := RESTConfig([]byte("not: [a kubeconfig")); err == nil {
		t.Error("a kubeconfig that does not parse was taken")
	}
}
