//go:build e2e

package kernelvm

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// guestOutput is the shape of the guest's console: go test -v output with
// CRLF line ends, a kernel message and wireguard-go debug lines in between.
const guestOutput = "=== RUN   TestRootInProcessLifecycle\r\n" +
	"    root_test.go:110: logs:\r\n" +
	"--- PASS: TestRootInProcessLifecycle (0.30s)\r\n" +
	"=== RUN   TestRootAdoptExternalDevice\r\n" +
	"[   12.345678] tun: Universal TUN/TAP device driver\r\n" +
	"    root_test.go:365: deleting interface mwgt1: no such device\r\n" +
	"    root_test.go:110: logs:\r\n" +
	"        time=2026-11-29T08:27:52.669Z level=DEBUG msg=\"Device closed\"\r\n" +
	"--- FAIL: TestRootAdoptExternalDevice (0.07s)\r\n" +
	"=== RUN   TestKernelTunnel\r\n" +
	"=== RUN   TestKernelTunnel/kernel-kernel\r\n" +
	"    tunnel_test.go:80: ping: 0 of 3 answered\r\n" +
	"=== RUN   TestKernelTunnel/kernel-userspace\r\n" +
	"    tunnel_test.go:90: ok\r\n" +
	"--- FAIL: TestKernelTunnel (2.51s)\r\n" +
	"    --- FAIL: TestKernelTunnel/kernel-kernel (1.23s)\r\n" +
	"    --- PASS: TestKernelTunnel/kernel-userspace (1.27s)\r\n" +
	"=== RUN   TestCut\r\n" +
	"    cut_test.go:1: started\r\n"

func TestFailureMessages(t *testing.T) {
	for _, c := range []struct {
		name string
		want []string
	}{
		{"TestRootAdoptExternalDevice", []string{"root_test.go:365: deleting interface mwgt1: no such device", "root_test.go:110: logs:"}},
		{"TestKernelTunnel", []string{"tunnel_test.go:80: ping: 0 of 3 answered", "tunnel_test.go:90: ok"}},
		{"TestKernelTunnel/kernel-kernel", []string{"tunnel_test.go:80: ping: 0 of 3 answered"}},
		{"TestCut", []string{"cut_test.go:1: started"}}, // the console ended mid-test
		{"TestNeverRan", nil},
	} {
		if got := failureMessages(guestOutput, c.name); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestFailureMessagesBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("=== RUN   TestLoud\n")
	for i := range maxMessages + 5 {
		fmt.Fprintf(&b, "    loud_test.go:%d: line\n", i+1)
	}
	b.WriteString("--- FAIL: TestLoud (1.00s)\n")
	got := failureMessages(b.String(), "TestLoud")
	if len(got) != maxMessages+1 || got[0] != "loud_test.go:1: line" || got[maxMessages] != "(5 more)" {
		t.Fatalf("got %d messages: first %q, last %q", len(got), got[0], got[len(got)-1])
	}
}
