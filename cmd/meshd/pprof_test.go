package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestPprofServer: the --debug-pprof listener serves the profile index and
// nothing else (no metrics, no probes on it).
func TestPprofServer(t *testing.T) {
	h := pprofServer("127.0.0.1:0").Handler
	for path, want := range map[string]int{
		"/debug/pprof/":        http.StatusOK,
		"/debug/pprof/cmdline": http.StatusOK,
		"/metrics":             http.StatusNotFound,
		"/healthz":             http.StatusNotFound,
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != want {
			t.Errorf("GET %s: HTTP %d, want %d", path, rec.Code, want)
		}
	}
}
