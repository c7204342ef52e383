package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"meshd.io/meshd/pkg/k8s/convert"
)

// TestStatusFullDiscoveredList: a leader that lists convert.DiscoveredLimit
// endpoints of peers that do not need them may have left a link out, so
// status shows its handshake as unknown ("?", handshakeUnknown), not as
// absent; a node behind NAT is always listed, so its absence means no
// recent handshake ("-").
func TestStatusFullDiscoveredList(t *testing.T) {
	var full []string
	for i := range convert.DiscoveredLimit {
		full = append(full, fmt.Sprintf("%q: \"198.51.100.%d:51820\"", pub(byte(100+i)).String(), i+1))
	}
	objs := []runtime.Object{
		node(nodeSpec{name: "a", region: "a", internal: "192.168.1.1", pod: "10.1.0.0/24", key: 1,
			ann: map[string]string{convert.AnnotationDiscoveredEndpoints: "{" + strings.Join(full, ",") + "}"}}),
		node(nodeSpec{name: "b", region: "b", internal: "192.168.1.2", pod: "10.1.1.0/24", key: 2}),
		node(nodeSpec{name: "c", region: "c", internal: "192.168.1.3", pod: "10.1.2.0/24", key: 3,
			ann: map[string]string{convert.AnnotationPersistentKeepalive: "25"}}),
		lease("a", now.Add(-5*time.Second)), lease("b", now.Add(-5*time.Second)), lease("c", now.Add(-5*time.Second)),
	}
	r := runMeshctl(t, kubefake.NewClientset(objs...), fixtureMeshd(nil), "status", "-o", "json")
	var st struct {
		Links []statusLink `json:"links"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("%v; exit %d, stderr %s", err, r.code, r.stderr)
	}
	got := map[string]statusLink{}
	for _, l := range st.Links {
		got[l.From+" "+strings.Fields(l.To)[0]] = l
	}
	for link, want := range map[string]statusLink{
		"a b": {HandshakeUnknown: true}, // a's list is full: unknown
		"a c": {},                       // c is behind NAT: a would list it
		"b a": {},                       // b lists nothing: no recent handshake
	} {
		l, ok := got[link]
		if !ok {
			t.Errorf("no link %q in %+v", link, st.Links)
			continue
		}
		if l.RecentHandshake != want.RecentHandshake || l.HandshakeUnknown != want.HandshakeUnknown {
			t.Errorf("link %s: recentHandshake %v, handshakeUnknown %v; want %v, %v", link, l.RecentHandshake, l.HandshakeUnknown, want.RecentHandshake, want.HandshakeUnknown)
		}
	}
	table := runMeshctl(t, kubefake.NewClientset(objs...), fixtureMeshd(nil), "status")
	rows := map[string]string{}
	for _, line := range strings.Split(table.stdout, "\n") {
		if f := strings.Fields(line); len(f) == 3 && len(f[0]) == 1 {
			rows[f[0]+" "+f[1]] = f[2]
		}
	}
	if rows["a b"] != unknownHandshake || rows["a c"] != "-" {
		t.Errorf("the table shows a => b %q and a => c %q, want %q and -:\n%s", rows["a b"], rows["a c"], unknownHandshake, table.stdout)
	}
}
