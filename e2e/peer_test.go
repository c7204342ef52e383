//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"meshd.io/meshd/e2e/testbed"
)

func peerObject(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "meshd.io/v1alpha1",
		"kind":       "Peer",
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
}

func randomKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// Scenario 3: an outside "laptop" with its own userspace WireGuard device
// (`meshd device` in its own mount namespace) is declared as a Peer; it is
// configured only from what meshd publishes (the leader's public key and
// endpoint annotations, the pod CIDRs), pings pods on both nodes of the
// location and gets answers.
func TestPeer(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	nodes := []*testbed.Node{
		s.node(testbed.NodeOptions{Name: "a1", Location: "a"}),
		s.node(testbed.NodeOptions{Name: "a2", Location: "a"}),
	}
	laptop, err := tb.AddExternal(ctx, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	s.startMeshd(nodes, "--mesh-granularity", "location")
	s.pingEventually(pod(nodes[0]), pod(nodes[1]).IP, 60*time.Second)

	// The laptop's own WireGuard.
	if _, err := laptop.StartDevice(ctx, "wg0"); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(laptop.Dir, "private.key")
	if _, err := laptop.Exec(ctx, "sh", "-c", "umask 077; wg genkey > "+keyFile); err != nil {
		t.Fatal(err)
	}
	out, err := laptop.Exec(ctx, "sh", "-c", "wg pubkey < "+keyFile)
	if err != nil {
		t.Fatal(err)
	}
	laptopKey := strings.TrimSpace(out)

	_, err = tb.Dynamic.Resource(testbed.PeerGVR).Create(ctx, peerObject("laptop", map[string]any{
		"publicKey":           laptopKey,
		"allowedIPs":          []any{laptopIP + "/32"},
		"endpoint":            map[string]any{"host": laptop.IP.String(), "port": int64(laptopPort)},
		"persistentKeepalive": int64(10),
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Peer: %v", err)
	}

	// The leader is the node that configured the Peer.
	var leader *testbed.Node
	s.eventually(30*time.Second, 500*time.Millisecond, "a node configures the Peer", func() error {
		for _, n := range nodes {
			d, err := n.WG(ctx, "meshd0")
			if err != nil {
				continue
			}
			if p := d.Peer(laptopKey); p != nil {
				if !contains(p.AllowedIPs, laptopIP+"/32") {
					return fmt.Errorf("%s: Peer with allowed IPs %v", n.Name, p.AllowedIPs)
				}
				leader = n
				return nil
			}
		}
		return fmt.Errorf("no node has the Peer")
	})
	leaderKey := s.pubKey(leader)
	endpoint := s.annotation(leader, testbed.AnnotationEndpoint)
	t.Logf("leader %s: key %s endpoint %s", leader.Name, leaderKey, endpoint)

	allowed := []string{testbed.MeshCIDR}
	for _, n := range nodes {
		allowed = append(allowed, n.PodCIDR.String())
	}
	cmds := [][]string{
		{"wg", "set", "wg0", "private-key", keyFile, "listen-port", fmt.Sprint(laptopPort),
			"peer", leaderKey, "endpoint", endpoint, "allowed-ips", strings.Join(allowed, ","), "persistent-keepalive", "10"},
		{"ip", "addr", "add", laptopIP + "/32", "dev", "wg0"},
		{"ip", "link", "set", "wg0", "up"},
	}
	for _, c := range allowed {
		cmds = append(cmds, []string{"ip", "route", "add", c, "dev", "wg0", "src", laptopIP})
	}
	for _, c := range cmds {
		if out, err := laptop.Exec(ctx, c...); err != nil {
			t.Fatalf("laptop: %v %s", err, out)
		}
	}
	for _, n := range nodes {
		p := pod(n)
		s.eventually(30*time.Second, 500*time.Millisecond, "laptop pings pod on "+n.Name, func() error {
			out, err := laptop.Exec(ctx, "ping", "-n", "-q", "-c", "1", "-W", "1", p.IP.String())
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	}
	// And a pod reaches the laptop (the reply path is the same route).
	for _, n := range nodes {
		if err := pod(n).Ping(ctx, mustAddr(laptopIP), 3); err != nil {
			// Which node has the laptop's peer now (was it still the leader
			// the laptop peers with)?
			var has []string
			for _, m := range nodes {
				if d, err := m.WG(ctx, "meshd0"); err == nil && d.Peer(laptopKey) != nil {
					has = append(has, m.Name)
				}
			}
			t.Fatalf("ping %s -> laptop %s: %v (the laptop peers with %s; nodes with the laptop's peer now: %v)", pod(n).NS, laptopIP, err, leader.Name, has)
		}
	}
	if out, err := laptop.Exec(ctx, "wg", "show", "wg0"); err == nil {
		t.Logf("laptop wg show:\n%s", out)
	}

	// The Peer's status says it works: accepted, applied by the leader of
	// location a, with a recent handshake (persistent keepalive 10 s).
	peerStatusEventually(s, "laptop", func(st map[string]any) error {
		if err := wantCondition(st, "Accepted", "True", "Valid"); err != nil {
			return err
		}
		if err := wantCondition(st, "Applied", "True", "Applied"); err != nil {
			return err
		}
		leaders, _, _ := unstructured.NestedSlice(st, "leaders")
		if len(leaders) != 1 {
			return fmt.Errorf("status.leaders = %v, want the one leader of location a", leaders)
		}
		e, _ := leaders[0].(map[string]any)
		if e["node"] != leader.Name || e["location"] != "a" || e["applied"] != true || e["accepted"] != true {
			return fmt.Errorf("status.leaders[0] = %v, want node %s location a applied", e, leader.Name)
		}
		hs, _, _ := unstructured.NestedString(st, "lastHandshakeTime")
		ht, err := time.Parse(time.RFC3339, hs)
		if err != nil {
			return fmt.Errorf("status.lastHandshakeTime %q: %v", hs, err)
		}
		if age := time.Since(ht); age > 5*time.Minute || age < -time.Minute {
			return fmt.Errorf("status.lastHandshakeTime %s is %s old", hs, age.Round(time.Second))
		}
		return nil
	})
	// The leader's metrics: client-go's work queue and request series, and
	// the per-kind handshake summary counting the laptop.
	if m, err := leader.Metrics(ctx); err != nil {
		t.Errorf("metrics of %s: %v", leader.Name, err)
	} else {
		for _, want := range []string{`workqueue_adds_total{name="meshd"}`, `workqueue_depth{name="meshd_peer_status"}`,
			"rest_client_request_duration_seconds_bucket{", `meshd_wireguard_peers_handshake_recent{kind="peer"} 1`,
			"meshd_wireguard_peer_series_omitted 0"} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics of %s have no %s", leader.Name, want)
			}
		}
	}
	// A Peer no leader can use: its preshared-key Secret does not exist.
	bad := map[string]any{
		"publicKey":             randomKey(),
		"allowedIPs":            []any{"10.5.0.2/32"},
		"presharedKeySecretRef": map[string]any{"namespace": "meshd-peers", "name": "no-such-secret", "key": "psk"},
	}
	if _, err := tb.Dynamic.Resource(testbed.PeerGVR).Create(ctx, peerObject("bad-psk", bad), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Peer bad-psk: %v", err)
	}
	peerStatusEventually(s, "bad-psk", func(st map[string]any) error {
		if err := wantCondition(st, "Accepted", "False", "Invalid"); err != nil {
			return err
		}
		if c := condition(st, "Accepted"); !strings.Contains(fmt.Sprint(c["message"]), "no-such-secret") {
			return fmt.Errorf("Accepted message %q does not name the missing Secret", c["message"])
		}
		return wantCondition(st, "Applied", "False", "NotApplied")
	})
	// Steady state: with both statuses written, a working Peer (handshakes
	// every 2 minutes, written when 3 minutes newer) and an invalid one
	// cost no status writes for the next 30 s (3 minutes after the first
	// handshake at the earliest).
	window := 30 * time.Second
	if v := os.Getenv("E2E_PEER_STEADY"); v != "" { // a longer window measures the write rate
		if window, err = time.ParseDuration(v); err != nil {
			t.Fatalf("E2E_PEER_STEADY=%q: %v", v, err)
		}
	}
	// Its own context: a long window outlasts the scenario's.
	wctx, wcancel := context.WithTimeout(context.Background(), window+time.Minute)
	defer wcancel()
	peers := tb.Dynamic.Resource(testbed.PeerGVR)
	list, err := peers.List(wctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, u := range list.Items {
		seen[u.GetName()] = u.GetResourceVersion()
	}
	// client-go's RetryWatcher resumes from the last revision seen when
	// the API server ends the watch (a loaded one does) or its watch cache
	// is behind that revision, as an informer would: no write is missed
	// or counted twice.
	w, err := watchtools.NewRetryWatcherWithContext(wctx, list.GetResourceVersion(), &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return peers.Watch(ctx, o)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	writes, deadline := 0, time.After(window)
watch:
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the Peer watch stopped: %v", context.Cause(wctx))
			}
			if ev.Type == watch.Error {
				t.Fatalf("the Peer watch failed: %v", apierrors.FromObject(ev.Object))
			}
			if u, ok := ev.Object.(*unstructured.Unstructured); ok {
				if rv, had := seen[u.GetName()]; !had || rv != u.GetResourceVersion() {
					writes++
					t.Logf("Peer %s written in the steady window (%s): %v", u.GetName(), ev.Type, u.Object["status"])
				}
				seen[u.GetName()] = u.GetResourceVersion()
			}
		case <-deadline:
			break watch
		}
	}
	w.Stop()
	t.Logf("status writes in a %s steady window (2 Peers, 1 leader): %d", window, writes)
	// The working Peer's handshake is written again once 3 minutes newer
	// (every ~4 minutes); the invalid one never.
	if allowed := int(window / (3 * time.Minute)); writes > allowed {
		t.Errorf("%d Peer writes in the %s steady window, want at most %d", writes, window, allowed)
	}
	// What an operator sees.
	if out, err := kubectlIn(t, nil, "get", "mpeer"); err != nil {
		t.Errorf("kubectl get mpeer: %v\n%s", err, out)
	} else {
		t.Logf("kubectl get mpeer:\n%s", out)
		for _, want := range []string{"ACCEPTED", "APPLIED", "HANDSHAKE"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl get mpeer has no %s column", want)
			}
		}
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) > 0 && f[0] == "laptop" && !(contains(f, "True") && strings.Count(l, "True") == 2):
				t.Errorf("kubectl get mpeer: laptop is not Accepted and Applied: %s", l)
			case len(f) > 0 && f[0] == "bad-psk" && strings.Count(l, "False") != 2:
				t.Errorf("kubectl get mpeer: bad-psk is not shown as not accepted and not applied: %s", l)
			}
		}
	}
}

// peerStatusEventually waits until check accepts the status of Peer name.
func peerStatusEventually(s *scenario, name string, check func(map[string]any) error) {
	s.t.Helper()
	s.eventually(60*time.Second, 500*time.Millisecond, "the status of Peer "+name, func() error {
		p, err := tb.Dynamic.Resource(testbed.PeerGVR).Get(s.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st, _, _ := unstructured.NestedMap(p.Object, "status")
		if err := check(st); err != nil {
			return fmt.Errorf("%w (status %v)", err, st)
		}
		return nil
	})
}

func condition(st map[string]any, typ string) map[string]any {
	cs, _, _ := unstructured.NestedSlice(st, "conditions")
	for _, c := range cs {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

func wantCondition(st map[string]any, typ, status, reason string) error {
	c := condition(st, typ)
	if c == nil {
		return fmt.Errorf("no %s condition", typ)
	}
	if c["status"] != status || c["reason"] != reason {
		return fmt.Errorf("%s = %v/%v (%v), want %s/%s", typ, c["status"], c["reason"], c["message"], status, reason)
	}
	return nil
}

// Scenario 7a: invalid Peers are refused by the API server with a message
// naming the offending field. Needs only the CRDs, not meshd.
func TestInvalidPeersRejected(t *testing.T) {
	s := newScenario(t, false)
	ctx := s.ctx
	if _, err := tb.Dynamic.Resource(testbed.PeerGVR).List(ctx, metav1.ListOptions{}); err != nil {
		t.Skipf("Peer CRD not installed (manifests/crds): %v", err)
	}
	valid := func() map[string]any {
		return map[string]any{
			"publicKey":  randomKey(),
			"allowedIPs": []any{"10.5.0.1/32"},
			"endpoint":   map[string]any{"host": "203.0.113.50", "port": int64(51820)},
		}
	}
	// A valid one is accepted (so the refusals below are about the field).
	if _, err := tb.Dynamic.Resource(testbed.PeerGVR).Create(ctx, peerObject("valid", valid()), metav1.CreateOptions{}); err != nil {
		t.Fatalf("valid Peer refused: %v", err)
	}
	cases := []struct {
		name  string
		field string
		mod   func(spec map[string]any)
	}{
		{"bad-key", "spec.publicKey", func(s map[string]any) { s["publicKey"] = "not-a-wireguard-key" }},
		{"bad-key-length", "spec.publicKey", func(s map[string]any) { s["publicKey"] = randomKey()[:43] + "x" }},
		{"bad-cidr", "spec.allowedIPs", func(s map[string]any) { s["allowedIPs"] = []any{"10.5.0.1/33"} }},
		{"not-a-cidr", "spec.allowedIPs", func(s map[string]any) { s["allowedIPs"] = []any{"nonsense"} }},
		{"port-too-big", "spec.endpoint.port", func(s map[string]any) {
			s["endpoint"] = map[string]any{"host": "203.0.113.50", "port": int64(70000)}
		}},
		{"port-zero", "spec.endpoint.port", func(s map[string]any) {
			s["endpoint"] = map[string]any{"host": "203.0.113.50", "port": int64(0)}
		}},
		{"bad-host", "spec.endpoint.host", func(s map[string]any) {
			s["endpoint"] = map[string]any{"host": "bad host!", "port": int64(51820)}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := valid()
			c.mod(spec)
			_, err := tb.Dynamic.Resource(testbed.PeerGVR).Create(ctx, peerObject(c.name, spec), metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("invalid Peer (%s) accepted", c.name)
			}
			if !apierrors.IsInvalid(err) {
				t.Errorf("want an Invalid error, got %v", err)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Errorf("error does not name %s: %v", c.field, err)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// Scenario 7b: a Node with malformed meshd annotations does not stop the
// others: traffic between the other nodes keeps working and no meshd dies.
func TestMalformedAnnotations(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	s.location("b", false)
	n1 := s.node(testbed.NodeOptions{Name: "n1", Location: "a"})
	bad := s.node(testbed.NodeOptions{Name: "bad", Location: "a", Annotations: map[string]string{
		"meshd.io/persistent-keepalive": "abc",
		"meshd.io/allowed-location-ips": "nonsense",
	}})
	n3 := s.node(testbed.NodeOptions{Name: "n3", Location: "b"})
	nodes := []*testbed.Node{n1, bad, n3}
	s.startMeshd(nodes, "--mesh-granularity", "full")
	s.pingEventually(pod(n1), pod(n3).IP, 60*time.Second)
	s.pingEventually(pod(n3), pod(n1).IP, 10*time.Second)

	// More garbage at run time.
	patch := `{"metadata":{"annotations":{"meshd.io/force-endpoint":"::not:an:endpoint::","meshd.io/leader":"perhaps","meshd.io/allowed-location-ips":"10.0.0.0/99,zzz"}}}`
	if _, err := tb.Kube.CoreV1().Nodes().Patch(ctx, bad.Name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Two resync periods of continuous checks.
	deadline := time.Now().Add(11 * time.Second)
	for time.Now().Before(deadline) {
		s.pingOK(pod(n1), pod(n3).IP, 1)
		s.pingOK(pod(n3), pod(n1).IP, 1)
		for _, n := range nodes {
			if n.Meshd().Exited() {
				t.Fatalf("meshd on %s exited: %v", n.Name, n.Meshd().Err())
			}
		}
		time.Sleep(time.Second)
	}
	if err := pod(n1).Transfer(ctx, pod(n3), pod(n3).IP, 1<<20); err != nil {
		t.Error(err)
	}
	for _, n := range nodes {
		if err := n.WaitMeshdReady(ctx, 5*time.Second); err != nil {
			t.Errorf("meshd on %s not ready: %v", n.Name, err)
		}
	}
	// Informational: does the node with bad annotations still work?
	if err := pod(bad).Ping(ctx, pod(n1).IP, 1); err != nil {
		t.Logf("note: pod on %s cannot reach %s: %v", bad.Name, n1.Name, err)
	}
}
