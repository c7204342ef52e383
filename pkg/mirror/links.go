package mirror

import (
	"bytes"
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/pkg/k8s"
)

// WatchLinks adds and removes remote clusters as the cluster-link Secrets
// (label meshd.io/cluster-link=true) in namespace come and go, until ctx
// ends. Once the Secrets are listed and the local caches synced, mirrors of
// clusters no longer linked are deleted. A Secret that becomes unusable
// keeps the cluster it linked (with its mirrors) as it was.
func (c *Controller) WatchLinks(ctx context.Context, kube kubernetes.Interface, namespace string) error {
	return c.watchLinks(ctx, kube, namespace, func(name string, kc []byte) (Remote, error) {
		cfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
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
	factory := informers.NewSharedInformerFactoryWithOptions(kube, c.opts.Resync,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = k8s.LabelClusterLink + "=true" }))
	inf := factory.Core().V1().Secrets().Informer()
	links := map[string]linkState{} // by Secret name; handlers run one at a time
	upsert := func(o any) {
		s, ok := o.(*corev1.Secret)
		if !ok {
			return
		}
		// The mirror needs only the cluster's name and kubeconfig; the mesh
		// settings of the link are the node daemon's business.
		settings, _, err := k8s.LinkFromSecret(s)
		kc := s.Data[k8s.LinkKubeconfigKey]
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
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, o any) { upsert(o) },
		DeleteFunc: func(o any) {
			_, name := namespaceName(o)
			if l, ok := links[name]; ok {
				delete(links, name)
				c.log.Info("cluster unlinked; deleting its mirrors", "cluster", l.cluster)
				c.RemoveRemote(l.cluster)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching link Secrets in %s: %w", namespace, err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil
	}
	select {
	case <-ctx.Done():
		return nil
	case <-c.localSynced:
	}
	c.allKnown.Store(true)
	c.enqueueAllLocal()
	<-ctx.Done()
	return nil
}
