package main

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/probe"
)

// Leader failover: wiring of the data-plane signal (pkg/probe) into the
// liveness decisions (liveness.Liveness). The flow stays one way:
//
//	prober (UDP echo on the underlay, among leader candidates) → its
//	results → this node's heartbeat Lease (meshd.io/probe-up/-down,
//	written when they change) → every node's Lease informer (the
//	candidates' Leases) → liveness.Liveness (Judge: lease-live and not
//	voted down) → mesh.Local.Live/Settling → plan.
//
// Every node decides from the same published reports, so they agree on the
// leaders; the reconcile only hands the prober its targets.

// remoteCandidateEvery is how much less often a candidate probes another
// location's candidates that do not lead it (every 4th interval: 2 s, down
// after 8 s): the current leader's loss is what fails traffic over within
// seconds, the others' only matters once one of them leads, by when it has
// been probed for a while. At 10 locations it halves the probe packets.
const remoteCandidateEvery = 4

// probeTargets are the nodes self probes, if it is a leader candidate
// (mesh.Candidates; only candidates lead, so only they are judged and
// vote): every other candidate with an observed Lease (judged), of its own
// location at its internal IP, of every other location at its endpoint
// address (its leader at every interval, the others at every
// remoteCandidateEvery-th; leaders: location name to leader). Probing is
// thus bounded by the candidates (k per location), not by the cluster's
// size, and a non-candidate neither probes nor is probed.
func probeTargets(nodes []mesh.Node, self string, g mesh.Granularity, candidates, judged map[string]bool, leaders map[string]string, port int) []probe.Target {
	if !candidates[self] {
		return nil
	}
	selfLoc := ""
	for _, n := range nodes {
		if n.Name == self {
			selfLoc = convert.LocationKey(n, g)
		}
	}
	var out []probe.Target
	for _, n := range nodes {
		if n.Name == self || !candidates[n.Name] || !judged[n.Name] {
			continue
		}
		if convert.LocationKey(n, g) == selfLoc {
			if len(n.InternalIPs) > 0 {
				out = append(out, probe.Target{Name: n.Name, Addr: netip.AddrPortFrom(preferV4(n.InternalIPs), uint16(port))})
			}
		} else if a := n.Endpoint.Addr.Addr(); a.IsValid() {
			t := probe.Target{Name: n.Name, Addr: netip.AddrPortFrom(a.Unmap(), uint16(port))}
			if leaders[n.Location] != n.Name {
				t.Every = remoteCandidateEvery
			}
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b probe.Target) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Tunnel probes: a location leader sends ICMP echo requests, unmarked, to
// the mesh addresses of every linked cluster's leaders, so they cross the
// WireGuard tunnel and the answers come back through it. At the probe
// interval (500 ms); a target silent for tunnelDownAfter is down, and back
// up on its first answer. A cluster is down when at least one of its targets
// is down and none is up (clusterReport); the node publishes that on its
// Lease (meshd.io/clusters-up/-down), where meshd mirror reads it.
const (
	tunnelDownAfter = 3 * time.Second
	// tunnelTargetsPerCluster caps the mesh addresses probed per linked
	// cluster.
	tunnelTargetsPerCluster = 8
)

// tunnelTargets are the tunnel probe targets: in every linked cluster (by
// name), the IPv4 mesh addresses its leaders' peers route (their allowed
// IPs inside the cluster's mesh CIDRs: a leader's own mesh address, and
// its members' when they have one), named <cluster>/<address>.
func tunnelTargets(peers map[string][]mesh.Peer, meshCIDRs map[string][]netip.Prefix) []probe.Target {
	var out []probe.Target
	for _, cluster := range slices.Sorted(maps.Keys(peers)) {
		n := 0
		for _, p := range peers[cluster] {
			for _, a := range p.AllowedIPs {
				if !a.Addr().Is4() || !slices.ContainsFunc(meshCIDRs[cluster], func(m netip.Prefix) bool { return m.Bits() <= a.Bits() && m.Contains(a.Addr()) }) {
					continue
				}
				for ip := a.Masked().Addr(); n < tunnelTargetsPerCluster && a.Contains(ip); ip = ip.Next() {
					if a.Bits() < 31 && (ip == a.Masked().Addr()) {
						continue // a network address answers nothing
					}
					out = append(out, probe.Target{Name: cluster + "/" + ip.String(), Addr: netip.AddrPortFrom(ip, 0)})
					n++
				}
			}
		}
	}
	return out
}

// clusterReport turns the tunnel prober's results (targets named
// <cluster>/<address>) into the linked clusters that answer and those that
// stopped: a cluster is up when any of its targets is up, down when none is
// up and one is down (it answered before), unknown otherwise.
func clusterReport(results map[string]probe.State) (up, down []string) {
	state := map[string]probe.State{}
	for name, s := range results {
		c, _, ok := strings.Cut(name, "/")
		if !ok {
			continue
		}
		if s == probe.Up || state[c] == probe.Unknown {
			state[c] = s
		}
	}
	return probe.Split(state)
}

// probeReport turns the probers' results into the report published on the
// heartbeat Lease; tunnel may be nil.
func probeReport(p, tunnel *probe.Prober) func() liveness.Report {
	return func() liveness.Report {
		var r liveness.Report
		if p != nil {
			r.Up, r.Down = probe.Split(p.Results())
		}
		if tunnel != nil {
			r.ClustersUp, r.ClustersDown = clusterReport(tunnel.Results())
		}
		return r
	}
}

// forwardingHealth answers whether this node can forward at all (IPv4
// forwarding on), for the probe replies: a node that answers but cannot
// forward must not lead. It reads /proc at most once a second; a read
// error counts as healthy (nothing known against it).
type forwardingHealth struct {
	mu      sync.Mutex
	checked time.Time
	ok      bool
}

func (f *forwardingHealth) Healthy() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := time.Now(); now.Sub(f.checked) >= time.Second {
		f.checked = now
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		f.ok = err != nil || strings.TrimSpace(string(b)) != "0"
	}
	return f.ok
}

// setupFailover creates the prober (unless --probe-port is 0); its policy
// rule goes just before meshd's (rulePriority).
func (d *daemon) setupFailover(rulePriority int) error {
	if d.cfg.ProbePort == 0 {
		return nil
	}
	health := &forwardingHealth{}
	p, err := probe.New(probe.Options{
		Port: d.cfg.ProbePort,
		// Probes skip meshd's table: they test the underlay path.
		Mark: probe.DefaultMark, RulePriority: rulePriority - 1,
		Healthy:  health.Healthy,
		OnChange: d.poke,
		Logger:   d.log,
	})
	if err != nil {
		return fmt.Errorf("--probe-port: %w", err)
	}
	d.prober = p
	t, err := probe.New(probe.Options{
		Port: d.cfg.ProbePort, ICMP: true, DownAfter: tunnelDownAfter, UpAfter: 1,
		OnChange: d.poke,
		Logger:   d.log.With("probes", "tunnel"),
	})
	if err != nil {
		return fmt.Errorf("tunnel probes: %w", err)
	}
	d.tunnel = t
	d.reg.MustRegister(tunnelCollector{t.Results})
	return nil
}

// tunnelCollector exposes the tunnel probes as
// meshd_linked_cluster_tunnel_up{cluster}: 1 while an address of the linked
// cluster answers through the tunnel, 0 once none answers and one stopped
// (what the node publishes in meshd.io/clusters-down), no series while
// unknown (nothing answered yet, or this node probes no tunnel: it leads
// no location).
type tunnelCollector struct{ results func() map[string]probe.State }

var descTunnelUp = prometheus.NewDesc("meshd_linked_cluster_tunnel_up",
	"Whether a linked cluster answers ICMP probes through the WireGuard tunnel from this node (1), or stopped answering (0); absent while unknown.",
	[]string{"cluster"}, nil)

func (c tunnelCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descTunnelUp }

func (c tunnelCollector) Collect(ch chan<- prometheus.Metric) {
	up, down := clusterReport(c.results())
	for v, clusters := range [][]string{down, up} {
		for _, name := range clusters {
			ch <- prometheus.MustNewConstMetric(descTunnelUp, prometheus.GaugeValue, float64(v), name)
		}
	}
}

// runTunnelProbes runs the tunnel prober. Without its ICMP socket (no
// CAP_NET_RAW) only this signal is lost: the tunnels stay unknown and the
// mirrors follow the source APIs alone.
func (d *daemon) runTunnelProbes(ctx context.Context) error {
	if err := d.tunnel.Run(ctx); err != nil {
		d.log.Warn("tunnel probes off: the linked clusters' tunnels are not reported", "error", err)
		<-ctx.Done()
	}
	return nil
}

// runHeartbeat keeps this node's Lease renewed every --lease-duration/4 and
// publishes the probe results on it when they change. A failed renewal
// freezes the Lease-based liveness decisions (the API server is unreachable:
// losing sight of everyone is not everyone dying).
func (d *daemon) runHeartbeat(ctx context.Context) error {
	o := liveness.HeartbeatOptions{
		Namespace: d.cfg.LeaseNamespace, Node: d.cfg.Hostname, Interval: d.cfg.LeaseDuration / 4, Logger: d.log,
		Result: func(err error) {
			if d.rec.liveness.SetAPIReachable(err == nil) {
				if err != nil {
					d.log.Warn("API server unreachable: Lease-based liveness decisions frozen", "error", err)
				} else {
					d.log.Info("API server reachable again: Lease-based liveness decisions resume")
				}
			}
		},
	}
	o.Trigger, o.Candidate = d.republish, d.rec.candidacy.get
	if d.prober != nil {
		o.Report = probeReport(d.prober, d.tunnel)
	}
	return liveness.RunHeartbeatWith(ctx, d.kube.Kube, o)
}

// nextLivenessCheck is how long until the liveness decisions may change by
// the clock alone: at most a second (a safety net), less when due sooner.
func (d *daemon) nextLivenessCheck() time.Duration {
	wait := time.Second
	if t, ok := d.rec.liveness.NextChange(); ok {
		wait = min(wait, max(time.Until(t)+time.Millisecond, time.Millisecond))
	}
	return wait
}

// livenessChanged: a local liveness decision changed, or the liveness
// freeze starts or ends (a linked cluster's decisions are the link
// controller's: they arrive as ClusterLink updates).
func (d *daemon) livenessChanged() bool {
	changed := d.rec.liveness.Changed()
	return d.rec.freeze != nil && d.rec.freeze.due(time.Now()) || changed
}
