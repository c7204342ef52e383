package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	goiptables "github.com/coreos/go-iptables/iptables"
)

// Runner is the Controller's only access to the kernel.
type Runner interface {
	// Save returns the iptables-save output of one table, or of every
	// table when table is "".
	Save(table string) ([]byte, error)
	// Restore applies input in iptables-restore format with --noflush.
	Restore(input []byte) error
}

// execTimeout bounds one iptables-save or iptables-restore process.
const execTimeout = 2 * time.Minute

// ExecRunner runs the iptables-save and iptables-restore binaries.
type ExecRunner struct {
	SaveBin    string
	RestoreBin string
	// Exec, when set, is put before every command line, for example
	// []string{"nsenter", "--net=/run/netns/NAME"}.
	Exec []string
	// NFT says the binaries use the nf_tables backend, whose ruleset
	// generation then tells whether anything changed (without Exec only:
	// it is read in the caller's network namespace).
	NFT bool
	// Version is the iptables version (major, minor, patch), as
	// github.com/coreos/go-iptables reads it.
	Version [3]int
}

// minVersion is the oldest iptables whose iptables-restore takes -w (wait
// for the xtables lock), which every Restore passes.
var minVersion = [3]int{1, 6, 2}

// checkVersion refuses an iptables older than minVersion with an error that
// says so, instead of a failing restore later.
func checkVersion(bin string, v [3]int) error {
	for i := range v {
		if v[i] != minVersion[i] {
			if v[i] < minVersion[i] {
				return fmt.Errorf("%s is v%d.%d.%d; meshd needs v%d.%d.%d or later (iptables-restore -w)",
					bin, v[0], v[1], v[2], minVersion[0], minVersion[1], minVersion[2])
			}
			return nil
		}
	}
	return nil
}

// NewExecRunner finds the save and restore binaries of opts.Family and
// opts.Backend in $PATH.
func NewExecRunner(opts Options) (*ExecRunner, error) {
	base := "iptables"
	if opts.Family == IPv6 {
		base = "ip6tables"
	}
	switch opts.Backend {
	case "":
	case "legacy", "nft":
		base += "-" + opts.Backend
	default:
		return nil, fmt.Errorf("unknown iptables backend %q (want \"\", \"legacy\" or \"nft\")", opts.Backend)
	}
	r := &ExecRunner{Exec: opts.Exec}
	// go-iptables finds the family's and backend's iptables binary and
	// reads its version. Its rule operations (Exists, Insert, ChainExists)
	// run one process per call, so the Controller does not use them: it
	// reads a table once (iptables-save) and writes all changes, jumps
	// included, in one iptables-restore transaction.
	proto := goiptables.ProtocolIPv4
	if opts.Family == IPv6 {
		proto = goiptables.ProtocolIPv6
	}
	ipt, err := goiptables.New(goiptables.IPFamily(proto), goiptables.Path(base))
	if err != nil {
		return nil, fmt.Errorf("finding %s: %w", base, err)
	}
	r.Version[0], r.Version[1], r.Version[2] = ipt.GetIptablesVersion()
	if err := checkVersion(base, r.Version); err != nil {
		return nil, err
	}
	if r.SaveBin, err = exec.LookPath(base + "-save"); err != nil {
		return nil, fmt.Errorf("finding %s-save: %w", base, err)
	}
	if r.RestoreBin, err = exec.LookPath(base + "-restore"); err != nil {
		return nil, fmt.Errorf("finding %s-restore: %w", base, err)
	}
	switch opts.Backend {
	case "nft":
		r.NFT = true
	case "":
		// "iptables-save v1.8.9 (nf_tables)" or "... (legacy)".
		out, err := r.run(nil, r.SaveBin, "--version")
		if err != nil {
			return nil, fmt.Errorf("finding the backend of %s: %w", r.SaveBin, err)
		}
		r.NFT = strings.Contains(string(out), "nf_tables")
	}
	return r, nil
}

// Generation returns the nf_tables ruleset generation; it fails for the
// legacy backend and with Exec.
func (r *ExecRunner) Generation() (uint64, error) {
	if !r.NFT || len(r.Exec) > 0 {
		return 0, errNoGeneration
	}
	return nftGeneration()
}

// Save runs iptables-save [-t table].
func (r *ExecRunner) Save(table string) ([]byte, error) {
	var args []string
	if table != "" {
		args = []string{"-t", table}
	}
	out, err := r.run(nil, r.SaveBin, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Restore runs iptables-restore --noflush with input on stdin.
func (r *ExecRunner) Restore(input []byte) error {
	_, err := r.run(input, r.RestoreBin, "-w", "5", "--noflush")
	return err
}

func (r *ExecRunner) run(stdin []byte, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), execTimeout)
	defer cancel()
	argv := append(append(append([]string(nil), r.Exec...), bin), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return nil, fmt.Errorf("running %s: %w", strings.Join(argv, " "), err)
		}
		return nil, fmt.Errorf("running %s: %w: %s", strings.Join(argv, " "), err, msg)
	}
	return stdout.Bytes(), nil
}
