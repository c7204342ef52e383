package mirror

import (
	"bytes"
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"meshd.io/meshd/pkg/clusterlink"
)

// WatchLinks adds and removes remote clusters as the cluster-link Secrets
// (label meshd.io/cluster-link=true) in namespace come and go, until ctx
// ends. Once the Secrets are listed and the local caches synced, mirrors of
// clusters no longer linked are deleted. A Secret that becomes unusable
// keeps the cluster it linked (with its mirrors) as it was.
func (c *Controller) WatchLinks(ctx context.Context, kube kubernetes.Interface, namespace string) error {
	return c.watchLinks(ctx, kube, namespace, func(name string, kc []byte) (Remote, error) {
		cfg, err := clusterlink.RESTConfig(kc)
		if err != nil {
			return Remote{}, fmt.Errorf("parsing the kubeconfig of cluster %s: %w", name, err)
		}
		return NewRemote(name, cfg)
	})
}

// linkState is what a link Secret last gave.
type linkState struct {
	cluster string
	kc      []byte
}

func (c *Controller) watchLinks(ctx context.Context, kube kubernetes.Interface, namespace string, newRemote func(string, []byte) (Remote, error)) error {
	links := map[string]linkState{} // by Secret name; callbacks run one at a time
	upsert := func(s *corev1.Secret) {
		// The mirror needs only the cluster's name and kubeconfig; the mesh
		// settings of the link are the node daemon's business.
		settings, _, err := clusterlink.LinkFromSecret(s)
		kc := s.Data[clusterlink.LinkKubeconfigKey]
		if settings.Name != "" && len(kc) > 0 {
			err = nil
		}
		if err != nil {
			c.log.Error("cannot use cluster link; keeping what it linked", "secret", s.Namespace+"/"+s.Name, "error", err)
			return
		}
		old, had := links[s.Name]
		if had && old.cluster == settings.Name && bytes.Equal(old.kc, kc) {
			return
		}
		r, err := newRemote(settings.Name, kc)
		if err == nil {
			err = c.AddRemote(r)
		}
		if err != nil {
			c.log.Error("cannot use cluster link; keeping what it linked", "secret", s.Namespace+"/"+s.Name, "cluster", settings.Name, "error", err)
			return
		}
		if had && old.cluster != settings.Name {
			c.RemoveRemote(old.cluster)
		}
		links[s.Name] = linkState{cluster: settings.Name, kc: kc}
		c.log.Info("mirroring exports of linked cluster", "cluster", settings.Name, "secret", s.Namespace+"/"+s.Name)
	}
	return clusterlink.WatchLinkSecrets(ctx, kube, namespace, c.opts.Resync, clusterlink.LinkSecretEvents{
		Upsert: upsert,
		Delete: func(name string) {
			if l, ok := links[name]; ok {
				delete(links, name)
				c.log.Info("cluster unlinked; deleting its mirrors", "cluster", l.cluster)
				c.RemoveRemote(l.cluster)
			}
		},
		// Every link is known: once the local caches have synced too,
		// mirrors of clusters no longer linked can be deleted.
		Synced: func() {
			go func() {
				select {
				case <-ctx.Done():
				case <-c.localSynced:
					c.allKnown.Store(true)
					c.enqueueAllLocal()
					c.mcs.enqueueAll("")
				}
			}()
		},
	})
}
