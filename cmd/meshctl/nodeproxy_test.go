package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/nodestate"
)

// nodeProxyGet against an API server that answers as the node proxy does.
// When meshd on the node is down, the proxy answers 503 with a Status whose
// message says why (k8s.io/apimachinery/pkg/util/proxy: "error trying to
// reach service: ..."); diagnose and the `meshd SRC` hop of check printed
// only "HTTP 503".
func TestNodeProxyGetErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		code     int
		body     string
		want     []string
		wantBody bool
	}{
		{
			name: "meshd down",
			code: http.StatusServiceUnavailable,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"error trying to reach service: dial tcp 192.168.1.1:9477: connect: connection refused","reason":"ServiceUnavailable","code":503}`,
			want: []string{"node eu-1: meshd is not reachable on eu-1:9477 (not running?)", "error trying to reach service: dial tcp 192.168.1.1:9477: connect: connection refused"},
		},
		{
			name: "unknown node",
			code: http.StatusNotFound,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes \"eu-1\" not found","reason":"NotFound","details":{"name":"eu-1","kind":"nodes"},"code":404}`,
			want: []string{"node eu-1: " + nodestate.PathState + ": HTTP 404 from the API server's node proxy: nodes \"eu-1\" not found"},
		},
		{
			// meshd's own error answer is returned with its body.
			name:     "meshd answers an error",
			code:     http.StatusBadRequest,
			body:     `{"error":"count=\"0\": want 1-10"}`,
			want:     []string{"node eu-1: " + nodestate.PathState + ": HTTP 400"},
			wantBody: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if want := "/api/v1/nodes/http:eu-1:9477/proxy" + nodestate.PathState; r.URL.Path != want {
					t.Errorf("path %s, want %s", r.URL.Path, want)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.code)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			c, err := connect.NewClientsForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			body, err := nodeProxyGet(context.Background(), c, "eu-1", 9477, nodestate.PathState, nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tc.wantBody && string(body) != tc.body {
				t.Errorf("body %q, want meshd's answer %q", body, tc.body)
			}
		})
	}
}
