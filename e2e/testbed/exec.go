//go:build e2e

package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

// run executes argv on the host and returns its combined output. The error
// includes the command line and the output.
func run(ctx context.Context, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// mustRun is run for a batch of commands; it stops at the first error.
func runAll(ctx context.Context, cmds ...[]string) error {
	for _, c := range cmds {
		if _, err := run(ctx, c...); err != nil {
			return err
		}
	}
	return nil
}

// nsArgv returns argv that runs cmd inside network namespace ns. When binds
// is not empty the command also gets its own mount namespace (ip netns exec
// always creates one, with "/" as a slave of the host's) in which every
// binds[i] = {source, target} is bind-mounted first. Nothing propagates
// back to the host.
func nsArgv(ns string, binds [][2]string, cmd ...string) []string {
	argv := []string{"ip", "netns", "exec", ns}
	if len(binds) == 0 {
		return append(argv, cmd...)
	}
	var script strings.Builder
	args := []string{}
	for i, b := range binds {
		fmt.Fprintf(&script, "mount --bind \"$%d\" \"$%d\" && ", 2*i+1, 2*i+2)
		args = append(args, b[0], b[1])
	}
	fmt.Fprintf(&script, "shift %d && exec \"$@\"", 2*len(binds))
	argv = append(argv, "sh", "-c", script.String(), "sh")
	argv = append(argv, args...)
	return append(argv, cmd...)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@,+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// Proc is a background process started by the testbed.
type Proc struct {
	Name    string
	LogPath string
	Argv    []string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited (only known for processes
// whose Wait runs in this process).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the exit error once Done is closed.
func (p *Proc) Err() error { <-p.done; return p.err }

// ExitErr is Err for a process that should not have exited: never nil (an
// exit with status 0 is an error too), so messages can wrap it.
func (p *Proc) ExitErr() error {
	if err := p.Err(); err != nil {
		return err
	}
	return errors.New("exit status 0")
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM, waits up to grace, then SIGKILLs. It returns when the
// process is gone.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// startProc starts argv in the background in its own session, with stdout
// and stderr appended to logPath. The process survives this program (the
// demo relies on that); the pid is written to pidDir/name.pid.
func startProc(name, logPath, pidDir string, argv []string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "==== %s starting: %s\n", time.Now().Format(time.RFC3339Nano), shellJoin(argv))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logf.Close()
	p := &Proc{Name: name, LogPath: logPath, Argv: argv, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if pidDir != "" {
		_ = os.MkdirAll(pidDir, 0o755)
		_ = os.WriteFile(pidDir+"/"+name+".pid", []byte(fmt.Sprintf("%d\n", p.Pid())), 0o644)
	}
	return p, nil
}

// inNetns runs fn on a locked OS thread switched into the network namespace
// at nsPath. Sockets created by fn stay in that namespace after fn returns.
func inNetns(nsPath string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(nsPath)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime discards it when this
			// goroutine exits, so no other goroutine runs in the wrong ns.
			errc <- errors.Join(ferr, fmt.Errorf("restore netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// NetnsDialer returns a DialContext function whose connections are created
// inside the network namespace at nsPath (e.g. /run/netns/NAME). This is how
// the test process (in the host namespace) talks to the API server and to
// meshd's metrics endpoint without touching the host's networking.
func NetnsDialer(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetns(nsPath, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
