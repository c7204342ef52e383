// Package testlog is what the tests of several packages share to read what
// a *slog.Logger wrote while goroutines were still writing: Buffer, a log
// sink safe for concurrent use.
//
// Out of scope: anything a meshd or meshctl build uses (only tests import
// it), and log formatting (the tests choose their slog handler).
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer for a slog handler that goroutines write while the
// test reads String. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
