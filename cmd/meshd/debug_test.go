package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/nodestate"
)

// TestDebugPlanHasNoSecrets: the debug state of a plan with a preshared
// key says there is one and shows neither it nor the private key.
func TestDebugPlanHasNoSecrets(t *testing.T) {
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	)
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	plan, errs := f.rec.debug.get()
	if plan == nil || len(errs) != 0 || len(plan.WireGuard.Peers) != 1 {
		t.Fatalf("plan %+v, errors %q", plan, errs)
	}
	psk := newKey(t)
	plan.WireGuard.Peers[0].PresharedKey = &psk
	s := planState(plan)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	if strings.Contains(out, psk.String()) || strings.Contains(out, f.rec.key.String()) {
		t.Fatalf("a key leaks: %s", out)
	}
	if !s.Peers[0].PresharedKey || s.Peers[0].Name != "b" || s.Location != "a" || !s.Leader || len(s.Routes) == 0 || len(s.Chains) == 0 {
		t.Errorf("plan state %+v", s)
	}
	if !strings.Contains(strings.Join(s.Routes, "\n"), "10.42.3.0/24 dev meshd0") {
		t.Errorf("routes %q", s.Routes)
	}
}

// TestDebugPingRefuses: the ping endpoint answers only for mesh addresses
// of other nodes in the plan (it cannot be used to send ICMP anywhere).
func TestDebugPingRefuses(t *testing.T) {
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	)
	d := &daemon{rec: f.rec}
	if _, code := d.ping(context.Background(), "10.4.0.1", 1); code != http.StatusServiceUnavailable {
		t.Errorf("before a plan: %d", code)
	}
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	plan, _ := f.rec.debug.get()
	own := plan.MeshIPs["a1"][0].String()
	for _, to := range []string{"x", "192.0.2.1", "198.51.100.21", own} {
		p, code := d.ping(context.Background(), to, 1)
		if code != http.StatusBadRequest || p.Error == "" || p.Sent != 0 {
			t.Errorf("to=%s: %d %+v", to, code, p)
		}
	}
}

// TestDebugPingHandler: bad counts and targets are answered with a JSON
// error and HTTP 400, before anything is sent.
func TestDebugPingHandler(t *testing.T) {
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	)
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	(&daemon{rec: f.rec}).debugHandlers(mux)
	for _, q := range []string{"to=10.4.0.1&count=0", "to=10.4.0.1&count=11", "to=10.4.0.1&count=x", "to=192.0.2.9", "to="} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", nodestate.PathPing+"?"+q, nil))
		var p nodestate.Ping
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusBadRequest || p.Error == "" || p.Sent != 0 {
			t.Errorf("%s: HTTP %d %s (%v)", q, w.Code, w.Body, err)
		}
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("POST", nodestate.PathPing+"?to=10.4.0.1", nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: HTTP %d", w.Code)
	}
}
