package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/nodestate"
)

// diagnoseReport is meshctl diagnose's report (-o json|yaml).
type diagnoseReport struct {
	Node string `json:"node"`
	// Cluster view: what meshctl computes from the API for the node.
	Location string `json:"location"`
	Leader   string `json:"leader"`
	Live     *bool  `json:"live,omitempty"`
	// LeaseRenewed is when its heartbeat Lease was last renewed (nil: no
	// Lease or unreadable); ProbeUp/ProbeDown its published probe report.
	LeaseRenewed *time.Time `json:"leaseRenewed,omitempty"`
	ProbeUp      []string   `json:"probeUp"`
	ProbeDown    []string   `json:"probeDown"`
	// State is what meshd on the node reports (nil: unreachable, see
	// StateError).
	State      *nodestate.State `json:"state,omitempty"`
	StateError string           `json:"stateError,omitempty"`
	Events     []diagnoseEvent  `json:"events"`
	EventsNote string           `json:"eventsNote,omitempty"`
	// Metrics are meshd's own series (meshd_*) from its /metrics.
	Metrics      []string `json:"metrics"`
	MetricsError string   `json:"metricsError,omitempty"`
}

type diagnoseEvent struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Count   int32     `json:"count,omitempty"`
}

// maxEvents is how many recent Events diagnose shows.
const maxEvents = 20

func newDiagnoseCommand(e *env) *cobra.Command {
	var (
		output string
		port   int
	)
	c := &cobra.Command{
		Use:   "diagnose NODE",
		Short: "One report on a node: its plan, wg show, routes, rules, chains, recent Events and metrics",
		Long: `diagnose collects in one report what is needed to tell why a node does not
work: what meshctl computes for it from the API (location, leader, liveness,
its Lease's probe report), what meshd on the node reports now (its plan,
the WireGuard device as wg show lists it, meshd's routes, rules and
iptables chains as read from the kernel, the probe results, the last
reconcile's errors), the node's recent Events and meshd's metrics.

meshd's part is read through the API server's node proxy from meshd's
--listen address (the manifests: the node's own address, port 9477): it
needs RBAC "get nodes/proxy". Nothing secret is shown: no private or
preshared key is ever sent by meshd.

Output formats (-o): text (default), json, yaml.`,
		Example: `  meshctl diagnose node-1
  meshctl diagnose node-1 -o json | jq '.state.wireguard.peers'`,
		Args:              exactArgs("NODE"),
		ValidArgsFunction: e.completeNodes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "text", "json", "yaml"); err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			r, err := e.diagnose(ctx, args[0], port)
			if err != nil {
				return err
			}
			if output == "text" {
				_, err = io.WriteString(e.stdout, renderDiagnose(r, e.now()))
			} else {
				err = writeStructured(e.stdout, r, output)
			}
			if err != nil {
				return err
			}
			if r.State == nil {
				return fmt.Errorf("meshd on node %s could not be read: %s", r.Node, r.StateError)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	c.Flags().IntVar(&port, "meshd-port", 0, "port of meshd's --listen on the node (default: what the node publishes, else 9477)")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"text", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

// diagnose collects the report on node.
func (e *env) diagnose(ctx context.Context, node string, port int) (*diagnoseReport, error) {
	m, err := e.load(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := m.Objs[node]; !ok {
		return nil, unknown("node", node, m.nodeNames())
	}
	ctx, cancel := context.WithTimeout(ctx, e.s.timeout)
	defer cancel()
	c, err := e.newClients(e.s.kubeconfig, e.s.context)
	if err != nil {
		return nil, err
	}
	r := &diagnoseReport{Node: node, ProbeUp: []string{}, ProbeDown: []string{}, Events: []diagnoseEvent{}, Metrics: []string{}}
	r.Location, r.Leader = m.locationAndLeader(node)
	if m.Live != nil && m.Leases[node] {
		live := m.Live[node]
		r.Live = &live
	}
	ll, err := c.Kube.CoordinationV1().Leases(m.Set.leaseNamespace).Get(ctx, liveness.LeaseName(node), metav1.GetOptions{})
	if err == nil {
		if ll.Spec.RenewTime != nil {
			t := ll.Spec.RenewTime.UTC()
			r.LeaseRenewed = &t
		}
		rep := liveness.ReportFromLease(ll)
		r.ProbeUp, r.ProbeDown = append(r.ProbeUp, rep.Up...), append(r.ProbeDown, rep.Down...)
	}
	if s, err := e.fetchState(ctx, c, m, node, port); err != nil {
		r.StateError = err.Error()
	} else {
		r.State = s
	}
	r.Events, r.EventsNote = nodeEvents(ctx, c, node)
	if p, err := meshdPort(m, node, port); err != nil {
		r.MetricsError = err.Error()
	} else if body, err := e.getter()(ctx, c, node, p, "/metrics", nil); err != nil {
		r.MetricsError = err.Error()
	} else {
		r.Metrics = meshdMetrics(string(body))
	}
	return r, nil
}

// locationAndLeader returns node's location and its leader, as computed.
func (m *model) locationAndLeader(node string) (string, string) {
	if s := m.segmentOf(node); s >= 0 {
		return m.Topo.Segments[s].Location, m.Topo.Segments[s].Leader
	}
	n, _ := m.node(node)
	return n.Location, ""
}

// nodeEvents lists the node's most recent Events (any namespace).
func nodeEvents(ctx context.Context, c *connect.Clients, node string) ([]diagnoseEvent, string) {
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node}.AsSelector().String()
	el, err := c.Kube.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return []diagnoseEvent{}, "Events not shown: " + shortError(err)
	}
	out := []diagnoseEvent{}
	for _, ev := range el.Items {
		out = append(out, diagnoseEvent{Time: eventTime(ev).UTC(), Type: ev.Type, Reason: ev.Reason, Message: ev.Message, Count: ev.Count})
	}
	slices.SortStableFunc(out, func(a, b diagnoseEvent) int { return a.Time.Compare(b.Time) })
	if len(out) > maxEvents {
		out = out[len(out)-maxEvents:]
	}
	return out, ""
}

func eventTime(ev corev1.Event) time.Time {
	switch {
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	}
	return ev.CreationTimestamp.Time
}

// meshdMetrics keeps meshd's own samples (meshd_*) of a /metrics text.
func meshdMetrics(text string) []string {
	out := []string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "meshd_") {
			out = append(out, l)
		}
	}
	return out
}

// renderDiagnose renders the text report.
func renderDiagnose(r *diagnoseReport, now time.Time) string {
	var b strings.Builder
	section := func(title string) { fmt.Fprintf(&b, "\n%s\n", title) }
	lines := func(ls []string) {
		if len(ls) == 0 {
			b.WriteString("(none)\n")
		}
		for _, l := range ls {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	ago := func(t time.Time) string { return fmt.Sprintf("%s ago", now.Sub(t).Round(time.Second)) }

	fmt.Fprintf(&b, "Node %s: location %s, leader %s", r.Node, orDash(r.Location), orDash(r.Leader))
	switch {
	case r.Live == nil:
		b.WriteString(", liveness unknown")
	case *r.Live:
		b.WriteString(", live")
	default:
		b.WriteString(", NOT live")
	}
	b.WriteString("\n")
	if r.LeaseRenewed != nil {
		fmt.Fprintf(&b, "Lease renewed %s; probe report: up %s, down %s\n", ago(*r.LeaseRenewed), orDash(strings.Join(r.ProbeUp, ",")), orDash(strings.Join(r.ProbeDown, ",")))
	} else {
		b.WriteString("Lease: none (or not readable)\n")
	}

	section("MESHD")
	if s := r.State; s == nil {
		fmt.Fprintf(&b, "  not reachable: %s\n", r.StateError)
	} else {
		fmt.Fprintf(&b, "  version %s, ready %v (%s)\n", s.Version, s.Ready, s.Readiness)
		if !s.LastReconcile.IsZero() {
			fmt.Fprintf(&b, "  last reconcile %s", ago(s.LastReconcile))
			if len(s.Errors) == 0 {
				b.WriteString(", no errors\n")
			} else {
				fmt.Fprintf(&b, ", errors:\n")
				for _, e := range s.Errors {
					fmt.Fprintf(&b, "    %s\n", e)
				}
			}
		}
		if s.Settings != "" {
			fmt.Fprintf(&b, "  settings %s\n", s.Settings)
		}
		renderDiagnoseState(&b, s, section, lines, ago)
	}

	section("EVENTS")
	if r.EventsNote != "" {
		fmt.Fprintf(&b, "  %s\n", r.EventsNote)
	} else {
		var ls []string
		for _, ev := range r.Events {
			ls = append(ls, fmt.Sprintf("%s  %-7s %s: %s", ago(ev.Time), ev.Type, ev.Reason, ev.Message))
		}
		lines(ls)
	}
	section("METRICS (meshd_*)")
	if r.MetricsError != "" {
		fmt.Fprintf(&b, "  not read: %s\n", r.MetricsError)
	} else {
		lines(r.Metrics)
	}
	return b.String()
}

func renderDiagnoseState(b *strings.Builder, s *nodestate.State, section func(string), lines func([]string), ago func(time.Time) string) {
	section("PLAN")
	if p := s.Plan; p == nil {
		b.WriteString("  (no plan yet)\n")
	} else {
		var leaders []string
		for _, loc := range sortedKeys(p.Leaders) {
			leaders = append(leaders, loc+"="+p.Leaders[loc])
		}
		fmt.Fprintf(b, "  location %s, leader of it: %v; leaders %s\n", orDash(p.Location), p.Leader, orDash(strings.Join(leaders, " ")))
		fmt.Fprintf(b, "  interface addresses %s, listen port %d\n", orDash(strings.Join(p.Addresses, ",")), p.ListenPort)
		for _, pp := range p.Peers {
			psk := ""
			if pp.PresharedKey {
				psk = ", preshared key (not shown)"
			}
			fmt.Fprintf(b, "  peer %s %s endpoint %s keepalive %ds%s\n    allowed ips %s\n", pp.Name, pp.PublicKey, orDash(pp.Endpoint), pp.PersistentKeepalive, psk, strings.Join(pp.AllowedIPs, ","))
		}
		for _, w := range p.Warnings {
			fmt.Fprintf(b, "  warning: %s\n", w)
		}
	}
	section(fmt.Sprintf("WIREGUARD (wg show %s, %s)", s.WireGuard.Interface, s.WireGuard.Kind))
	if s.WireGuard.Error != "" {
		fmt.Fprintf(b, "  error: %s\n", s.WireGuard.Error)
	}
	fmt.Fprintf(b, "  public key %s\n", s.WireGuard.PublicKey)
	for _, p := range s.WireGuard.Peers {
		hs := "never"
		if p.LastHandshake != nil {
			hs = ago(*p.LastHandshake)
		}
		fmt.Fprintf(b, "  peer %s (%s): endpoint %s, latest handshake %s, transfer %d B received, %d B sent\n",
			p.PublicKey, orDash(p.Name), orDash(p.Endpoint), hs, p.ReceiveBytes, p.TransmitBytes)
	}
	section("ROUTES (meshd's, in the kernel)")
	lines(s.Kernel.Routes)
	section("RULES (meshd's, in the kernel)")
	lines(s.Kernel.Rules)
	section("IPTABLES (meshd's chains and jumps, in the kernel)")
	lines(s.Kernel.IPTables)
	for _, e := range s.Kernel.Errors {
		fmt.Fprintf(b, "  error reading the kernel: %s\n", e)
	}
	section(fmt.Sprintf("PROBES (UDP port %d, underlay)", s.Probes.Port))
	var ps []string
	for _, t := range sortedKeys(s.Probes.Targets) {
		ps = append(ps, t+" "+s.Probes.Targets[t])
	}
	lines(ps)
}
