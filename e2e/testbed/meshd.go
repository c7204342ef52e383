//go:build e2e

package testbed

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MeshdArgs are the flags the testbed gives meshd on node n before extra
// (later flags win, so extra may override e.g. --mesh-granularity).
func (n *Node) MeshdArgs(extra ...string) []string {
	kubeconfig, meshCIDR, serviceCIDR := n.tb.MeshdKubeconfig, MeshCIDR, ServiceCIDR
	if c := n.Cluster; c != nil {
		kubeconfig, meshCIDR, serviceCIDR = c.MeshdKubeconfig, c.MeshCIDR, c.ServiceCIDR
	}
	args := []string{
		"--kubeconfig", kubeconfig,
		"--hostname", n.Name,
		"--state-dir", filepath.Join(n.Dir, "state"),
		"--listen", "127.0.0.1:9477",
		"--resync-period", "5s",
		"--mesh-cidr", meshCIDR,
		"--service-cidr", serviceCIDR,
		"--lease-namespace", LeaseNamespace,
		"--log-level", "debug",
	}
	if n.PodCIDR6.IsValid() {
		args = append(args, "--mesh-cidr", MeshCIDR6)
	}
	if m := WireGuardMode(); m != "" {
		args = append(args, "--wireguard", m)
	}
	args = append(args, strings.Fields(os.Getenv("E2E_MESHD_ARGS"))...)
	return append(args, extra...)
}

// WireGuardMode is E2E_WIREGUARD (auto, kernel or userspace; "" when
// unset): the --wireguard flag every meshd of the testbed gets unless a
// scenario passes its own. `make e2e-kernel` runs scenarios with
// E2E_WIREGUARD=kernel inside a VM whose kernel has WireGuard.
func WireGuardMode() string { return os.Getenv("E2E_WIREGUARD") }

// MeshdLog is the path of the node's meshd log.
func (n *Node) MeshdLog() string { return filepath.Join(n.Dir, "meshd.log") }

// Meshd returns the running meshd process (nil if none was started).
func (n *Node) Meshd() *Proc { return n.meshd }

// Device returns the node's `meshd device` process (nil if none was started).
func (n *Node) Device() *Proc { return n.device }

// StartMeshd starts meshd on the node (logs appended to MeshdLog). It does
// not wait for readiness (see WaitMeshdReady).
func (n *Node) StartMeshd(extra ...string) error {
	if n.meshd != nil && !n.meshd.Exited() {
		return fmt.Errorf("meshd already running on %s", n.Name)
	}
	argv := append([]string{n.tb.MeshdBinary}, n.MeshdArgs(extra...)...)
	p, err := n.tb.startProc("meshd-"+n.Name, n.MeshdLog(), n.Argv(argv...))
	if err != nil {
		return err
	}
	n.meshd = p
	n.meshdExtra = append([]string(nil), extra...)
	return nil
}

// RestartMeshd stops meshd with sig (waiting up to timeout) and starts it
// again with the same arguments; it returns the stop error (nil for a clean
// exit) and does not wait for readiness.
func (n *Node) RestartMeshd(sig syscall.Signal, timeout time.Duration) error {
	stopErr := n.StopMeshd(sig, timeout)
	if err := n.StartMeshd(n.meshdExtra...); err != nil {
		return err
	}
	return stopErr
}

// StopMeshd sends sig (SIGTERM normally) to meshd and waits up to timeout
// for it to exit, then kills it. It returns the exit error (nil for exit 0).
func (n *Node) StopMeshd(sig syscall.Signal, timeout time.Duration) error {
	p := n.meshd
	if p == nil || p.Exited() {
		return nil
	}
	_ = p.Signal(sig)
	select {
	case <-p.Done():
		return p.Err()
	case <-time.After(timeout):
		_ = p.Signal(syscall.SIGKILL)
		<-p.Done()
		return fmt.Errorf("meshd on %s did not exit within %s after %s; killed", n.Name, timeout, sig)
	}
}

// HTTPGet fetches url from inside the node's network namespace (e.g.
// http://127.0.0.1:9477/metrics).
func (n *Node) HTTPGet(ctx context.Context, url string) (int, string, error) {
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: NetnsDialer(netnsPath(n.NS)), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// WaitMeshdReady waits until meshd's /readyz answers 200 (or meshd exits).
func (n *Node) WaitMeshdReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		if n.meshd == nil {
			return fmt.Errorf("meshd not started on %s", n.Name)
		}
		if n.meshd.Exited() {
			return fmt.Errorf("meshd on %s exited: %w\n%s", n.Name, n.meshd.ExitErr(), tail(n.MeshdLog(), 40))
		}
		code, body, err := n.HTTPGet(ctx, "http://127.0.0.1:9477/readyz")
		if err == nil && code == 200 {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("meshd on %s not ready after %s: %s\n%s", n.Name, timeout, last, tail(n.MeshdLog(), 40))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Metrics returns meshd's /metrics text.
func (n *Node) Metrics(ctx context.Context) (string, error) {
	code, body, err := n.HTTPGet(ctx, "http://127.0.0.1:9477/metrics")
	if err == nil && code != 200 {
		err = fmt.Errorf("/metrics: HTTP %d", code)
	}
	return body, err
}

// StartDevice starts `meshd device --interface iface` (the userspace
// WireGuard device alone, as a separate long-lived process) on the node and
// waits for its UAPI socket.
func (n *Node) StartDevice(ctx context.Context, iface string) (*Proc, error) {
	p, err := n.tb.startProc("device-"+n.Name, filepath.Join(n.Dir, "device.log"),
		n.Argv(n.tb.MeshdBinary, "device", "--interface", iface, "--log-level", "debug"))
	if err != nil {
		return nil, err
	}
	n.device = p
	return p, waitSocket(ctx, p, filepath.Join(n.Dir, "run", "wireguard", iface+".sock"))
}

// WGPeer is one peer line of `wg show IFACE dump`.
type WGPeer struct {
	PublicKey       string
	PresharedKey    string
	Endpoint        string
	AllowedIPs      []string
	LatestHandshake time.Time // zero: never
	RX, TX          int64
	Keepalive       string
}

// WGDevice is `wg show IFACE dump`.
type WGDevice struct {
	PublicKey  string
	ListenPort int
	Peers      []WGPeer
}

// Peer returns the peer with the given public key, or nil.
func (d *WGDevice) Peer(key string) *WGPeer {
	for i := range d.Peers {
		if d.Peers[i].PublicKey == key {
			return &d.Peers[i]
		}
	}
	return nil
}

// WG reads the WireGuard device iface of the node with `wg show IFACE dump`.
func (n *Node) WG(ctx context.Context, iface string) (*WGDevice, error) {
	out, err := n.Exec(ctx, "wg", "show", iface, "dump")
	if err != nil {
		return nil, err
	}
	return ParseWGDump(out)
}

// WG reads a WireGuard device of the external host.
func (e *External) WG(ctx context.Context, iface string) (*WGDevice, error) {
	out, err := e.Exec(ctx, "wg", "show", iface, "dump")
	if err != nil {
		return nil, err
	}
	return ParseWGDump(out)
}

// ParseWGDump parses the output of `wg show IFACE dump`.
func ParseWGDump(out string) (*WGDevice, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || lines[0] == "" {
		return nil, fmt.Errorf("empty wg dump")
	}
	f := strings.Split(lines[0], "\t")
	if len(f) < 4 {
		return nil, fmt.Errorf("bad wg dump interface line %q", lines[0])
	}
	d := &WGDevice{PublicKey: f[1]}
	d.ListenPort, _ = strconv.Atoi(f[2])
	for _, l := range lines[1:] {
		f := strings.Split(l, "\t")
		if len(f) < 8 {
			return nil, fmt.Errorf("bad wg dump peer line %q", l)
		}
		p := WGPeer{PublicKey: f[0], PresharedKey: f[1], Endpoint: f[2], Keepalive: f[7]}
		if f[3] != "(none)" && f[3] != "" {
			p.AllowedIPs = strings.Split(f[3], ",")
		}
		if hs, _ := strconv.ParseInt(f[4], 10, 64); hs > 0 {
			p.LatestHandshake = time.Unix(hs, 0)
		}
		p.RX, _ = strconv.ParseInt(f[5], 10, 64)
		p.TX, _ = strconv.ParseInt(f[6], 10, 64)
		d.Peers = append(d.Peers, p)
	}
	return d, nil
}

// Diagnostics returns meshd's log tail and the node's WireGuard, routing
// and iptables state, for failure reports.
func (n *Node) Diagnostics(ctx context.Context, logLines int) string {
	var b strings.Builder
	pods := n.PodCIDR.String()
	if n.PodCIDR6.IsValid() {
		pods += " " + n.PodCIDR6.String()
	}
	fmt.Fprintf(&b, "===== node %s (netns %s, location %s, underlay %s, pods %s; shell: %s/exec)\n", n.Name, n.NS, n.Location.Name, n.IP, pods, n.Dir)
	if n.Cluster != nil {
		fmt.Fprintf(&b, "----- cluster %s (%s; kubectl: %s/kubectl)\n", n.Cluster.Name, n.Cluster.APIServer(), n.Cluster.Dir)
	}
	fmt.Fprintf(&b, "----- meshd log %s (last %d lines)\n%s\n", n.MeshdLog(), logLines, tail(n.MeshdLog(), logLines))
	if n.device != nil {
		fmt.Fprintf(&b, "----- meshd device log (last 20 lines)\n%s\n", tail(n.device.LogPath, 20))
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, c := range [][]string{
		{"wg", "show", "all"},
		{"ip", "-br", "addr"},
		{"ip", "rule"},
		{"ip", "-6", "rule"},
		{"ip", "route", "show", "table", "51820"},
		{"ip", "-6", "route", "show", "table", "51820"},
		{"ip", "route"},
		{"sh", "-c", "iptables-save | grep -i meshd; ip6tables-save | grep -i meshd"},
	} {
		cmd := exec.CommandContext(ctx, n.Argv(c...)[0], n.Argv(c...)[1:]...)
		o, err := cmd.CombinedOutput()
		out := string(o)
		if err != nil && c[0] != "sh" {
			out += " (" + err.Error() + ")"
		}
		fmt.Fprintf(&b, "----- %s\n%s\n", strings.Join(c, " "), strings.TrimRight(out, "\n"))
	}
	return b.String()
}
