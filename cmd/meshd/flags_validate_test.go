package main

import (
	"strings"
	"testing"
)

// TestOptionsValidation: every flag options() checks gives a clear error
// naming it; the defaults pass.
func TestOptionsValidation(t *testing.T) {
	parse := func(t *testing.T, args ...string) error {
		t.Helper()
		var c config
		fs := newFlagSet(&c)
		if err := fs.Parse(append([]string{"--hostname=n1"}, args...)); err != nil {
			t.Fatal(err)
		}
		_, err := c.options()
		return err
	}
	if err := parse(t); err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
	for _, ok := range [][]string{
		{"--lease-duration=2s"}, {"--lease-duration=1h"}, {"--resync-period=1s"},
		{"--listen=127.0.0.1:0"}, {"--listen=[::1]:9477"}, {"--topology-label=example.com/zone"},
		{"--service-cidr=10.96.0.0/12", "--mesh-cidr=10.4.0.0/16"}, {"--debug-pprof=127.0.0.1:6060"},
	} {
		if err := parse(t, ok...); err != nil {
			t.Errorf("%v rejected: %v", ok, err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--lease-duration=0s"}, "--lease-duration 0s: want 2s to 1h0m0s"},
		{[]string{"--lease-duration=-5s"}, "--lease-duration -5s"},
		{[]string{"--lease-duration=1s"}, "--lease-duration 1s"},
		{[]string{"--lease-duration=2h"}, "--lease-duration 2h0m0s"},
		{[]string{"--resync-period=0s"}, "--resync-period 0s: must be positive"},
		{[]string{"--resync-period=10ms"}, "--resync-period 10ms: want 1s to 24h0m0s"},
		{[]string{"--lease-namespace=Meshd_System"}, `--lease-namespace "Meshd_System"`},
		{[]string{"--lease-namespace="}, `--lease-namespace ""`},
		{[]string{"--interface=a/b"}, `--interface "a/b"`},
		{[]string{"--interface=a b"}, `--interface "a b"`},
		{[]string{"--topology-label=bad label"}, `--topology-label "bad label"`},
		{[]string{"--state-dir="}, "--state-dir is empty"},
		{[]string{"--listen=9477"}, `--listen "9477"`},
		{[]string{"--debug-pprof=6060"}, `--debug-pprof "6060": want [host]:port`},
		{[]string{"--listen=:99999"}, `--listen ":99999": bad port`},
		{[]string{"--kubeconfig=/nonexistent/kubeconfig"}, "--kubeconfig: stat /nonexistent/kubeconfig"},
		{[]string{"--service-cidr=10.4.0.0/24"}, "--service-cidr 10.4.0.0/24 overlaps --mesh-cidr 10.4.0.0/16"},
		{[]string{"--port=0"}, "--port 0"},
		{[]string{"--mtu=100"}, "--mtu"},
	} {
		err := parse(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	// Several bad flags: every one reported.
	err := parse(t, "--lease-duration=0s", "--listen=x", "--state-dir=")
	if err == nil || strings.Count(err.Error(), "\n") < 2 {
		t.Errorf("want three errors, got %v", err)
	}
}
