package mesh

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseMeshCIDRs(t *testing.T) {
	got, err := ParseMeshCIDRs([]string{"10.4.0.1/16", " fd4d::/64"})
	if err != nil || len(got) != 2 || got[0] != netip.MustParsePrefix("10.4.0.0/16") || got[1] != netip.MustParsePrefix("fd4d::/64") {
		t.Fatalf("got %v, %v", got, err)
	}
	for in, want := range map[string]string{
		"10.4.0.0/16,10.5.0.0/16": "at most one IPv4",
		"nonsense":                "nonsense",
		"":                        "at least one",
	} {
		var ss []string
		if in != "" {
			ss = strings.Split(in, ",")
		}
		if _, err := ParseMeshCIDRs(ss); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want an error containing %q, got %v", in, want, err)
		}
	}
	if _, err := ParseGranularity("mesh"); err == nil || !strings.Contains(err.Error(), "location or full") {
		t.Errorf("bad granularity: %v", err)
	}
}
