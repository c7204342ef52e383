package iptables

import (
	"strings"
	"testing"
)

// TestCurrent: meshd's chains, their rules and the jumps into them, with
// their table headers; nothing of the foreign rules.
func TestCurrent(t *testing.T) {
	f, c := newFake(t, IPv4)
	if err := f.Apply(foreign); err != nil {
		t.Fatal(err)
	}
	mustSet(t, c, baseConfig(), 2)
	lines, err := c.Current()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(lines, "\n")
	for _, want := range []string{"*filter\n:MESHD-FORWARD", "-A FORWARD -j MESHD-FORWARD", "*nat", "-A POSTROUTING -j MESHD-POSTROUTING"} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "*") && !strings.Contains(l, "MESHD-") {
			t.Errorf("foreign line %q", l)
		}
	}
}
