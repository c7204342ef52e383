package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDNSZoneNormalized: validate lowercases the zone, trims it and makes
// it fully qualified.
func TestDNSZoneNormalized(t *testing.T) {
	c := dnsConfig{Listen: ":53", MetricsListen: ":9479", Zone: " ClusterSet.Local ", LogLevel: "info", LogFormat: "text"}
	if err := c.validate(); err != nil || c.Zone != "clusterset.local." {
		t.Errorf("zone normalized to %q, %v; want clusterset.local.", c.Zone, err)
	}
}

// TestReleaseBuildLinksNoTemplates: with the build tags of make build, the
// Dockerfile and hack/image.sh (grpcnotrace), meshd links neither
// text/template nor html/template. gRPC (linked by CoreDNS's server) reaches
// them through golang.org/x/net/trace without the tag, and their reflective
// method calls make the linker keep every exported method: 34.6 MB became
// 67.2 MB (stripped), 36.2 MB with the tag.
func TestReleaseBuildLinksNoTemplates(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list (-short)")
	}
	out, err := exec.Command("go", "list", "-tags", "grpcnotrace", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "text/template" || p == "html/template" {
			t.Errorf("meshd (-tags grpcnotrace) links %s", p)
		}
	}
}
