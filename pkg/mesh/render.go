package mesh

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// String renders the plan as stable, human-readable text (for golden tests,
// logs and meshctl).
func (p *Plan) String() string {
	if p == nil {
		return "<nil plan>\n"
	}
	var b strings.Builder
	role := "member"
	if p.Leader {
		role = "leader"
	}
	fmt.Fprintf(&b, "location %q (%s)\n", p.Location, role)
	b.WriteString("leaders:\n")
	for _, l := range sortedKeys(p.Leaders) {
		fmt.Fprintf(&b, "  %q: %s\n", l, p.Leaders[l])
	}
	b.WriteString("mesh-ips:\n")
	for _, n := range sortedKeys(p.MeshIPs) {
		fmt.Fprintf(&b, "  %s: %s\n", n, joinAddrs(p.MeshIPs[n]))
	}
	writeWireGuard(&b, p.WireGuard)
	b.WriteString("routes:\n")
	for _, r := range p.Routes {
		fmt.Fprintf(&b, "  %s\n", r)
	}
	b.WriteString("rules:\n")
	for _, r := range p.Rules {
		fam := "ipv4"
		if r.IPv6 {
			fam = "ipv6"
		}
		fmt.Fprintf(&b, "  %s priority %d table %d\n", fam, r.Priority, r.Table)
	}
	writeFamily(&b, "iptables", p.IPTables.V4)
	writeFamily(&b, "ip6tables", p.IPTables.V6)
	if len(p.Warnings) > 0 {
		b.WriteString("warnings:\n")
		for _, w := range p.Warnings {
			fmt.Fprintf(&b, "  %s\n", w)
		}
	}
	return b.String()
}

func writeWireGuard(b *strings.Builder, w WireGuard) {
	fmt.Fprintf(b, "wireguard: port %d addresses [%s]\n", w.ListenPort, joinPrefixes(w.Addresses))
	for _, pe := range w.Peers {
		writePeer(b, pe)
	}
}

func writePeer(b *strings.Builder, pe WireGuardPeer) {
	fmt.Fprintf(b, "  peer %s (%s)\n", pe.PublicKey, pe.Name)
	if !pe.Endpoint.IsZero() {
		fmt.Fprintf(b, "    endpoint %s\n", pe.Endpoint)
	}
	if pe.PersistentKeepalive > 0 {
		fmt.Fprintf(b, "    keepalive %s\n", pe.PersistentKeepalive)
	}
	if pe.PresharedKey != nil {
		b.WriteString("    preshared-key set\n")
	}
	fmt.Fprintf(b, "    allowed-ips [%s]\n", joinPrefixes(pe.AllowedIPs))
}

// String renders the endpoint as host:port or address:port.
func (e Endpoint) String() string {
	switch {
	case e.Host != "" && e.Addr.IsValid():
		return fmt.Sprintf("%s:%d (%s)", e.Host, e.Addr.Port(), e.Addr)
	case e.Host != "" && e.Addr.Port() != 0:
		return net.JoinHostPort(e.Host, strconv.Itoa(int(e.Addr.Port())))
	case e.Host != "":
		return e.Host
	case e.Addr.IsValid():
		return e.Addr.String()
	}
	return ""
}

// String renders the route like ip-route(8).
func (r Route) String() string {
	var b strings.Builder
	b.WriteString(r.Dst.String())
	if r.Gateway.IsValid() {
		fmt.Fprintf(&b, " via %s", r.Gateway)
	}
	if r.Device != "" {
		fmt.Fprintf(&b, " dev %s", r.Device)
	}
	if r.Src.IsValid() {
		fmt.Fprintf(&b, " src %s", r.Src)
	}
	if r.Metric != 0 {
		fmt.Fprintf(&b, " metric %d", r.Metric)
	}
	fmt.Fprintf(&b, " table %d", r.Table)
	return b.String()
}

func writeFamily(b *strings.Builder, cmd string, f IPTablesFamily) {
	if len(f.Chains) == 0 && len(f.Jumps) == 0 {
		return
	}
	fmt.Fprintf(b, "%s:\n", cmd)
	for _, j := range f.Jumps {
		op := "-A"
		if j.Insert {
			op = "-I"
		}
		fmt.Fprintf(b, "  -t %s %s %s -j %s\n", j.Table, op, j.From, j.To)
	}
	for _, c := range f.Chains {
		fmt.Fprintf(b, "  -t %s -N %s\n", c.Table, c.Name)
		for _, r := range c.Rules {
			fmt.Fprintf(b, "  -t %s -A %s %s\n", c.Table, c.Name, strings.Join(r, " "))
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func joinAddrs(as []netip.Addr) string {
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = a.String()
	}
	return strings.Join(ss, " ")
}

func joinPrefixes(ps []netip.Prefix) string { return joinPrefixesSep(ps, " ") }

// String renders the configuration in wg-quick format, without the private
// key (the peer owns it).
func (c OutsideConfig) String() string {
	var b strings.Builder
	b.WriteString("[Interface]\n")
	if len(c.Addresses) > 0 {
		fmt.Fprintf(&b, "Address = %s\n", joinPrefixesSep(c.Addresses, ", "))
	}
	for _, pe := range c.Peers {
		fmt.Fprintf(&b, "\n[Peer]\n# %s\nPublicKey = %s\n", pe.Name, pe.PublicKey)
		if pe.PresharedKey != nil {
			fmt.Fprintf(&b, "PresharedKey = %s\n", *pe.PresharedKey)
		}
		if !pe.Endpoint.IsZero() {
			ep := pe.Endpoint.Addr.String()
			if pe.Endpoint.Host != "" {
				ep = fmt.Sprintf("%s:%d", pe.Endpoint.Host, pe.Endpoint.Addr.Port())
			}
			fmt.Fprintf(&b, "Endpoint = %s\n", ep)
		}
		fmt.Fprintf(&b, "AllowedIPs = %s\n", joinPrefixesSep(pe.AllowedIPs, ", "))
		if pe.PersistentKeepalive > 0 {
			fmt.Fprintf(&b, "PersistentKeepalive = %d\n", int(pe.PersistentKeepalive.Seconds()))
		}
	}
	return b.String()
}

func joinPrefixesSep(ps []netip.Prefix, sep string) string {
	ss := make([]string, len(ps))
	for i, p := range ps {
		ss[i] = p.String()
	}
	return strings.Join(ss, sep)
}
