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

	k, err = wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generating WireGuard private key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".private-key-*")
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
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return k, nil
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
