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
	return fakeRemoteWatchAPI(t, nil, nodes...)
}

// runLinkWatcher runs a LinkWatcher of kube's link Secrets until the test
// ends; changes counts its onChange calls.
func runLinkWatcher(t *testing.T, kube *fake.Clientset) (*LinkWatcher, *atomic.Int64) {
	t.Helper()
	changes := new(atomic.Int64)
	w := NewLinkWatcher(slog.New(slog.NewTextHandler(io.Discard, nil)), kube, "meshd-system", time.Hour, func() { changes.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w, changes
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
	w, changes := runLinkWatcher(t, kube)

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
		if _, err := kube.CoreV1().Secrets("meshd-system").Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
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

// fakeRemoteWatchAPI serves a Node list like a linked cluster's API server,
// and streams to its first watch the Node updates sent on events (none if
// events is nil); other watches hang.
func fakeRemoteWatchAPI(t *testing.T, events <-chan corev1.Node, nodes ...corev1.Node) *httptest.Server {
	t.Helper()
	var watching atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes" {
			http.NotFound(w, r)
			return
		}
		if r.URL.Query().Get("sendInitialEvents") == "true" { // no streaming lists: clients fall back to a list
			http.Error(w, "streaming lists not supported", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") != "true" {
			json.NewEncoder(w).Encode(corev1.NodeList{
				TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{ResourceVersion: "1"},
				Items:    nodes,
			})
			return
		}
		if !watching.CompareAndSwap(false, true) { // one stream gets the events
			<-r.Context().Done()
			return
		}
		w.(http.Flusher).Flush()
		enc := json.NewEncoder(w)
		for {
			select {
			case <-r.Context().Done():
				return
			case n := <-events:
				n.TypeMeta = metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}
				if err := enc.Encode(map[string]any{"type": "MODIFIED", "object": n}); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestLinkWatcherLeanNodes: the linked cluster's Nodes are cached lean
// (what Leaders reads, no managedFields, images or conditions), and updates
// that leave that the same (kubelet heartbeats) call no onChange.
func TestLinkWatcherLeanNodes(t *testing.T) {
	fat := func(rv string) corev1.Node {
		return corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "w1", UID: "uid-w1", ResourceVersion: rv,
				Annotations:   map[string]string{"meshd.io/location": "west", "node.alpha.kubernetes.io/ttl": "0"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
			Status: corev1.NodeStatus{
				Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.11"}},
				Images:     []corev1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			},
		}
	}
	events := make(chan corev1.Node)
	up := fakeRemoteWatchAPI(t, events, fat("1"))
	kube := fake.NewClientset(linkSecret("link-west", "west", up.URL))
	w, changes := runLinkWatcher(t, kube)

	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: snapshot %+v, %d onChange calls", what, w.Snapshot(), changes.Load())
			}
		}
	}
	// Before the updates: the Secret's upsert, the Secrets' sync, the
	// Node's add and the Nodes' sync.
	const before = 4
	waitFor("linked cluster synced", func() bool {
		s := w.Snapshot()
		return len(s) == 1 && s[0].Synced && len(s[0].Nodes) == 1 && changes.Load() >= before
	})
	if n := w.Snapshot()[0].Nodes[0]; n.ManagedFields != nil || n.Status.Images != nil || n.Status.Conditions != nil || n.Annotations["node.alpha.kubernetes.io/ttl"] != "" {
		t.Errorf("the linked Node is cached whole: %+v", n)
	}
	if n := w.Snapshot()[0].Nodes[0]; n.Annotations["meshd.io/location"] != "west" || len(n.Status.Addresses) != 1 {
		t.Errorf("the linked Node lost what meshd reads: %+v", n)
	}
	base := changes.Load()
	if base != before {
		t.Fatalf("%d onChange calls before any update, want %d", base, before)
	}
	for i := range 5 { // kubelet heartbeats and another component's annotation
		n := fat(fmt.Sprint(i + 2))
		n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Unix(int64(i), 0))
		n.Annotations["node.alpha.kubernetes.io/ttl"] = fmt.Sprint(i)
		events <- n
	}
	changed := fat("9")
	changed.Annotations["meshd.io/leader"] = "true"
	events <- changed
	waitFor("the leader annotation seen", func() bool {
		return w.Snapshot()[0].Nodes[0].Annotations["meshd.io/leader"] == "true" && changes.Load() > base
	})
	time.Sleep(200 * time.Millisecond) // any heartbeat's onChange would have run by now
	if got := changes.Load() - base; got != 1 {
		t.Errorf("%d onChange calls for 5 heartbeats and 1 change, want 1", got)
	}
}
