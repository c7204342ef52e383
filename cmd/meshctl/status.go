package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/mesh"
)

// statusReport is what meshctl status shows, in the structure of -o json
// and -o yaml; the table is rendered from it.
type statusReport struct {
	Cluster     string   `json:"cluster"`
	Granularity string   `json:"granularity"`
	MeshCIDRs   []string `json:"meshCIDRs"`
	Port        int      `json:"port"`
	// SettingsFrom says where the settings come from: "N of M nodes"
	// (published, meshd.io/settings) or "flags" (no node publishes them).
	SettingsFrom   string           `json:"settingsFrom"`
	Nodes          []statusNode     `json:"nodes"`
	Locations      []statusLocation `json:"locations"`
	Peers          []statusPeer     `json:"peers"`
	LinkedClusters []statusLinked   `json:"linkedClusters"`
	// ClusterLinks are the link controller's ClusterLinks (meshd link):
	// what the nodes peer with when the controller runs.
	ClusterLinks []statusClusterLink `json:"clusterLinks"`
	Links        []statusLink        `json:"links"`
	// Problems are what the table lists under PROBLEMS; any makes the
	// exit code 1.
	Problems []string `json:"problems"`
}

type statusNode struct {
	Name     string   `json:"name"`
	Location string   `json:"location"`
	Leader   bool     `json:"leader"`
	Endpoint string   `json:"endpoint,omitempty"`
	MeshIPs  []string `json:"meshIPs"`
	// PublicKey tells whether the node published its WireGuard key.
	PublicKey bool `json:"publicKey"`
	// Live is whether its heartbeat Lease is fresh (absent: unknown).
	Live *bool `json:"live,omitempty"`
}

type statusLocation struct {
	Location   string   `json:"location"`
	Leader     string   `json:"leader"`
	Endpoint   string   `json:"endpoint,omitempty"`
	Nodes      []string `json:"nodes"`
	AllowedIPs []string `json:"allowedIPs"`
}

type statusPeer struct {
	Name                string   `json:"name"`
	Endpoint            string   `json:"endpoint,omitempty"`
	AllowedIPs          []string `json:"allowedIPs"`
	PersistentKeepalive int      `json:"persistentKeepalive,omitempty"`
	Usable              bool     `json:"usable"`
}

type statusLinked struct {
	Name         string   `json:"name"`
	Secret       string   `json:"secret"`
	Server       string   `json:"server,omitempty"`
	ServiceCIDRs []string `json:"serviceCIDRs"`
	// Leaders are the remote location leaders this cluster peers with.
	Leaders      []string   `json:"leaders"`
	TokenExpires *time.Time `json:"tokenExpires,omitempty"`
	TokenExpired bool       `json:"tokenExpired,omitempty"`
	// Error is why the linked cluster could not be read ("" when it was).
	Error string `json:"error,omitempty"`
}

type statusClusterLink struct {
	Name      string   `json:"name"`
	Leaders   []string `json:"leaders"`
	Synced    string   `json:"synced"`
	Reachable string   `json:"reachable"`
	Message   string   `json:"message,omitempty"`
}

type statusLink struct {
	From string `json:"from"`
	To   string `json:"to"`
	// RecentHandshake: the leader lists the remote key in its discovered
	// endpoints (a handshake within the last 13 minutes).
	RecentHandshake bool `json:"recentHandshake"`
	// HandshakeUnknown: the leader does not list the remote key, but its
	// list is full (it publishes at most 64 endpoints of peers that do not
	// need them), so the API cannot tell.
	HandshakeUnknown bool `json:"handshakeUnknown,omitempty"`
}

// newStatusReport collects the status of m.
func newStatusReport(m *model) *statusReport {
	t := m.Topo
	r := &statusReport{
		Cluster:        m.Server,
		Granularity:    string(t.Options.Granularity),
		MeshCIDRs:      prefixStrings(t.Options.MeshCIDRs),
		Port:           t.Options.Port,
		Nodes:          []statusNode{},
		Locations:      []statusLocation{},
		Peers:          []statusPeer{},
		LinkedClusters: []statusLinked{},
		ClusterLinks:   []statusClusterLink{},
		Links:          []statusLink{},
		Problems:       []string{},
		SettingsFrom:   settingsFrom(m.Published),
	}
	leaders := map[string]bool{}
	for _, s := range t.Segments {
		leaders[s.Leader] = true
	}
	for _, name := range m.nodeNames() {
		n, _ := m.node(name)
		loc := n.Location
		if s := m.segmentOf(name); s >= 0 {
			loc = t.Segments[s].Location
		} else if loc == "" || t.Options.Granularity == mesh.GranularityFull {
			loc = name
		}
		sn := statusNode{Name: name, Location: loc, Leader: leaders[name], Endpoint: endpointString(n.Endpoint),
			MeshIPs: []string{}, PublicKey: n.PublicKey != (wgtypes.Key{})}
		for _, a := range t.MeshIPs[name] {
			sn.MeshIPs = append(sn.MeshIPs, a.String())
		}
		if m.Live != nil && m.Leases[name] {
			live := m.Live[name]
			sn.Live = &live
		}
		r.Nodes = append(r.Nodes, sn)
	}
	for _, s := range t.Segments {
		r.Locations = append(r.Locations, statusLocation{Location: s.Location, Leader: s.Leader, Endpoint: endpointString(s.Endpoint),
			Nodes: append([]string{}, s.Nodes...), AllowedIPs: prefixStrings(s.AllowedIPs)})
	}
	usable := map[string]mesh.Peer{}
	for _, p := range t.Peers {
		usable[p.Name] = p
	}
	for _, name := range m.peerNames() {
		p, ok := usable[name]
		sp := statusPeer{Name: name, AllowedIPs: []string{}, Usable: ok}
		if ok {
			sp.AllowedIPs = prefixStrings(p.AllowedIPs)
			sp.PersistentKeepalive = seconds(p.PersistentKeepalive)
			if !p.Endpoint.IsZero() {
				sp.Endpoint = p.Endpoint.String()
			}
		}
		r.Peers = append(r.Peers, sp)
	}
	for _, lc := range m.Linked {
		sl := statusLinked{Name: lc.Settings.Name, Secret: lc.Secret, Server: lc.Server,
			ServiceCIDRs: prefixStrings(lc.Settings.ServiceCIDRs), Leaders: []string{}}
		for _, p := range lc.Peers {
			sl.Leaders = append(sl.Leaders, p.Name)
		}
		if !lc.TokenExpires.IsZero() {
			exp := lc.TokenExpires.UTC()
			sl.TokenExpires = &exp
			sl.TokenExpired = !exp.After(m.Now)
		}
		if lc.Err != nil {
			sl.Error = lc.Err.Error()
		}
		r.LinkedClusters = append(r.LinkedClusters, sl)
	}
	var linkProblems []string
	for _, cl := range m.ClusterLinks {
		r.ClusterLinks = append(r.ClusterLinks, statusClusterLink{Name: cl.Name, Leaders: cl.Leaders,
			Synced: string(cl.Synced), Reachable: string(cl.Reachable), Message: cl.Message})
		if cl.Synced == metav1.ConditionFalse || cl.Reachable == metav1.ConditionFalse {
			linkProblems = append(linkProblems, fmt.Sprintf("cluster link %s (link controller): synced %s, reachable %s: %s", cl.Name, cl.Synced, cl.Reachable, orDash(cl.Message)))
		}
	}
	ls, problems := m.links()
	problems = append(problems, m.Published.Problems...)
	for _, l := range ls {
		r.Links = append(r.Links, statusLink{From: l.From, To: l.To, RecentHandshake: l.Handshake == recentHandshake, HandshakeUnknown: l.Handshake == unknownHandshake})
	}
	for _, lc := range m.Linked {
		problems = append(problems, lc.Problems...)
	}
	for _, k := range sortedKeys(m.Input.Problems) {
		problems = append(problems, k+": "+joinErrors(m.Input.Problems[k]))
	}
	problems = append(problems, t.Warnings...)
	for _, lc := range m.Linked {
		if lc.Err != nil {
			problems = append(problems, fmt.Sprintf("linked cluster %s (Secret %s) not readable: %v", orDash(lc.Settings.Name), lc.Secret, lc.Err))
		}
	}
	r.Problems = append(r.Problems, problems...)
	r.Problems = append(r.Problems, linkProblems...)
	return r
}

// renderStatusTable renders r as the tables of meshctl status.
func renderStatusTable(r *statusReport, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Cluster %s: granularity %s, mesh CIDRs %s, port %d (settings: %s)\n",
		r.Cluster, r.Granularity, strings.Join(r.MeshCIDRs, ", "), r.Port, r.SettingsFrom)
	table := func(title string, header string, rows [][]string) {
		fmt.Fprintf(&b, "\n%s\n", title)
		if len(rows) == 0 {
			b.WriteString("(none)\n")
			return
		}
		w := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
		fmt.Fprintln(w, header)
		for _, r := range rows {
			fmt.Fprintln(w, strings.Join(r, "\t"))
		}
		w.Flush()
	}
	list := func(ss []string) string { return orDash(strings.Join(ss, ",")) }
	var rows [][]string
	for _, n := range r.Nodes {
		live := "-"
		if n.Live != nil {
			live = yesNo(*n.Live)
		}
		rows = append(rows, []string{n.Name, n.Location, yesNo(n.Leader), orDash(n.Endpoint), list(n.MeshIPs), yesNo(n.PublicKey), live})
	}
	table("NODES", "NAME\tLOCATION\tLEADER\tENDPOINT\tMESH IPS\tKEY\tLIVE", rows)

	rows = nil
	for _, s := range r.Locations {
		rows = append(rows, []string{s.Location, s.Leader, orDash(s.Endpoint), strings.Join(s.Nodes, ","), list(s.AllowedIPs)})
	}
	table("LOCATIONS", "LOCATION\tLEADER\tENDPOINT\tNODES\tALLOWED IPS", rows)

	rows = nil
	for _, p := range r.Peers {
		if !p.Usable {
			rows = append(rows, []string{p.Name, "-", "-", "-", "no"})
			continue
		}
		ka := "-"
		if p.PersistentKeepalive > 0 {
			ka = strconv.Itoa(p.PersistentKeepalive) + "s"
		}
		rows = append(rows, []string{p.Name, orDash(p.Endpoint), list(p.AllowedIPs), ka, "yes"})
	}
	table("PEERS", "NAME\tENDPOINT\tALLOWED IPS\tKEEPALIVE\tUSABLE", rows)

	if len(r.LinkedClusters) > 0 {
		rows = nil
		for _, lc := range r.LinkedClusters {
			state := "ok"
			if lc.Error != "" {
				state = lc.Error
			}
			var exp time.Time
			if lc.TokenExpires != nil {
				exp = *lc.TokenExpires
			}
			rows = append(rows, []string{orDash(lc.Name), lc.Secret, orDash(lc.Server),
				list(lc.ServiceCIDRs), list(lc.Leaders), tokenExpiry(exp, now), state})
		}
		table("LINKED CLUSTERS", "CLUSTER\tSECRET\tSERVER\tSERVICE CIDRS\tPEERS (REMOTE LEADERS)\tTOKEN EXPIRES\tSTATE", rows)
	}

	if len(r.ClusterLinks) > 0 {
		rows = nil
		for _, cl := range r.ClusterLinks {
			rows = append(rows, []string{cl.Name, cl.Synced, cl.Reachable, list(cl.Leaders), orDash(cl.Message)})
		}
		table("CLUSTER LINKS (link controller)", "NAME\tSYNCED\tREACHABLE\tREMOTE LEADERS\tMESSAGE", rows)
	}

	rows = nil
	for _, l := range r.Links {
		hs := "-"
		switch {
		case l.RecentHandshake:
			hs = recentHandshake
		case l.HandshakeUnknown:
			hs = unknownHandshake
		}
		rows = append(rows, []string{l.From, l.To, hs})
	}
	table("WIREGUARD LINKS", "FROM\tTO\tLATEST HANDSHAKE", rows)

	if len(r.Problems) > 0 {
		b.WriteString("\nPROBLEMS\n")
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "- %s\n", p)
		}
	}
	return b.String()
}

// errProblems is returned when status lists problems (exit code 1).
type errProblems int

func (n errProblems) Error() string {
	if n == 1 {
		return "status lists 1 problem"
	}
	return fmt.Sprintf("status lists %d problems", int(n))
}

// defaultPollInterval is how often status --wait reads the cluster again.
const defaultPollInterval = 2 * time.Second

func newStatusCommand(e *env) *cobra.Command {
	var (
		output string
		wait   time.Duration
	)
	c := &cobra.Command{
		Use:   "status",
		Short: "Show nodes, locations, leaders, peers and WireGuard links",
		Long: `Shows the mesh as meshd computes it: every node (location, leader, endpoint,
mesh IPs, whether it published a WireGuard key, whether its heartbeat Lease
is fresh), every location with its leader, the outside Peers, and every
WireGuard link with whether its leader saw a handshake lately ("<13m", as the
leaders publish it; "-" when unknown: exact handshake times stay on the
node, see "meshctl diagnose NODE"). Clusters linked with "meshctl link" are
read through their link Secrets (in --lease-namespace, with your
credentials): their location leaders appear as this cluster's links. The
link controller's ClusterLinks, which the nodes peer with, are listed too
(CLUSTER LINKS: synced, reachable, leaders). Problems found in the objects
are listed last.

Output formats (-o): table (default), json, yaml; the same data.

Exit code 1 when status lists problems (or cannot read the cluster), so
scripts can tell. --wait DURATION reads the cluster again every 2s until
it lists no problems, and exits 1 with the last status if it still lists
problems when DURATION has passed.`,
		Example: `  meshctl status -o json | jq '.problems'
  meshctl status --wait 5m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json", "yaml"); err != nil {
				return err
			}
			if wait < 0 {
				return usageError{fmt.Errorf("--wait %s: must not be negative", wait)}
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			var (
				r   *statusReport
				err error
			)
			if wait > 0 {
				r, err = e.waitStatus(ctx, wait)
			} else {
				r, err = e.statusOnce(ctx)
			}
			if err != nil {
				return err
			}
			if output == "table" {
				_, err = io.WriteString(e.stdout, renderStatusTable(r, e.now()))
			} else {
				err = writeStructured(e.stdout, r, output)
			}
			if err != nil {
				return err
			}
			if len(r.Problems) > 0 {
				return errProblems(len(r.Problems))
			}
			return nil
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	c.Flags().DurationVar(&wait, "wait", 0, "read the cluster again until status lists no problems, at most this long (e.g. 5m; exit 1 on timeout)")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

// statusOnce reads the cluster and its linked clusters once.
func (e *env) statusOnce(ctx context.Context) (*statusReport, error) {
	m, err := e.load(ctx)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, e.s.timeout)
	defer cancel()
	var notes []string
	m.Linked, notes = e.linkedClusters(lctx, m)
	var clNotes []string
	m.ClusterLinks, clNotes = e.clusterLinks(lctx)
	notes = append(notes, clNotes...)
	for _, n := range notes {
		fmt.Fprintf(e.stderr, "meshctl: %s\n", n)
	}
	return newStatusReport(m), nil
}

// waitStatus reads the cluster until the status lists no problems or wait
// has passed. Every read is cut at that deadline (a read of its own would
// take up to --request-timeout, and a hung API server would keep meshctl
// past --wait). Errors reading the cluster are retried (the API server may
// be restarting), a bad invocation is not. It returns the last status; on
// timeout with problems, that status (whose problems make the exit code 1)
// — also when the deadline cut the read after it — or else the last error.
func (e *env) waitStatus(parent context.Context, wait time.Duration) (*statusReport, error) {
	interval := e.pollInterval
	if interval <= 0 {
		interval = defaultPollInterval
	}
	ctx, cancel := context.WithTimeout(parent, wait)
	defer cancel()
	var (
		last *statusReport // the last status read, with problems
		said string
	)
	for {
		r, err := e.statusOnce(ctx)
		var ue usageError
		switch {
		case errors.As(err, &ue):
			return nil, err
		case err == nil && len(r.Problems) == 0:
			return r, nil
		case err == nil:
			last = r
		}
		cut := err != nil && ctx.Err() != nil
		if !cut {
			// Say on stderr what is still wrong, once per change.
			now := fmt.Sprint(err)
			if err == nil {
				now = errProblems(len(r.Problems)).Error()
			}
			if now != said {
				fmt.Fprintf(e.stderr, "meshctl: waiting up to %s: %s\n", wait, now)
				said = now
			}
		}
		select {
		case <-ctx.Done():
			if perr := parent.Err(); perr != nil {
				return nil, perr
			}
			if err != nil && !(cut && last != nil) {
				return nil, fmt.Errorf("--wait %s: timed out: %w", wait, err)
			}
			fmt.Fprintf(e.stderr, "meshctl: --wait %s: timed out with problems left\n", wait)
			return last, nil
		case <-time.After(interval):
		}
	}
}
