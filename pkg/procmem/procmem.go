// Package procmem returns to the kernel the pages of this process's own
// executable that only its start-up touched.
//
// A Go program runs every linked package's initialisation before main, and
// meshd links much more than its node daemon runs at idle (client-go's
// registration of every API group, the code of its other subcommands). The
// kernel maps the executable's pages in as they are touched, and around
// them (fault-around), so a freshly started meshd keeps about 35-45 MB of
// its 64 MB of code and read-only data resident, though only a fraction
// runs again. TrimExecutable unmaps the clean pages of the executable's
// read-only mappings (MADV_DONTNEED), then asks the kernel to drop the
// executable's pages that are now mapped by no one from the page cache
// (POSIX_FADV_DONTNEED). What runs again faults back in from the disk.
// Without the drop it would come back from the cached copy in whatever
// folios that copy has: a binary just written (an image layer just
// unpacked) is cached in large folios, and Linux 6.18 maps a whole folio on
// a fault, 43-45 MB of file pages at steady state where 27-30 MB come back
// from the disk (docs/scale.md).
//
// What comes back from the disk came with the device's read-ahead window
// (8 MB on this testbed's disk), and the kernel maps what is cached around
// a faulting page (fault-around, 64 KB): every page used brought its
// neighbours into the resident set. So TrimExecutable also advises the
// trimmed mappings MADV_RANDOM: a fault in the read-only data (the type
// and function tables the garbage collector reads, most of what comes
// back) then reads the one page it needs. Linux 6.18 still reads ahead for
// a mapping of code, with the advice about half as much. The advice is
// meant for the start-up only: a mapping advised MADV_RANDOM also loses the
// kernel's record of recent use when it reclaims memory, and a cold path
// pays a read per page. ReadAheadAgain ends it (meshd does 10 minutes after
// the trim), once what keeps running has come back; the pages stay
// mapped. With the advice, the node daemon's file pages at steady state
// are 28-32 MB instead of 36-39 (docs/scale.md). The process's resident
// set then holds what it keeps using.
//
// Out of scope: the Go heap and stacks (the runtime's: GOGC, GOMEMLIMIT),
// any writable or anonymous mapping (never touched: dropping one would
// lose data), and other processes' memory.
package procmem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Result is what TrimExecutable did.
type Result struct {
	// Mappings is how many mappings were trimmed, Bytes their size.
	Mappings int
	Bytes    uint64
	// ResidentBefore and ResidentAfter are the process's resident file
	// pages (RssFile) before and right after, in bytes.
	ResidentBefore, ResidentAfter uint64
	// CacheDropped: the executable's unmapped pages were dropped from the
	// page cache.
	CacheDropped bool
}

// mapping is one mapping of /proc/self/smaps with the fields TrimExecutable
// reads, and its VmFlags.
type mapping struct {
	start, end  uintptr
	perms, path string
	// anon is Anonymous in kB: pages the process wrote into a private
	// mapping (a copy of its own), which must never be dropped. (A file
	// page written to disk late, a freshly built binary's, is Private_Dirty
	// without being anonymous: it stays in the page cache.)
	anon uint64
	// flags is VmFlags: among others, the advice the mapping has (rr:
	// MADV_RANDOM).
	flags []string
}

// TrimExecutable drops this process's mapped pages of its own executable's
// read-only mappings that it never wrote (see the package doc), and advises
// those mappings MADV_RANDOM until ReadAheadAgain. It never touches a
// mapping that is writable or holds a private copy of a page.
func TrimExecutable() (Result, error) {
	ms, err := trimmableMappings()
	if err != nil {
		return Result{}, err
	}
	var r Result
	r.ResidentBefore, _ = residentFile()
	var errs []error
	for _, m := range ms {
		// The addresses come from the kernel: a mapping of this process.
		if err := madvise(m, unix.MADV_DONTNEED); err != nil {
			errs = append(errs, err)
			continue
		}
		r.Mappings++
		r.Bytes += uint64(m.end - m.start)
		// What runs again comes back a page at a time (see the package doc).
		if err := madvise(m, unix.MADV_RANDOM); err != nil {
			errs = append(errs, err)
		}
	}
	if r.Mappings > 0 {
		if err := dropCached("/proc/self/exe"); err != nil {
			errs = append(errs, err)
		} else {
			r.CacheDropped = true
		}
	}
	r.ResidentAfter, _ = residentFile()
	return r, errors.Join(errs...)
}

// ReadAheadAgain ends TrimExecutable's MADV_RANDOM: the executable's
// read-only mappings get the kernel's default advice back, so that the
// pages they keep using count as recently used again when the kernel
// reclaims memory (it ignores the accesses of a mapping advised
// MADV_RANDOM), and a cold path faults in with read-ahead. It returns how
// many mappings it advised.
func ReadAheadAgain() (int, error) {
	ms, err := trimmableMappings()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, m := range ms {
		if err := madvise(m, unix.MADV_NORMAL); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// trimmableMappings are this process's mappings of its own executable that
// TrimExecutable may trim (trimmable).
func trimmableMappings() ([]mapping, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("finding the executable: %w", err)
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("reading the mappings: %w", err)
	}
	ms, err := parseSmaps(smaps)
	if err != nil {
		return nil, err
	}
	out := ms[:0]
	for _, m := range ms {
		if trimmable(m, exe) {
			out = append(out, m)
		}
	}
	return out, nil
}

// madvise gives advice on the whole of m.
func madvise(m mapping, advice int) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, uintptr(advice)); e != 0 {
		return fmt.Errorf("madvise(%d) %x-%x %s: %w", advice, m.start, m.end, m.path, e)
	}
	return nil
}

// dropCached drops path's pages that no process maps from the page cache
// (the kernel keeps mapped and dirty ones).
func dropCached(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening the executable: %w", err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("dropping the executable's unused cached pages: %w", err)
	}
	return nil
}

// trimmable: a mapping of exe, not writable, with no page of its own.
func trimmable(m mapping, exe string) bool {
	path := strings.TrimSuffix(m.path, " (deleted)")
	return path == exe && len(m.perms) >= 2 && m.perms[1] != 'w' && m.anon == 0
}

// parseSmaps reads the mappings of /proc/PID/smaps.
func parseSmaps(b []byte) ([]mapping, error) {
	var out []mapping
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(f[0], "-"); ok && len(f) >= 5 {
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil || end < start {
				return nil, fmt.Errorf("reading the mappings: malformed line %q", s.Text())
			}
			m := mapping{start: uintptr(start), end: uintptr(end), perms: f[1]}
			if len(f) >= 6 {
				m.path = strings.Join(f[5:], " ")
			}
			out = append(out, m)
			continue
		}
		if len(out) == 0 || len(f) < 2 {
			continue
		}
		m := &out[len(out)-1]
		switch f[0] {
		case "Anonymous:":
			m.anon, _ = strconv.ParseUint(f[1], 10, 64)
		case "VmFlags:":
			m.flags = f[1:]
		}
	}
	return out, s.Err()
}

// residentFile is the process's RssFile, in bytes.
func residentFile() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no RssFile in /proc/self/status")
}
