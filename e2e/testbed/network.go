//go:build e2e

package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"
)

// Location is one network location: a bridge ("br-<name>") in the router
// namespace with its own /27 of 198.51.100.0/24 and /64 of 2001:db8::/32.
// A NATed location's bridge lives instead in its own NAT namespace
// (PREFIX+"nat-"+name) that MASQUERADEs to its address on the WAN segment.
type Location struct {
	Name  string
	Index int
	NAT   bool
	// GatewayNS holds the location's bridge (the router, or the NAT box).
	GatewayNS string
	Bridge    string
	Subnet    netip.Prefix // 198.51.100.(32*Index)/27
	Subnet6   netip.Prefix // 2001:db8:0:<Index>::/64
	Gateway   netip.Addr
	Gateway6  netip.Addr
	// PublicIP is the NAT box's WAN address (NATed locations only).
	PublicIP  netip.Addr
	PublicIP6 netip.Addr
	nodes     int
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// addrAdd returns a with n added to its last two bytes.
func addrAdd(a netip.Addr, n int) netip.Addr {
	b := a.As16()
	v := int(b[14])<<8 | int(b[15]) + n
	b[14], b[15] = byte(v>>8), byte(v)
	r := netip.AddrFrom16(b)
	if a.Is4() {
		return r.Unmap()
	}
	return r
}

func pfx(a netip.Addr, bits int) string { return netip.PrefixFrom(a, bits).String() }

// setupRouter creates the router namespace with the WAN bridge and the
// control-plane namespace attached to it.
func (tb *Testbed) setupRouter(ctx context.Context) error {
	r := tb.RouterNS
	if err := tb.newNetns(ctx, r, true); err != nil {
		return err
	}
	if err := runAll(ctx,
		[]string{"ip", "-n", r, "link", "add", "br-wan", "type", "bridge"},
		[]string{"ip", "-n", r, "addr", "add", pfx(RouterWAN, 24), "dev", "br-wan"},
		[]string{"ip", "-n", r, "addr", "add", pfx(RouterWAN6, 64), "dev", "br-wan", "nodad"},
		[]string{"ip", "-n", r, "link", "set", "br-wan", "up"},
	); err != nil {
		return err
	}
	if err := tb.newNetns(ctx, tb.CPNS, false); err != nil {
		return err
	}
	return tb.attach(ctx, r, "br-wan", "v-cp", tb.CPNS,
		netip.PrefixFrom(APIServerAddr, 24), netip.PrefixFrom(addrAdd(RouterWAN6, 1), 64), RouterWAN, RouterWAN6)
}

// newNetns creates a network namespace with loopback up; forwarding turns
// on IPv4 and IPv6 forwarding.
func (tb *Testbed) newNetns(ctx context.Context, ns string, forwarding bool) error {
	cmds := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"},
	}
	if forwarding {
		cmds = append(cmds, []string{"ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"})
	}
	return runAll(ctx, cmds...)
}

// attach plugs namespace ns into bridge (in gwNS) with a veth: "eth0" in ns,
// hostIf in gwNS; it sets addresses and default routes.
func (tb *Testbed) attach(ctx context.Context, gwNS, bridge, hostIf, ns string, a4, a6 netip.Prefix, gw4, gw6 netip.Addr) error {
	// The kernel destroys the veths of a deleted namespace asynchronously,
	// so the gateway end of one a previous test removed can still be there
	// (RTNETLINK: File exists). It is ours (in our gateway namespace): delete
	// it; the error of a concurrent disappearance does not matter.
	if _, err := run(ctx, "ip", "-n", gwNS, "link", "show", hostIf); err == nil {
		_, _ = run(ctx, "ip", "-n", gwNS, "link", "del", hostIf)
	}
	cmds := [][]string{
		{"ip", "-n", gwNS, "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "-n", gwNS, "link", "set", hostIf, "master", bridge, "up"},
		{"ip", "-n", ns, "addr", "add", a4.String(), "dev", "eth0"},
		{"ip", "-n", ns, "addr", "add", a6.String(), "dev", "eth0", "nodad"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "route", "add", "default", "via", gw4.String()},
		{"ip", "-n", ns, "-6", "route", "add", "default", "via", gw6.String()},
	}
	return runAll(ctx, cmds...)
}

// AddLocation creates a location. With nat the location sits behind its own
// NAT box (MASQUERADE) on the WAN segment.
func (tb *Testbed) AddLocation(ctx context.Context, name string, nat bool) (*Location, error) {
	if !nameRE.MatchString(name) || len(name) > 9 {
		return nil, fmt.Errorf("location name %q: want [a-z0-9-], at most 9 characters", name)
	}
	tb.mu.Lock()
	if _, ok := tb.locations[name]; ok {
		tb.mu.Unlock()
		return nil, fmt.Errorf("location %q exists", name)
	}
	idx := len(tb.locations)
	tb.mu.Unlock()
	if idx >= 8 {
		return nil, fmt.Errorf("at most 8 locations")
	}
	l := &Location{
		Name:      name,
		Index:     idx,
		NAT:       nat,
		GatewayNS: tb.RouterNS,
		Bridge:    "br-" + name,
		Subnet:    netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(32 * idx)}), 27),
		Subnet6:   netip.MustParsePrefix(fmt.Sprintf("2001:db8:0:%x::/64", idx)),
	}
	l.Gateway = addrAdd(l.Subnet.Addr(), 1)
	l.Gateway6 = addrAdd(l.Subnet6.Addr(), 1)
	if nat {
		l.GatewayNS = tb.Prefix + "nat-" + name
		l.PublicIP = addrAdd(WANPrefix.Addr(), 100+idx)
		l.PublicIP6 = addrAdd(WANPrefix6.Addr(), 0x100+idx)
		if err := tb.newNetns(ctx, l.GatewayNS, true); err != nil {
			return nil, err
		}
		if err := tb.attach(ctx, tb.RouterNS, "br-wan", "v-nat-"+name, l.GatewayNS,
			netip.PrefixFrom(l.PublicIP, 24), netip.PrefixFrom(l.PublicIP6, 64), RouterWAN, RouterWAN6); err != nil {
			return nil, err
		}
		if err := runAll(ctx,
			[]string{"ip", "netns", "exec", l.GatewayNS, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE"},
			[]string{"ip", "netns", "exec", l.GatewayNS, "ip6tables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE"},
		); err != nil {
			return nil, err
		}
	}
	g := l.GatewayNS
	if err := runAll(ctx,
		[]string{"ip", "-n", g, "link", "add", l.Bridge, "type", "bridge"},
		[]string{"ip", "-n", g, "addr", "add", pfx(l.Gateway, 27), "dev", l.Bridge},
		[]string{"ip", "-n", g, "addr", "add", pfx(l.Gateway6, 64), "dev", l.Bridge, "nodad"},
		[]string{"ip", "-n", g, "link", "set", l.Bridge, "up"},
	); err != nil {
		return nil, err
	}
	tb.mu.Lock()
	tb.locations[name] = l
	tb.mu.Unlock()
	return l, nil
}

// Location returns the named location.
func (tb *Testbed) Location(name string) *Location {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.locations[name]
}

// NodeOptions describe a node to add.
type NodeOptions struct {
	Name     string
	Location string
	// DualStack gives the node an IPv6 pod CIDR (fd42:0:0:N::/64) besides
	// 10.42.N.0/24, and an IPv6 InternalIP.
	DualStack bool
	// Labels and Annotations are added to the Node object.
	Labels      map[string]string
	Annotations map[string]string
	// NoRegister skips creating the Node object.
	NoRegister bool
	// Cluster is the extra cluster (AddCluster) the node belongs to; nil
	// means the main cluster. It sets the node's kubeconfig, pod network
	// (10.<PodOctet>.N.0/24), mesh and service CIDRs. IPv4 only: do not
	// combine with DualStack.
	Cluster *Cluster
}

// Node is a simulated Kubernetes node: a network namespace PREFIX+name with
// eth0 on its location's bridge, a "cni0" bridge holding the .1 of its pod
// CIDR for its pods, IP forwarding on, and a directory Dir with run/wireguard
// (bind-mounted over /var/run/wireguard for every process of the node),
// state/ (meshd --state-dir) and the logs.
type Node struct {
	tb       *Testbed
	Name     string
	NS       string
	Location *Location
	Index    int // global node number N (pod CIDR 10.42.N.0/24)
	Dir      string
	IP       netip.Addr   // underlay IPv4 (InternalIP)
	IP6      netip.Addr   // underlay IPv6
	PodCIDR  netip.Prefix // 10.42.N.0/24
	PodCIDR6 netip.Prefix // fd42:0:0:N::/64 (dual stack only)
	Opts     NodeOptions
	Cluster  *Cluster // nil: the main cluster

	pods       []*Pod
	meshd      *Proc
	meshdExtra []string
	device     *Proc
}

// binds are the node's private mounts: its own /var/run/wireguard.
func (n *Node) binds() [][2]string {
	return [][2]string{{filepath.Join(n.Dir, "run", "wireguard"), "/run/wireguard"}}
}

// Argv returns the argv that runs cmd in the node's network namespace with
// the node's mount view (NodeExec).
func (n *Node) Argv(cmd ...string) []string { return nsArgv(n.NS, n.binds(), cmd...) }

// Exec runs cmd inside the node (its network namespace and its private
// /var/run/wireguard, so `wg show` sees the node's userspace WireGuard) and
// returns the combined output.
func (n *Node) Exec(ctx context.Context, cmd ...string) (string, error) {
	return run(ctx, n.Argv(cmd...)...)
}

// AddNode creates a node in an existing location and (unless NoRegister)
// registers its Node object.
func (tb *Testbed) AddNode(ctx context.Context, o NodeOptions) (*Node, error) {
	if !nameRE.MatchString(o.Name) || len(o.Name) > 13 || o.Name == "router" || o.Name == "cp" {
		return nil, fmt.Errorf("node name %q: want [a-z0-9-], at most 13 characters", o.Name)
	}
	tb.mu.Lock()
	l := tb.locations[o.Location]
	_, dup := tb.nodes[o.Name]
	if l == nil || dup || l.nodes >= 20 || tb.nextNode >= 250 {
		tb.mu.Unlock()
		return nil, fmt.Errorf("cannot add node %q to location %q (unknown location, duplicate or full)", o.Name, o.Location)
	}
	tb.nextNode++
	idx := tb.nextNode
	k := l.nodes
	l.nodes++
	tb.mu.Unlock()

	n := &Node{
		tb:       tb,
		Name:     o.Name,
		NS:       tb.Prefix + o.Name,
		Location: l,
		Index:    idx,
		Dir:      filepath.Join(tb.Dir, "nodes", o.Name),
		IP:       addrAdd(l.Subnet.Addr(), 10+k),
		IP6:      addrAdd(l.Subnet6.Addr(), 0x10+k),
		PodCIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 42, byte(idx), 0}), 24),
		Opts:     o,
		Cluster:  o.Cluster,
	}
	if o.Cluster != nil {
		n.PodCIDR = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(o.Cluster.PodOctet), byte(idx), 0}), 24)
	}
	if o.DualStack {
		n.PodCIDR6 = netip.MustParsePrefix(fmt.Sprintf("fd42:0:0:%x::/64", idx))
	}
	for _, d := range []string{"run/wireguard", "state"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	if err := tb.newNetns(ctx, n.NS, true); err != nil {
		return nil, err
	}
	if err := tb.attach(ctx, l.GatewayNS, l.Bridge, "v-"+o.Name, n.NS,
		netip.PrefixFrom(n.IP, 27), netip.PrefixFrom(n.IP6, 64), l.Gateway, l.Gateway6); err != nil {
		return nil, err
	}
	gw := addrAdd(n.PodCIDR.Addr(), 1)
	cmds := [][]string{
		{"ip", "-n", n.NS, "link", "add", "cni0", "mtu", "1420", "type", "bridge"},
		{"ip", "-n", n.NS, "addr", "add", pfx(gw, 24), "dev", "cni0"},
		{"ip", "-n", n.NS, "link", "set", "cni0", "up"},
	}
	if n.PodCIDR6.IsValid() {
		cmds = append(cmds, []string{"ip", "-n", n.NS, "addr", "add", pfx(addrAdd(n.PodCIDR6.Addr(), 1), 64), "dev", "cni0", "nodad"})
	}
	if err := runAll(ctx, cmds...); err != nil {
		return nil, err
	}
	tb.writeNodeExec(n.Dir, n.NS, n.binds())
	tb.mu.Lock()
	tb.nodes[o.Name] = n
	tb.mu.Unlock()
	if !o.NoRegister {
		if err := tb.RegisterNode(ctx, n); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// writeNodeExec writes DIR/exec: a script that runs a command (default: a
// shell) inside the node's network namespace with its mounts, for humans.
func (tb *Testbed) writeNodeExec(dir, ns string, binds [][2]string) {
	argv := nsArgv(ns, binds)
	script := "#!/bin/sh\n# Run a command inside " + ns + " with its private /var/run/wireguard.\n" +
		"[ $# -eq 0 ] && set -- bash\nexec " + shellJoin(argv) + " \"$@\"\n"
	_ = os.WriteFile(filepath.Join(dir, "exec"), []byte(script), 0o755)
}

// Node returns the named node.
func (tb *Testbed) Node(name string) *Node {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.nodes[name]
}

// Nodes returns all nodes sorted by name.
func (tb *Testbed) Nodes() []*Node {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var ns []*Node
	for _, n := range tb.nodes {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i].Name < ns[j].Name })
	return ns
}

// Pod is a simulated pod: namespace PREFIX+<node>-<name>, eth0 (MTU 1420)
// on its node's cni0 bridge, an address from the node's pod CIDR(s), default
// routes via the node.
type Pod struct {
	Name   string
	NS     string
	Node   *Node
	IP     netip.Addr
	IP6    netip.Addr
	server *Proc
}

// AddPod adds a pod to the node.
func (n *Node) AddPod(ctx context.Context, name string) (*Pod, error) {
	if !nameRE.MatchString(name) || len(name) > 13 {
		return nil, fmt.Errorf("pod name %q: want [a-z0-9-], at most 13 characters", name)
	}
	tb := n.tb
	tb.mu.Lock()
	k := len(n.pods)
	tb.mu.Unlock()
	p := &Pod{Name: name, NS: n.NS + "-" + name, Node: n, IP: addrAdd(n.PodCIDR.Addr(), 10+k)}
	if n.PodCIDR6.IsValid() {
		p.IP6 = addrAdd(n.PodCIDR6.Addr(), 0x10+k)
	}
	if err := tb.newNetns(ctx, p.NS, false); err != nil {
		return nil, err
	}
	hostIf := "p-" + name
	cmds := [][]string{
		{"ip", "-n", n.NS, "link", "add", hostIf, "mtu", "1420", "type", "veth", "peer", "name", "eth0", "mtu", "1420", "netns", p.NS},
		{"ip", "-n", n.NS, "link", "set", hostIf, "master", "cni0", "up"},
		{"ip", "-n", p.NS, "addr", "add", pfx(p.IP, 24), "dev", "eth0"},
		{"ip", "-n", p.NS, "link", "set", "eth0", "up"},
		{"ip", "-n", p.NS, "route", "add", "default", "via", addrAdd(n.PodCIDR.Addr(), 1).String()},
	}
	if p.IP6.IsValid() {
		cmds = append(cmds,
			[]string{"ip", "-n", p.NS, "addr", "add", pfx(p.IP6, 64), "dev", "eth0", "nodad"},
			[]string{"ip", "-n", p.NS, "-6", "route", "add", "default", "via", addrAdd(n.PodCIDR6.Addr(), 1).String()},
		)
	}
	if err := runAll(ctx, cmds...); err != nil {
		return nil, err
	}
	tb.mu.Lock()
	n.pods = append(n.pods, p)
	tb.mu.Unlock()
	return p, nil
}

// Pods returns the node's pods.
func (n *Node) Pods() []*Pod {
	n.tb.mu.Lock()
	defer n.tb.mu.Unlock()
	return append([]*Pod(nil), n.pods...)
}

// Exec runs cmd inside the pod's network namespace.
func (p *Pod) Exec(ctx context.Context, cmd ...string) (string, error) {
	return run(ctx, nsArgv(p.NS, nil, cmd...)...)
}

// Argv returns argv running cmd in the pod.
func (p *Pod) Argv(cmd ...string) []string { return nsArgv(p.NS, nil, cmd...) }

// Ping sends count pings (0.2 s apart, 1 s timeout each) to dst and fails
// unless every one is answered.
func (p *Pod) Ping(ctx context.Context, dst netip.Addr, count int) error {
	_, err := p.Exec(ctx, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-i", "0.2", "-W", "1", dst.String())
	return err
}

// StartServer starts the e2etool TCP server on port 5000 (both families)
// in the pod, once.
func (p *Pod) StartServer(ctx context.Context) error {
	if p.server != nil && !p.server.Exited() {
		return nil
	}
	tb := p.Node.tb
	pr, err := tb.startProc("server-"+p.NS, filepath.Join(p.Node.Dir, "server-"+p.Name+".log"),
		p.Argv(tb.ToolBinary, "serve", "[::]:5000"))
	if err != nil {
		return err
	}
	p.server = pr
	// Wait until it listens: a process start is slow in the kernel VM
	// (qemu/TCG) while meshd and the API server share its CPU, where 5 s
	// were once not enough (setup, not what a test measures).
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := p.Exec(ctx, "ss", "-Htln", "sport = :5000")
		if len(out) > 0 {
			return nil
		}
		if pr.Exited() || time.Now().After(deadline) {
			return fmt.Errorf("server in pod %s did not start: %s", p.NS, tail(pr.LogPath, 10))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Transfer sends size random bytes over TCP from p to dst's server (port
// 5000 on addr) and checks the echoed SHA-256; it starts dst's server if
// needed.
func (p *Pod) Transfer(ctx context.Context, dst *Pod, addr netip.Addr, size int) error {
	if err := dst.StartServer(ctx); err != nil {
		return err
	}
	_, err := p.Exec(ctx, p.Node.tb.ToolBinary, "send", "-timeout", "10s", netip.AddrPortFrom(addr, 5000).String(), fmt.Sprint(size))
	return err
}

// External is a host outside the cluster on the WAN segment (a "laptop"):
// namespace PREFIX+name with 203.0.113.(10+k) and its own mount view like a
// node (Dir/run/wireguard over /var/run/wireguard).
type External struct {
	tb    *Testbed
	Name  string
	NS    string
	Dir   string
	IP    netip.Addr
	IP6   netip.Addr
	procs []*Proc
}

// AddExternal creates an outside host on the WAN segment.
func (tb *Testbed) AddExternal(ctx context.Context, name string) (*External, error) {
	if !nameRE.MatchString(name) || len(name) > 13 {
		return nil, fmt.Errorf("external name %q invalid", name)
	}
	tb.mu.Lock()
	if _, ok := tb.externals[name]; ok || tb.nodes[name] != nil {
		tb.mu.Unlock()
		return nil, fmt.Errorf("name %q in use", name)
	}
	k := tb.nextExt
	tb.nextExt++
	tb.mu.Unlock()
	e := &External{tb: tb, Name: name, NS: tb.Prefix + name, Dir: filepath.Join(tb.Dir, "externals", name),
		IP: addrAdd(WANPrefix.Addr(), 10+k), IP6: addrAdd(WANPrefix6.Addr(), 0x10+k)}
	if err := os.MkdirAll(filepath.Join(e.Dir, "run", "wireguard"), 0o700); err != nil {
		return nil, err
	}
	if err := tb.newNetns(ctx, e.NS, false); err != nil {
		return nil, err
	}
	if err := tb.attach(ctx, tb.RouterNS, "br-wan", "v-"+name, e.NS,
		netip.PrefixFrom(e.IP, 24), netip.PrefixFrom(e.IP6, 64), RouterWAN, RouterWAN6); err != nil {
		return nil, err
	}
	tb.writeNodeExec(e.Dir, e.NS, e.binds())
	tb.mu.Lock()
	tb.externals[name] = e
	tb.mu.Unlock()
	return e, nil
}

func (e *External) binds() [][2]string {
	return [][2]string{{filepath.Join(e.Dir, "run", "wireguard"), "/run/wireguard"}}
}

// Exec runs cmd inside the external host (network namespace + its private
// /var/run/wireguard).
func (e *External) Exec(ctx context.Context, cmd ...string) (string, error) {
	return run(ctx, nsArgv(e.NS, e.binds(), cmd...)...)
}

// Start runs cmd in the background inside the external host.
func (e *External) Start(name string, cmd ...string) (*Proc, error) {
	p, err := e.tb.startProc(e.NS+"-"+name, filepath.Join(e.Dir, name+".log"), nsArgv(e.NS, e.binds(), cmd...))
	if err != nil {
		return nil, err
	}
	e.procs = append(e.procs, p)
	return p, nil
}

// StartDevice starts `meshd device --interface iface` (userspace WireGuard
// only) inside the external host and waits for its UAPI socket.
func (e *External) StartDevice(ctx context.Context, iface string) (*Proc, error) {
	p, err := e.Start("device-"+iface, e.tb.MeshdBinary, "device", "--interface", iface)
	if err != nil {
		return nil, err
	}
	return p, waitSocket(ctx, p, filepath.Join(e.Dir, "run", "wireguard", iface+".sock"))
}

func waitSocket(ctx context.Context, p *Proc, path string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s exited: %w\n%s", p.Name, p.ExitErr(), tail(p.LogPath, 20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no socket %s after 10s\n%s", p.Name, path, tail(p.LogPath, 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Start runs cmd in the background inside the pod; output goes to the
// node's directory as <pod>-<name>.log.
func (p *Pod) Start(name string, cmd ...string) (*Proc, error) {
	return p.Node.tb.startProc(p.NS+"-"+name, filepath.Join(p.Node.Dir, p.Name+"-"+name+".log"), p.Argv(cmd...))
}

// Start runs cmd in the background inside the node (with its mounts);
// output goes to the node's directory as <name>.log.
func (n *Node) Start(name string, cmd ...string) (*Proc, error) {
	return n.tb.startProc(n.NS+"-"+name, filepath.Join(n.Dir, name+".log"), n.Argv(cmd...))
}
