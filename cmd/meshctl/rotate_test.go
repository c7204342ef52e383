package main

import (
	"context"
	"strings"
	"testing"
	"time"

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
		{[]string{"rotate-key", "nope"}, `node "nope" not found`},
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
