package convert

import (
	"errors"
	"strings"
	"testing"
)

func TestSettingsRoundTripAndDifferences(t *testing.T) {
	a := Settings{Version: "v1", Granularity: "location", MeshCIDRs: []string{"10.4.0.0/16", "fd4d::/64"}, Port: 51820,
		TopologyLabel: DefaultTopologyLabel, LeaseNamespace: "meshd-system", LeaseDuration: "40s", ProbePort: 51821, ClusterLinks: true}
	got, err := ParseSettings(a.Encode())
	if err != nil || got.Encode() != a.Encode() {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	b := a
	b.Version, b.Interface, b.ListenPort, b.ListenLoopback = "v2", "wg1", 9999, true
	b.MeshCIDRs = []string{"fd4d::/64", "10.4.0.0/16"}
	if d := a.Differences(b); d != nil {
		t.Errorf("per-node fields and CIDR order are no difference: %q", d)
	}
	b.Port, b.ProbePort = 51000, 0
	if d := strings.Join(a.Differences(b), "; "); d != "port 51820 vs 51000; probe-port 51821 vs 0" {
		t.Errorf("differences %q", d)
	}
	_, err = ParseSettings("{")
	var ae *AnnotationError
	if !errors.As(err, &ae) || ae.Annotation != AnnotationSettings {
		t.Errorf("malformed: %v", err)
	}
}
