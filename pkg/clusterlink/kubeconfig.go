package clusterlink

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// RESTConfig builds the client configuration of a link Secret's kubeconfig
// (LinkKubeconfigKey), refusing one that would make its reader run a
// program or read its own files: a link Secret is data anyone who may
// write Secrets in the namespace can change, while its readers are the
// link controller and mirror pods and the machine of whoever runs meshctl.
// A link kubeconfig (what `meshctl link` writes) carries everything
// inline: the server, its CA (certificate-authority-data) and a token or
// client certificate data. Refused, in any user or cluster of the file:
// exec credential plugins, auth-provider plugins, tokenFile, and
// certificate, key and CA file paths. Every reader of link Secrets (the
// link controller, the mirror, meshctl) builds its clients here.
func RESTConfig(kc []byte) (*rest.Config, error) {
	cfg, err := clientcmd.Load(kc)
	if err != nil {
		return nil, err
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	return clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
}

func checkConfig(cfg *clientcmdapi.Config) error {
	var bad []string
	for _, name := range slices.Sorted(maps.Keys(cfg.AuthInfos)) {
		a := cfg.AuthInfos[name]
		if a == nil {
			continue
		}
		if a.Exec != nil {
			bad = append(bad, fmt.Sprintf("user %q runs an exec credential plugin (%q)", name, a.Exec.Command))
		}
		if a.AuthProvider != nil {
			bad = append(bad, fmt.Sprintf("user %q uses the auth-provider plugin %q", name, a.AuthProvider.Name))
		}
		for _, f := range []struct{ field, path string }{
			{"tokenFile", a.TokenFile}, {"client-certificate", a.ClientCertificate}, {"client-key", a.ClientKey},
		} {
			if f.path != "" {
				bad = append(bad, fmt.Sprintf("user %q reads the file %s: %q", name, f.field, f.path))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Clusters)) {
		if c := cfg.Clusters[name]; c != nil && c.CertificateAuthority != "" {
			bad = append(bad, fmt.Sprintf("cluster %q reads the file certificate-authority: %q", name, c.CertificateAuthority))
		}
	}
	if len(bad) > 0 {
		return errors.New("the link kubeconfig may only carry inline credentials (a token or client certificate data, and certificate-authority-data), as `meshctl link` writes it: " + strings.Join(bad, "; "))
	}
	return nil
}
