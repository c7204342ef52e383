package wg

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// LoadOrCreateKey returns the private key stored in dir/private-key (base64,
// as wg(8) writes it), generating and storing one on first use (written
// atomically and never over an existing file). The directory ends up 0700
// and the file 0600, whatever they were before. A
// file that does not hold a valid key is an error: it is never replaced.
// The key itself never appears in errors.
func LoadOrCreateKey(dir string) (wgtypes.Key, error) {
	if dir == "" {
		return wgtypes.Key{}, errors.New("loading WireGuard private key: no directory given")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return wgtypes.Key{}, fmt.Errorf("creating key directory %s: %w", dir, err)
	}
	// A hostPath (DirectoryOrCreate) is created 0755 by the kubelet, and
	// MkdirAll leaves an existing directory as it is.
	if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return wgtypes.Key{}, fmt.Errorf("restricting permissions of key directory %s: %w", dir, err)
		}
	}
	path := filepath.Join(dir, keyFileName)
	k, err := readKey(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return k, err
	}

	return createKeyFile(dir, keyFileName)
}

// createKeyFile generates a private key and stores it in dir/name: written
// to a temporary file (0600), synced, then linked into place, which fails if
// the file exists (then the stored key wins and is returned).
func createKeyFile(dir, name string) (wgtypes.Key, error) {
	path := filepath.Join(dir, name)
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generating WireGuard private key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("writing WireGuard private key in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return wgtypes.Key{}, fmt.Errorf("writing WireGuard private key %s: %w", path, err)
	}
	_, werr := tmp.WriteString(k.String() + "\n")
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return wgtypes.Key{}, fmt.Errorf("writing WireGuard private key %s: %w", path, err)
	}
	// Link, unlike rename, fails if another process stored a key first:
	// then that key wins.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return readKey(path)
		}
		return wgtypes.Key{}, fmt.Errorf("storing WireGuard private key %s: %w", path, err)
	}
	syncDir(dir)
	return k, nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// Key rotation: the next key lives in dir/private-key.next (0600, written
// like the current key) from the moment a rotation starts until it is
// committed, so a restart in the middle of a rotation resumes it with the
// same next key, and no key is ever lost.

// LoadNextKey returns the next private key of an ongoing rotation, stored in
// dir/private-key.next; ok is false when there is none.
func LoadNextKey(dir string) (k wgtypes.Key, ok bool, err error) {
	k, err = readKey(filepath.Join(dir, nextKeyFileName))
	if errors.Is(err, os.ErrNotExist) {
		return wgtypes.Key{}, false, nil
	}
	return k, err == nil, err
}

// LoadOrCreateNextKey returns the next private key of a rotation, generating
// and storing it in dir/private-key.next first if there is none. The
// directory must exist (LoadOrCreateKey made it).
func LoadOrCreateNextKey(dir string) (wgtypes.Key, error) {
	k, ok, err := LoadNextKey(dir)
	if err != nil || ok {
		return k, err
	}
	return createKeyFile(dir, nextKeyFileName)
}

// CommitNextKey makes the next key the current one: dir/private-key.next is
// renamed over dir/private-key (atomic: the file holds the old key or the
// new one, never neither), so the old private key is gone from disk. want is
// the key the caller switched to: if the next key file holds another key
// (or none), nothing is renamed and an error says so.
func CommitNextKey(dir string, want wgtypes.Key) error {
	k, ok, err := LoadNextKey(dir)
	if err != nil {
		return err
	}
	if !ok || k != want {
		cur, cerr := readKey(filepath.Join(dir, keyFileName))
		if cerr == nil && cur == want {
			return nil // already committed
		}
		return fmt.Errorf("committing the WireGuard key rotation in %s: %s does not hold the key switched to", dir, nextKeyFileName)
	}
	if err := os.Rename(filepath.Join(dir, nextKeyFileName), filepath.Join(dir, keyFileName)); err != nil {
		return fmt.Errorf("committing the WireGuard key rotation in %s: %w", dir, err)
	}
	syncDir(dir)
	return nil
}

func readKey(path string) (wgtypes.Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("reading WireGuard private key %s: %w", path, err)
	}
	k, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil || k == (wgtypes.Key{}) {
		// Do not wrap err: it could quote the file's contents.
		return wgtypes.Key{}, fmt.Errorf("WireGuard private key file %s is corrupt (want one base64 key of 32 bytes); not replacing it: fix or remove it", path)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm() != 0o600 {
		if err := os.Chmod(path, 0o600); err != nil {
			return wgtypes.Key{}, fmt.Errorf("restricting permissions of %s: %w", path, err)
		}
	}
	return k, nil
}
