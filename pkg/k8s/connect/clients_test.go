package connect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	meshdfake "meshd.io/meshd/pkg/k8s/client/clientset/versioned/fake"
)

func TestNewClientsKubeconfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := NewClients(good)
	if err != nil {
		t.Fatalf("good kubeconfig: %v", err)
	}
	if c.Kube == nil || c.Meshd == nil || c.Config.Host != "https://127.0.0.1:6443" || c.Config.UserAgent != "meshd" {
		t.Errorf("clients: %+v", c)
	}

	broken := filepath.Join(dir, "broken")
	if err := os.WriteFile(broken, []byte("{not yaml: ["), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{broken, filepath.Join(dir, "missing")} {
		if _, err := NewClients(path); err == nil || !strings.Contains(err.Error(), "loading kubeconfig "+path) {
			t.Errorf("NewClients(%s) error = %v, want one naming the file", path, err)
		}
	}
	if _, err := NewClientsForConfig(nil); err == nil {
		t.Error("nil config accepted")
	}
	if _, err := NewClientsForConfig(&rest.Config{Host: "http://127.0.0.1:1"}); err != nil {
		t.Error(err)
	}
}

func TestPeerInformer(t *testing.T) {
	p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "laptop"}, Spec: v1alpha1.PeerSpec{PublicKey: "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=" /* 32 bytes of 1 */, AllowedIPs: []string{"10.5.0.1/32"}}}
	c := &Clients{Kube: fake.NewClientset(), Meshd: meshdfake.NewSimpleClientset(p)}
	inf := NewPeerInformer(c, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.RunWithContext(ctx)
	if !waitFor(func() bool { return inf.HasSynced() }) {
		t.Fatal("informer did not sync")
	}
	got := inf.GetStore().List()
	if len(got) != 1 || got[0].(*v1alpha1.Peer).Name != "laptop" {
		t.Fatalf("informer store: %v", got)
	}
}

func TestNewEventRecorder(t *testing.T) {
	c := fake.NewClientset()
	rec, stop := NewEventRecorder(c, "meshd")
	defer stop()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"}}
	p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "laptop", UID: "u2"}}
	rec.Event(n, corev1.EventTypeWarning, "MalformedAnnotation", "bad meshd.io/leader")
	rec.Event(p, corev1.EventTypeWarning, "MalformedInput", "bad peer")
	kinds := map[string]bool{}
	ok := waitFor(func() bool {
		evs, err := c.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Source.Component == "meshd" && e.Type == corev1.EventTypeWarning {
				kinds[e.InvolvedObject.Kind] = true
			}
		}
		return kinds["Node"] && kinds["Peer"]
	})
	if !ok {
		t.Fatalf("events recorded for %v, want Node and Peer", kinds)
	}
}

func waitFor(cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}
