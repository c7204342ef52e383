package iptables

import (
	"strings"
	"testing"
)

func TestCheckVersion(t *testing.T) {
	for _, tc := range []struct {
		v  [3]int
		ok bool
	}{
		{[3]int{1, 8, 9}, true},
		{[3]int{1, 6, 2}, true},
		{[3]int{1, 7, 0}, true},
		{[3]int{2, 0, 0}, true},
		{[3]int{1, 6, 1}, false},
		{[3]int{1, 4, 21}, false},
		{[3]int{0, 0, 0}, false},
	} {
		err := checkVersion("iptables", tc.v)
		if (err == nil) != tc.ok {
			t.Errorf("checkVersion(%v) = %v, want ok %v", tc.v, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "needs v1.6.2") {
			t.Errorf("checkVersion(%v) = %q, want it to name the needed version", tc.v, err)
		}
	}
}
