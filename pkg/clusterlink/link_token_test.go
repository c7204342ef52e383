package clusterlink

import (
	"context"
	"net/netip"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/mesh"
)

// GrantLink gets its token from the TokenRequest API (no token controller
// needed), bound to the anchor Secret and valid for LinkTokenLifetime;
// RevokeLink deletes the anchor (which invalidates the token) and the link
// Secret.
func TestGrantLinkRequestsBoundToken(t *testing.T) {
	ctx := context.Background()
	ns := "meshd-system"
	fromKube := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	toKube := fake.NewClientset()
	var got *authenticationv1.TokenRequest
	fromKube.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "token" {
			return false, nil, nil
		}
		got = ca.GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		tr := got.DeepCopy()
		tr.Status.Token = "the-token"
		return true, tr, nil
	})
	from := &connect.Clients{Kube: fromKube, Config: &rest.Config{Host: "https://c1:6443", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("CA")}}}
	to := &connect.Clients{Kube: toKube, Config: &rest.Config{Host: "https://c2:6443"}}
	settings := LinkSettings{Name: "cluster1", ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		Granularity: mesh.GranularityLocation, MeshCIDRs: []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}, Port: 51820}
	if err := GrantLink(ctx, from, settings, "", to, "cluster2", ns); err != nil {
		t.Fatal(err)
	}

	anchor, err := fromKube.CoreV1().Secrets(ns).Get(ctx, LinkTokenAnchor("cluster2"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("anchor Secret: %v", err)
	}
	if anchor.Type != corev1.SecretTypeOpaque {
		t.Errorf("anchor Secret type %q, want Opaque (no legacy long-lived token)", anchor.Type)
	}
	if got == nil {
		t.Fatal("no TokenRequest was made")
	}
	if got.Spec.ExpirationSeconds == nil || time.Duration(*got.Spec.ExpirationSeconds)*time.Second != LinkTokenLifetime {
		t.Errorf("ExpirationSeconds %v, want %v", got.Spec.ExpirationSeconds, LinkTokenLifetime)
	}
	if r := got.Spec.BoundObjectRef; r == nil || r.Kind != "Secret" || r.APIVersion != "v1" || r.Name != anchor.Name || r.UID != anchor.UID {
		t.Errorf("BoundObjectRef %+v, want the anchor Secret %s (uid %q)", r, anchor.Name, anchor.UID)
	}

	link, err := toKube.CoreV1().Secrets(ns).Get(ctx, LinkSecretPrefix+"cluster1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("link Secret: %v", err)
	}
	ls, kc, err := LinkFromSecret(link)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Name != "cluster1" || len(ls.ServiceCIDRs) != 1 || ls.ServiceCIDRs[0].String() != "10.96.0.0/12" {
		t.Errorf("link settings %+v", ls)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://c1:6443" || cfg.BearerToken != "the-token" || string(cfg.CAData) != "CA" || cfg.Insecure {
		t.Errorf("link kubeconfig: host %q token %q CA %q insecure %v", cfg.Host, cfg.BearerToken, cfg.CAData, cfg.Insecure)
	}

	if err := RevokeLink(ctx, from, "cluster1", to, "cluster2", ns); err != nil {
		t.Fatal(err)
	}
	if _, err := fromKube.CoreV1().Secrets(ns).Get(ctx, anchor.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("anchor Secret after RevokeLink: %v, want NotFound", err)
	}
	if _, err := toKube.CoreV1().Secrets(ns).Get(ctx, link.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("link Secret after RevokeLink: %v, want NotFound", err)
	}
}
