package wg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestLoadOrCreateKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	k1, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k1 == (wgtypes.Key{}) {
		t.Fatal("zero key")
	}
	fi, err := os.Stat(filepath.Join(dir, "private-key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	di, _ := os.Stat(dir)
	if di.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v", di.Mode())
	}
	k2, err := LoadOrCreateKey(dir)
	if err != nil || k2 != k1 {
		t.Fatalf("restart gave a different key (err %v)", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("leftover files: %v", entries)
	}
}

func TestLoadOrCreateKeyCorruptIsError(t *testing.T) {
	for _, content := range []string{"", "not base64!!\n", "AAAA\n", strings.Repeat("A", 43) + "=\n"} {
		dir := t.TempDir()
		path := filepath.Join(dir, "private-key")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreateKey(dir)
		if err == nil || !strings.Contains(err.Error(), "corrupt") {
			t.Fatalf("content %q: err %v", content, err)
		}
		if b, _ := os.ReadFile(path); string(b) != content {
			t.Fatalf("corrupt key file was replaced")
		}
	}
}

func TestLoadOrCreateKeyReadsWgGenkeyFormat(t *testing.T) {
	dir := t.TempDir()
	k, _ := wgtypes.GeneratePrivateKey()
	if err := os.WriteFile(filepath.Join(dir, "private-key"), []byte(k.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LoadOrCreateKey(dir)
	if err != nil || got != k {
		t.Fatalf("got other key, err %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "private-key")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("permissions not tightened: %v", fi.Mode())
	}
}

// A state directory created 0755 (as a hostPath DirectoryOrCreate is) and a
// key file with loose or odd permissions end up 0700 and 0600, both when the
// key is created and when it is read.
func TestLoadOrCreateKeyTightensPermissions(t *testing.T) {
	for _, existing := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "state")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
			t.Fatal(err)
		}
		key := filepath.Join(dir, "private-key")
		if existing {
			k, _ := wgtypes.GeneratePrivateKey()
			if err := os.WriteFile(key, []byte(k.String()+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(key, 0o444); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := LoadOrCreateKey(dir); err != nil {
			t.Fatal(err)
		}
		if di, err := os.Stat(dir); err != nil || di.Mode().Perm() != 0o700 {
			t.Errorf("existing key %v: directory mode %v (%v), want 0700", existing, di.Mode().Perm(), err)
		}
		if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("existing key %v: key mode %v (%v), want 0600", existing, fi.Mode().Perm(), err)
		}
	}
}
