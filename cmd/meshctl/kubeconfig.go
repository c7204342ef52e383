package main

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/pkg/k8s/connect"
)

// newClients builds the clients for a kubeconfig (empty: in a pod the
// in-cluster configuration, else $KUBECONFIG, then ~/.kube/config) and a
// context in it (empty: its current context).
func newClients(kubeconfig, kubecontext string) (*connect.Clients, error) {
	if kubecontext == "" {
		return connect.NewClients(kubeconfig)
	}
	cfg, err := clientConfig(kubeconfig, kubecontext).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading context %q of %s: %w", kubecontext, kubeconfigName(kubeconfig), err)
	}
	cfg.UserAgent = "meshctl"
	return connect.NewClientsForConfig(cfg)
}

// clientConfig is the kubeconfig (empty: $KUBECONFIG, then ~/.kube/config)
// with kubecontext (empty: the current one) selected.
func clientConfig(kubeconfig, kubecontext string) clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubecontext})
}

// contextName is the context meshctl uses of the kubeconfig: kubecontext,
// else the kubeconfig's current context ("" when it cannot be read).
func contextName(kubeconfig, kubecontext string) string {
	if kubecontext != "" {
		return kubecontext
	}
	raw, err := clientConfig(kubeconfig, "").RawConfig()
	if err != nil {
		return ""
	}
	return raw.CurrentContext
}

func kubeconfigName(kubeconfig string) string {
	if kubeconfig == "" {
		return "the kubeconfig ($KUBECONFIG, then ~/.kube/config)"
	}
	return "kubeconfig " + kubeconfig
}
