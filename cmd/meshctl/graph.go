package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// lookPath is exec.LookPath (replaced in tests).
var lookPath = exec.LookPath

// runDot renders dot source as SVG with Graphviz.
func runDot(ctx context.Context, src string, w io.Writer) error {
	path, err := lookPath("dot")
	if err != nil {
		return fmt.Errorf("-o svg needs Graphviz's dot in PATH: %w", err)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "-Tsvg")
	cmd.Stdin = strings.NewReader(src)
	cmd.Stdout = w
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("running %s -Tsvg: %w: %s", path, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// dotQuote quotes a Graphviz ID or label; "\n" in s stays a line break.
func dotQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

// renderGraph draws the topology in Graphviz dot.
func renderGraph(m *model) string {
	t := m.Topo
	var b strings.Builder
	b.WriteString("digraph meshd {\n")
	fmt.Fprintf(&b, "  graph [label=%s, labelloc=t, fontname=\"sans-serif\", compound=true, rankdir=LR];\n",
		dotQuote(fmt.Sprintf("meshd mesh of %s (granularity %s)", m.Server, t.Options.Granularity)))
	b.WriteString("  node [shape=box, fontname=\"sans-serif\", fontsize=10];\n")
	b.WriteString("  edge [fontname=\"sans-serif\", fontsize=9];\n")
	nodeID := func(n string) string { return dotQuote("node/" + n) }
	peerID := func(n string) string { return dotQuote("peer/" + n) }
	for s, seg := range t.Segments {
		fmt.Fprintf(&b, "\n  subgraph %s {\n", dotQuote(fmt.Sprintf("cluster_%d", s)))
		fmt.Fprintf(&b, "    label=%s;\n", dotQuote("location "+seg.Location))
		b.WriteString("    style=rounded;\n")
		for _, n := range seg.Nodes {
			lines := []string{n}
			attrs := ""
			if n == seg.Leader {
				lines = append(lines, "leader")
				if e := endpointString(seg.Endpoint); e != "" {
					lines = append(lines, e)
				}
				attrs = ", style=bold"
			}
			if ips := t.MeshIPs[n]; len(ips) > 0 {
				lines = append(lines, joinAddrs(ips))
			}
			if m.Live != nil && !m.Live[n] {
				lines = append(lines, "not live")
				attrs += ", color=gray"
			}
			fmt.Fprintf(&b, "    %s [label=%s%s];\n", nodeID(n), dotQuote(strings.Join(lines, "\n")), attrs)
		}
		b.WriteString("  }\n")
	}
	// Nodes without a key are not WireGuard members.
	var outside []string
	for _, n := range m.nodeNames() {
		if m.segmentOf(n) < 0 {
			outside = append(outside, n)
		}
	}
	if len(outside) > 0 {
		b.WriteString("\n")
		for _, n := range outside {
			fmt.Fprintf(&b, "  %s [label=%s, style=dotted];\n", nodeID(n), dotQuote(n+"\nno public key: not in the mesh"))
		}
	}
	if len(t.Peers) > 0 {
		b.WriteString("\n")
	}
	for _, p := range t.Peers {
		lines := []string{"peer " + p.Name}
		if e := endpointString(p.Endpoint); e != "" {
			lines = append(lines, e)
		}
		fmt.Fprintf(&b, "  %s [label=%s, shape=ellipse];\n", peerID(p.Name), dotQuote(strings.Join(lines, "\n")))
	}
	b.WriteString("\n")
	// Underlay: members to their leader.
	for _, seg := range t.Segments {
		for _, n := range seg.Nodes {
			if n != seg.Leader {
				fmt.Fprintf(&b, "  %s -> %s [style=dashed, arrowhead=none];\n", nodeID(n), nodeID(seg.Leader))
			}
		}
	}
	// WireGuard links, labelled with what the tail routes to the head.
	var zero wgtypes.Key
	for _, a := range t.Segments {
		if a.PublicKey == zero {
			continue
		}
		for _, z := range t.Segments {
			if z.Leader == a.Leader || z.PublicKey == zero {
				continue
			}
			fmt.Fprintf(&b, "  %s -> %s [label=%s];\n", nodeID(a.Leader), nodeID(z.Leader), dotQuote(joinPrefixes(z.AllowedIPs, "\n")))
		}
		for _, p := range t.Peers {
			fmt.Fprintf(&b, "  %s -> %s [label=%s];\n", nodeID(a.Leader), peerID(p.Name), dotQuote(joinPrefixes(p.AllowedIPs, "\n")))
		}
	}
	for _, p := range t.Peers {
		for _, z := range t.Segments {
			if z.PublicKey == zero {
				continue
			}
			fmt.Fprintf(&b, "  %s -> %s [label=%s, style=dotted];\n", peerID(p.Name), nodeID(z.Leader), dotQuote(joinPrefixes(z.AllowedIPs, "\n")))
		}
	}
	b.WriteString("}\n")
	return b.String()
}

// recentHandshake is what status shows for a link whose leader publishes
// the remote's endpoint in meshd.io/discovered-endpoints: a handshake
// within DiscoveredFresh, kept published for DiscoveredLinger after the last
// one (see convert.DiscoveredEndpoints). Exact handshake times are local to
// each node (metrics, wg show): meshd does not write them to the API.
var recentHandshake = fmt.Sprintf("<%dm", int((convert.DiscoveredFresh + convert.DiscoveredLinger).Minutes()))

// link is one WireGuard link as one leader configures it.
type link struct {
	From, To  string
	Key       wgtypes.Key
	Handshake string
}

// unknownHandshake is what status shows for a link the leader may have
// left out of its discovered endpoints: it lists convert.DiscoveredLimit
// peers that do not need theirs already (convert.LimitDiscovered).
const unknownHandshake = "?"

// links lists every leader's WireGuard peers with what the API tells of
// their latest handshake: recentHandshake when the leader lists the peer in
// its discovered endpoints, unknownHandshake when the leader's list is full
// and the peer's endpoint is not one it must list, else "-".
func (m *model) links() (ls []link, problems []string) {
	var zero wgtypes.Key
	t := m.Topo
	needed := mesh.DiscoveryKeys(m.Input.Nodes)
	for _, a := range t.Segments {
		if a.PublicKey == zero {
			continue
		}
		n, _ := m.node(a.Leader)
		others := 0
		for k := range n.DiscoveredEndpoints {
			if !needed[k] {
				others++
			}
		}
		age := func(k wgtypes.Key) string {
			if _, ok := n.DiscoveredEndpoints[k]; ok {
				return recentHandshake
			}
			if others >= convert.DiscoveredLimit && !needed[k] {
				return unknownHandshake
			}
			return "-"
		}
		for _, z := range t.Segments {
			if z.Leader == a.Leader || z.PublicKey == zero {
				continue
			}
			to := z.Leader
			if z.Location != z.Leader {
				to += " (location " + z.Location + ")"
			}
			ls = append(ls, link{From: a.Leader, To: to, Key: z.PublicKey, Handshake: age(z.PublicKey)})
		}
		for _, p := range t.Peers {
			ls = append(ls, link{From: a.Leader, To: "peer " + p.Name, Key: p.PublicKey, Handshake: age(p.PublicKey)})
		}
		for _, lc := range m.Linked {
			for _, p := range lc.Peers {
				ls = append(ls, link{From: a.Leader, To: "cluster " + lc.Settings.Name + ": " + p.Name, Key: p.PublicKey, Handshake: age(p.PublicKey)})
			}
		}
	}
	return ls, problems
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sortedKeys[V any](mp map[string]V) []string {
	out := make([]string, 0, len(mp))
	for k := range mp {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// tokenExpiry shows when a link token expires, relative to now.
func tokenExpiry(t, now time.Time) string {
	switch {
	case t.IsZero():
		return "-"
	case !t.After(now):
		return t.UTC().Format(time.RFC3339) + " (EXPIRED: meshctl link --refresh)"
	default:
		return fmt.Sprintf("%s (in %dd)", t.UTC().Format(time.RFC3339), int(t.Sub(now).Hours()/24))
	}
}
