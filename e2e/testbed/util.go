//go:build e2e

package testbed

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"os"
	"strings"
)

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Tail returns the last n lines of the file at path.
func Tail(path string, n int) string { return tail(path, n) }
