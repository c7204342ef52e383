package clusterlink

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// fakeRemoteAPI serves a Node list (and hangs watches) like a linked
// cluster's API server.
func fakeRemoteAPI(t *testing.T, nodes ...corev1.Node) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes" {
			http.NotFound(w, r)
			return
		}
		if r.URL.Query().Get("sendInitialEvents") == "true" { // no streaming lists: clients fall back to a list
			http.Error(w, "streaming lists not supported", http.StatusBadRequest)
			return
		}
		if r.URL.Query().Get("watch") == "true" {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(corev1.NodeList{
			TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: "1"},
			Items:    nodes,
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func linkSecret(name, cluster, server string) *corev1.Secret {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, server)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "meshd-system", Name: name,
			Labels:      map[string]string{LabelClusterLink: "true"},
			Annotations: map[string]string{AnnotationRemoteCluster: cluster, AnnotationRemoteServiceCIDRs: "10.97.0.0/16", AnnotationRemoteMeshCIDRs: "10.5.0.0/16"}},
		Data: map[string][]byte{LinkKubeconfigKey: []byte(kc)},
	}
}

// TestLinkWatcherSyncedAndRace: Snapshot says whether a linked cluster's
// Nodes were listed (Synced), and reading it while link Secrets change (so
// the watcher reconnects) is free of data races (run with -race).
func TestLinkWatcherSyncedAndRace(t *testing.T) {
	up := fakeRemoteAPI(t, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w1"}})
	kube := fake.NewClientset(linkSecret("link-west", "west", "http://127.0.0.1:1"))
	var changes atomic.Int64
	w := NewLinkWatcher(slog.New(slog.NewTextHandler(io.Discard, nil)), kube, "meshd-system", time.Hour, func() { changes.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	stop := make(chan struct{})
	readers := make(chan struct{})
	go func() { // Snapshot concurrently with every reconnect below
		defer close(readers)
		for {
			select {
			case <-stop:
				return
			default:
				w.Snapshot()
			}
		}
	}()
	waitFor := func(what string, ok func([]RemoteCluster) bool) []RemoteCluster {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			s := w.Snapshot()
			if ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: snapshot %+v", what, s)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("unreachable cluster listed", func(s []RemoteCluster) bool { return len(s) == 1 })
	time.Sleep(50 * time.Millisecond)
	if s := w.Snapshot(); s[0].Synced || len(s[0].Nodes) != 0 {
		t.Fatalf("an unreachable cluster counts as synced: %+v", s[0])
	}
	for i := range 5 { // reconnects while Snapshot runs
		server := "http://127.0.0.1:1"
		if i == 4 {
			server = up.URL
		}
		sec := linkSecret("link-west", "west", server)
		sec.ResourceVersion = fmt.Sprint(i + 2)
		if _, err := kube.CoreV1().Secrets("meshd-system").Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s := waitFor("reachable cluster synced", func(s []RemoteCluster) bool { return len(s) == 1 && s[0].Synced })
	if len(s[0].Nodes) != 1 || s[0].Nodes[0].Name != "w1" {
		t.Errorf("nodes %v", s[0].Nodes)
	}
	close(stop)
	<-readers
	if changes.Load() == 0 {
		t.Error("onChange never called")
	}
}
