package mirror

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// The About API (KEP-2149): a cluster-scoped ClusterProperty whose name is
// the property and spec.value its value. The sigs.k8s.io/about-api module is
// not used: this is the whole type meshd needs.
var ClusterPropertyGVR = schema.GroupVersionResource{Group: "about.k8s.io", Version: "v1alpha1", Resource: "clusterproperties"}

const (
	// ClusterIDProperty is the ClusterProperty naming this cluster in its
	// clusterset (KEP-2149).
	ClusterIDProperty = "cluster.clusterset.k8s.io"
	// ClusterPropertyKind is the About API's kind.
	ClusterPropertyKind = "ClusterProperty"
)

// ClusterProperty is the About API's ClusterProperty.
type ClusterProperty struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ClusterPropertySpec `json:"spec"`
}

// ClusterPropertySpec is the value of a ClusterProperty.
type ClusterPropertySpec struct {
	Value string `json:"value"`
}

func clusterPropertyValue(u *unstructured.Unstructured) string {
	v, _, _ := unstructured.NestedString(u.Object, "spec", "value")
	return v
}

// validClusterID: a cluster ID names EndpointSlices' source-cluster label and
// DNS names (<host>.<cluster>.<svc>...), so it must be a DNS label.
func validClusterID(id string) error {
	if errs := validation.IsDNS1123Label(id); len(errs) > 0 {
		return fmt.Errorf("cluster ID %q is not a DNS label: %s", id, strings.Join(errs, "; "))
	}
	return nil
}

// EnsureClusterID returns this cluster's ID: the value of the ClusterProperty
// cluster.clusterset.k8s.io, created with the kube-system namespace's UID
// (KEP-2149's recommendation) when absent. Without the ClusterProperty CRD
// the UID is used and the reason logged.
func EnsureClusterID(ctx context.Context, log *slog.Logger, kube kubernetes.Interface, dyn dynamic.Interface) (string, error) {
	api := dyn.Resource(ClusterPropertyGVR)
	u, err := api.Get(ctx, ClusterIDProperty, metav1.GetOptions{})
	if err == nil {
		id := clusterPropertyValue(u)
		if err := validClusterID(id); err != nil {
			return "", fmt.Errorf("ClusterProperty %s: %w", ClusterIDProperty, err)
		}
		return id, nil
	}
	noCRD := meta.IsNoMatchError(err) || (apierrors.IsNotFound(err) && !served(kube, ClusterPropertyGVR))
	if !apierrors.IsNotFound(err) && !noCRD {
		return "", fmt.Errorf("reading ClusterProperty %s: %w", ClusterIDProperty, err)
	}
	ns, err := kube.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the kube-system namespace for the default cluster ID: %w", err)
	}
	id := string(ns.UID)
	if noCRD {
		log.Error("the ClusterProperty CRD (about.k8s.io) is not installed: using the kube-system namespace UID as the cluster ID without recording it; install manifests/components/mcs-crds (docs/mcs.md)", "clusterID", id)
		return id, nil
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ClusterPropertyGVR.GroupVersion().String(),
		"kind":       ClusterPropertyKind,
		"metadata": map[string]any{
			"name":   ClusterIDProperty,
			"labels": map[string]any{liveness.LabelManagedBy: liveness.ManagedBy},
		},
		"spec": map[string]any{"value": id},
	}}
	created, err := api.Create(ctx, obj, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		// Another writer was faster: its value counts.
		if u, err = api.Get(ctx, ClusterIDProperty, metav1.GetOptions{}); err != nil {
			return "", fmt.Errorf("reading ClusterProperty %s: %w", ClusterIDProperty, err)
		}
		id = clusterPropertyValue(u)
	case err != nil:
		return "", fmt.Errorf("creating ClusterProperty %s: %w", ClusterIDProperty, err)
	default:
		id = clusterPropertyValue(created)
		log.Info("created ClusterProperty "+ClusterIDProperty+" (the kube-system namespace UID)", "clusterID", id)
	}
	return id, validClusterID(id)
}

// served reports whether the API server serves gvr (its CRD is installed).
func served(kube kubernetes.Interface, gvr schema.GroupVersionResource) bool {
	l, err := kube.Discovery().ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if err != nil {
		return false
	}
	for _, r := range l.APIResources {
		if r.Name == gvr.Resource {
			return true
		}
	}
	return false
}

// remoteClusterID reads a source cluster's ID with its (read-only)
// credentials: its ClusterProperty, else its kube-system namespace UID (the
// default the cluster's own meshd records), else fallback (the link name).
func remoteClusterID(ctx context.Context, r Remote, fallback string) (string, string) {
	if u, err := r.Dynamic.Resource(ClusterPropertyGVR).Get(ctx, ClusterIDProperty, metav1.GetOptions{}); err == nil {
		if id := clusterPropertyValue(u); validClusterID(id) == nil {
			return id, "ClusterProperty " + ClusterIDProperty
		}
	}
	if ns, err := r.Kube.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err == nil && ns.UID != "" {
		return string(ns.UID), "kube-system namespace UID"
	}
	return fallback, "link name (neither ClusterProperty nor the kube-system namespace is readable)"
}
