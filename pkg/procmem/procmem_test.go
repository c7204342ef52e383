package procmem

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test binary trims its own executable: its resident file pages drop,
// and code and read-only data work as before (they fault back in from the
// page cache): a hash computed with crypto's tables, never run before in
// this process, is right.
func TestTrimExecutable(t *testing.T) {
	r, err := TrimExecutable()
	if err != nil {
		t.Fatal(err)
	}
	if r.Mappings == 0 || r.Bytes == 0 {
		t.Fatalf("nothing trimmed: %+v", r)
	}
	if r.ResidentAfter >= r.ResidentBefore {
		t.Errorf("resident file pages %d before, %d after: not fewer", r.ResidentBefore, r.ResidentAfter)
	}
	if !r.CacheDropped {
		t.Error("the executable's unused cached pages were not dropped")
	}
	t.Logf("trimmed %d mappings (%d MB): resident file pages %.1f -> %.1f MB", r.Mappings, r.Bytes>>20, float64(r.ResidentBefore)/1e6, float64(r.ResidentAfter)/1e6)
	sum := sha256.Sum256([]byte("meshd"))
	if got, want := hex.EncodeToString(sum[:]), "e0e6758c51c7debade3c8148726fa005480bb1d714fca7c4cd58441325bbf85f"; got != want {
		t.Errorf("sha256 after the trim = %s, want %s", got, want)
	}
	// Again: nothing breaks, and it trims what came back.
	if _, err := TrimExecutable(); err != nil {
		t.Fatal(err)
	}
}

// Only read-only mappings of the executable without pages of their own are
// trimmed (a freshly built binary's pages not yet written back count as
// dirty, not as its own): never a writable one, one with a private copy of
// a page (relocated data), anonymous memory or another file.
func TestTrimmable(t *testing.T) {
	smaps := []byte(`00400000-02133000 r-xp 00000000 fe:01 123 /usr/bin/meshd
Size:              29900 kB
Rss:               20932 kB
Private_Dirty:      1288 kB
Anonymous:             0 kB
02133000-044a7000 r--p 01d33000 fe:01 123 /usr/bin/meshd
Rss:               21840 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
044a7000-0454f000 rw-p 040a7000 fe:01 123 /usr/bin/meshd
Private_Dirty:       608 kB
Anonymous:           300 kB
04550000-04560000 r--p 04150000 fe:01 123 /usr/bin/meshd
Private_Dirty:         4 kB
Anonymous:             4 kB
04560000-04570000 r--p 04160000 fe:01 123 /usr/bin/meshd (deleted)
Private_Dirty:         0 kB
Anonymous:             0 kB
7f1cbc07a000-7f1cbc1d0000 r-xp 00026000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
Private_Dirty:         0 kB
d1ce8400000-d1cec000000 rw-p 00000000 00:00 0
Private_Dirty:     44700 kB
Anonymous:         44700 kB
7ffd1000-7ffd2000 r--p 00000000 00:00 0                          [vvar]
`)
	ms, err := parseSmaps(smaps)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		if trimmable(m, "/usr/bin/meshd") {
			got = append(got, m.perms+" "+m.path)
		}
	}
	if want := []string{"r-xp /usr/bin/meshd", "r--p /usr/bin/meshd", "r--p /usr/bin/meshd (deleted)"}; !slices.Equal(got, want) {
		t.Errorf("trimmable %q, want %q", got, want)
	}
	if _, err := parseSmaps([]byte("zz-00 r-xp 0 0 0 /x\n")); err == nil {
		t.Error("a malformed address range parsed")
	}
}

// cachedPages counts the pages of path in the page cache (mincore of a
// mapping of the whole file, which maps nothing in).
func cachedPages(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestDropCached: the pages of a file nothing maps leave the page cache
// (TrimExecutable does this to its executable once it has unmapped what
// only start-up used; the pages it still maps stay).
func TestDropCached(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC { // its pages are the file: nothing to drop
		t.Skipf("%s is on tmpfs", dir)
	}
	path := filepath.Join(dir, "file")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	unix.Sync() // written back: clean pages can be dropped
	if _, err := os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	before := cachedPages(t, path)
	if err := dropCached(path); err != nil {
		t.Fatal(err)
	}
	if after := cachedPages(t, path); before == 0 || after != 0 {
		t.Fatalf("pages cached: %d before, %d after; want some, then none", before, after)
	}
	if err := dropCached(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("no error for a missing file")
	}
}

// TestTrimAdvisesRandom: every mapping TrimExecutable trims is advised
// MADV_RANDOM afterwards ("rr" in its smaps VmFlags), so what faults back
// comes a page at a time, not a read-ahead window; ReadAheadAgain gives
// them the default advice back.
func TestTrimAdvisesRandom(t *testing.T) {
	if _, err := TrimExecutable(); err != nil {
		t.Fatal(err)
	}
	random := advisedRandom(t)
	if len(random) == 0 {
		t.Fatal("no trimmable mapping of the executable")
	}
	for m, rr := range random {
		if !rr {
			t.Errorf("mapping %s: no rr (MADV_RANDOM) in its VmFlags after the trim", m)
		}
	}
	n, err := ReadAheadAgain()
	if err != nil {
		t.Fatal(err)
	}
	if n != len(random) {
		t.Errorf("ReadAheadAgain advised %d mappings, want %d", n, len(random))
	}
	for m, rr := range advisedRandom(t) {
		if rr {
			t.Errorf("mapping %s: still rr (MADV_RANDOM) after ReadAheadAgain", m)
		}
	}
}

// advisedRandom says, for each trimmable mapping of the executable, whether
// its VmFlags hold rr (MADV_RANDOM).
func advisedRandom(t *testing.T) map[string]bool {
	t.Helper()
	ms, err := trimmableMappings()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range ms {
		if m.flags == nil {
			t.Fatalf("mapping %x-%x %s: no VmFlags read", m.start, m.end, m.path)
		}
		out[fmt.Sprintf("%x-%x %s", m.start, m.end, m.path)] = slices.Contains(m.flags, "rr")
	}
	return out
}

// TestRandomAdviceReadsOnePage: on this kernel, a fault in a read-only
// mapping advised MADV_RANDOM brings one page (or one block) of an uncached
// file into the page cache, and without the advice a read-ahead window:
// what the advice in TrimExecutable is for. Skipped where the page cache
// cannot be emptied (tmpfs, some network and overlay file systems) or the
// device reads nothing ahead.
func TestRandomAdviceReadsOnePage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	touch := func(advice int) (int, bool) {
		t.Helper()
		if err := dropCached(path); err != nil {
			t.Fatal(err)
		}
		if cachedPages(t, path) != 0 {
			return 0, false
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b, err := unix.Mmap(int(f.Fd()), 0, 4<<20, unix.PROT_READ, unix.MAP_PRIVATE)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(b)
		if err := unix.Madvise(b, advice); err != nil {
			t.Fatal(err)
		}
		sink += b[2<<20] // one fault in the middle
		return cachedPages(t, path), true
	}
	random, ok1 := touch(unix.MADV_RANDOM)
	normal, ok2 := touch(unix.MADV_NORMAL)
	switch {
	case !ok1 || !ok2:
		t.Skipf("the page cache keeps %s's pages (tmpfs, or a file system POSIX_FADV_DONTNEED does not empty)", path)
	case normal <= 1:
		t.Skipf("the device of %s reads nothing ahead", path)
	}
	t.Logf("pages cached after one fault: %d with MADV_RANDOM, %d without", random, normal)
	// One page; a block of up to 64 KB where blocks are larger than pages.
	if random < 1 || random > 16 || random >= normal {
		t.Fatalf("pages cached after one fault: %d with MADV_RANDOM, %d without; want 1 (at most a 64 KB block), and fewer than without", random, normal)
	}
}

// sink keeps TestRandomAdviceReadsOnePage's read from being optimised away.
var sink byte
