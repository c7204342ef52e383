package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"meshd.io/meshd/pkg/k8s/convert"
)

// TestRotateKey: rotate-key sets meshd.io/rotate-key and, with --wait,
// returns once the node records the request as done, printing both keys.
func TestRotateKey(t *testing.T) {
	kube, md := fixtureClients()
	// meshd on eu-1: completes a request when it sees it.
	kube.PrependReactor("get", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.(clienttesting.GetAction).GetName() != "eu-1" {
			return false, nil, nil
		}
		n, err := kube.Tracker().Get(a.GetResource(), "", "eu-1")
		if err != nil {
			return true, nil, err
		}
		node := n.DeepCopyObject()
		ann := node.(metav1.Object).GetAnnotations()
		if r := ann[convert.AnnotationRotateKey]; r != "" && ann[convert.AnnotationRotatedKey] != r {
			ann[convert.AnnotationRotatedKey] = r
			ann[convert.AnnotationPublicKey] = pub(99).String()
			node.(metav1.Object).SetAnnotations(ann)
			_ = kube.Tracker().Update(a.GetResource(), node, "")
		}
		return true, node, nil
	})
	r := runMeshctlWith(t, kube, md, func(e *env) { e.pollInterval = time.Millisecond }, "rotate-key", "eu-1")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, pub(99).String()) || !strings.Contains(r.stdout, pub(1).String()) {
		t.Fatalf("output does not name both keys: %q", r.stdout)
	}
	n, _ := kube.CoreV1().Nodes().Get(context.Background(), "eu-1", metav1.GetOptions{})
	if n.Annotations[convert.AnnotationRotateKey] != now.UTC().Format(time.RFC3339Nano) {
		t.Fatalf("request annotation %q", n.Annotations[convert.AnnotationRotateKey])
	}
}

// TestRotateKeyErrors: an unknown node, a node without a key, and a node
// that does not complete within --timeout are clear errors (exit 1).
func TestRotateKeyErrors(t *testing.T) {
	kube, md := fixtureClients()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"rotate-key", "nope"}, `node "nope" not found; known nodes: eu-1, eu-2, us-1, us-2, us-3`},
		{[]string{"rotate-key", "us-3"}, "has no meshd.io/public-key"},
		{[]string{"rotate-key", "eu-1", "--timeout", "20ms"}, "not done within 20ms"},
	} {
		r := runMeshctlWith(t, kube, md, func(e *env) { e.pollInterval = time.Millisecond }, c.args...)
		if r.code != 1 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
	if r := runMeshctl(t, kube, md, "rotate-key"); r.code != 2 {
		t.Errorf("no NODE: exit %d, want 2", r.code)
	}
	if r := runMeshctl(t, kube, md, "rotate-key", "eu-2", "--wait=false"); r.code != 0 || !strings.Contains(r.stdout, "requested") {
		t.Errorf("--wait=false: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestRotateKeyAPIErrors: failed API calls are explained like those of the
// other commands (apiError: which call, which server, what to check), not a
// bare dial error.
func TestRotateKeyAPIErrors(t *testing.T) {
	for _, c := range []struct {
		verb string
		err  error
		want string
	}{
		{"get", errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"),
			"reading node eu-1: cannot reach the API server " + server + " (check --kubeconfig and its current context): dial tcp 127.0.0.1:6443: connect: connection refused"},
		{"get", apierrors.NewUnauthorized("no"), "reading node eu-1 on " + server + ": not authorized (check the credentials of your kubeconfig)"},
		{"patch", apierrors.NewForbidden(corev1.Resource("nodes"), "eu-1", errors.New("no")),
			"requesting the key rotation on node eu-1 on " + server + ": forbidden (rotate-key needs get and patch on nodes)"},
	} {
		kube, md := fixtureClients()
		kube.PrependReactor(c.verb, "nodes", func(clienttesting.Action) (bool, runtime.Object, error) { return true, nil, c.err })
		r := runMeshctl(t, kube, md, "rotate-key", "eu-1")
		if r.code != 1 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s fails with %v: exit %d, stderr %q; want 1 and %q", c.verb, c.err, r.code, r.stderr, c.want)
		}
	}
}
