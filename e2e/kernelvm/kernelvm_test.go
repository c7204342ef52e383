//go:build e2e

// Package kernelvm runs meshd's kernel-WireGuard tests on a real Linux
// kernel: TestKernelVM runs hack/e2e-kernel.sh, which boots Debian's kernel
// in qemu over the host's root filesystem and runs, inside, the pkg/wg
// kernel tests, the kernel/userspace throughput comparison and the e2e
// scenarios with --wireguard kernel. The guest's `go test -v` output streams
// to this test's output; each guest test becomes a subtest here that passes,
// fails or skips as it did in the guest.
//
//	E2E_KERNEL_VM=1 go test -tags e2e -count=1 -v -timeout 45m ./e2e/kernelvm/   # make e2e-kernel
//
// Without E2E_KERNEL_VM=1 it skips, so `make e2e` (./e2e/...) does not boot
// the VM a second time.
package kernelvm

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	result = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)
	// message is the first line of a t.Log, t.Error or t.Fatal in -v output.
	message = regexp.MustCompile(`^\s+\S+_test\.go:\d+: `)
)

// maxMessages bounds what failureMessages returns.
const maxMessages = 40

// failureMessages returns the messages (first lines) that the guest test
// name logged between its last "=== RUN" and its "--- FAIL", so that the
// failing subtest says why it failed where CI shows the end of the output.
func failureMessages(out, name string) []string {
	lines := strings.Split(out, "\n")
	start := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == "=== RUN   "+name {
			start = i
		}
	}
	if start < 0 {
		return nil
	}
	var msgs []string
	for _, l := range lines[start+1:] {
		if m := result.FindStringSubmatch(l); m != nil && m[2] == name {
			break
		}
		if next, ok := strings.CutPrefix(strings.TrimSpace(l), "=== RUN   "); ok && !strings.HasPrefix(next, name+"/") {
			break // the next test: name ended without its result line
		}
		if message.MatchString(l) {
			msgs = append(msgs, strings.TrimSpace(l))
		}
	}
	if len(msgs) > maxMessages {
		msgs = append(msgs[:maxMessages], fmt.Sprintf("(%d more)", len(msgs)-maxMessages))
	}
	return msgs
}

func TestKernelVM(t *testing.T) {
	if os.Getenv("E2E_KERNEL_VM") != "1" {
		t.Skip("boots a VM: run with E2E_KERNEL_VM=1 (make e2e-kernel)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (qemu, network namespaces)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	summary := filepath.Join(t.TempDir(), "summary")
	cmd := exec.Command("bash", filepath.Join(root, "hack", "e2e-kernel.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "E2E_KERNEL_SUMMARY="+summary)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(os.Stdout, &out) // the guest's go test -v output, live
	cmd.Stderr = os.Stderr
	runErr := cmd.Run()

	b, err := os.ReadFile(summary)
	if err != nil {
		t.Fatalf("hack/e2e-kernel.sh: %v; no guest results (%v)", runErr, err)
	}
	t.Logf("guest results:\n%s", b)
	seen := 0
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "FAIL "):
			t.Errorf("guest step failed: %s", line)
		case strings.HasPrefix(line, "kernel: "), strings.HasPrefix(line, "timing: "):
			t.Log(line)
		}
		m := result.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		seen++
		status, name := m[1], m[2]
		t.Run(name, func(t *testing.T) {
			switch status {
			case "FAIL":
				msgs := failureMessages(out.String(), name)
				if len(msgs) == 0 {
					msgs = []string{"(no messages found)"}
				}
				t.Errorf("failed in the guest (output above):\n%s", strings.Join(msgs, "\n"))
			case "SKIP":
				t.Skip("skipped in the guest")
			}
		})
	}
	if seen == 0 {
		t.Error("the guest reported no test results")
	}
	if runErr != nil {
		t.Errorf("hack/e2e-kernel.sh: %v", runErr)
	}
}
