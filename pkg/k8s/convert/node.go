package convert

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"meshd.io/meshd/pkg/mesh"
)

// ParseOptions configure NodeFromObject.
type ParseOptions struct {
	// TopologyLabel is the node label giving the location when the
	// meshd.io/location annotation is absent (default
	// DefaultTopologyLabel).
	TopologyLabel string
	// Port is the WireGuard port used when an endpoint carries none
	// (default mesh.DefaultPort).
	Port int
}

func (o ParseOptions) port() uint16 {
	if o.Port <= 0 || o.Port > 65535 {
		return mesh.DefaultPort
	}
	return uint16(o.Port)
}

// NodeFromObject converts a Node into the planner's view of it. It never
// panics: a nil node gives an empty mesh.Node and an error, and every
// malformed annotation gives an *AnnotationError naming it and its value
// while that annotation alone is ignored (the rest of the node is used).
//
// Precedence:
//   - Location: meshd.io/location, else the TopologyLabel label.
//   - InternalIPs (one per family, IPv4 first): meshd.io/force-internal-ip,
//     else status addresses of type InternalIP, else the published
//     meshd.io/internal-ip.
//   - Endpoint: meshd.io/force-endpoint (PublicEndpoint), else the first
//     ExternalIP (PublicEndpoint) with the published endpoint's port or
//     o.Port, else the published meshd.io/endpoint, else the first internal
//     IP (IPv4 preferred) with o.Port.
//
// A DNS name endpoint is returned as Endpoint{Host: name, Addr:
// netip.AddrPortFrom(netip.Addr{}, port)}: Addr is not valid, but Addr.Port()
// carries the port for whoever resolves Host.
func NodeFromObject(n *corev1.Node, o ParseOptions) (mesh.Node, []error) {
	if n == nil {
		return mesh.Node{}, []error{errors.New("converting node: nil Node")}
	}
	p := nodeParse{node: mesh.Node{Name: n.Name}, port: o.port()}
	errs := p.annotations(n.Annotations)
	if err := p.podCIDRs(n); err != nil {
		errs = append(errs, err)
	}
	p.resolveLocation(n, o.TopologyLabel)
	p.resolveInternalIPs(n)
	p.resolveEndpoint(n)
	return p.node, errs
}

// nodeParse is a Node being converted: the annotations' parsers fill node
// and the inputs the resolve steps then combine with the Node's status.
type nodeParse struct {
	node      mesh.Node
	port      uint16         // default WireGuard port (ParseOptions.Port)
	forcedIPs []netip.Addr   // meshd.io/force-internal-ip
	ownIPs    []netip.Addr   // published meshd.io/internal-ip
	published netip.AddrPort // published meshd.io/endpoint
	forced    bool           // meshd.io/force-endpoint set node.Endpoint
}

// nodeAnnotations are the annotations NodeFromObject reads, each with the
// parser that stores its value. A parser returns the error the user sees
// (wrapped in an *AnnotationError); its annotation alone is then ignored.
// Adding an annotation is one row here (and its constant in annotations.go).
var nodeAnnotations = []struct {
	name  string
	parse func(p *nodeParse, v string) error
}{
	{AnnotationLocation, parseLocationAnnotation},
	{AnnotationLeader, parseLeaderAnnotation},
	{AnnotationPublicKey, parseKeyAnnotation},
	{AnnotationForceInternalIP, func(p *nodeParse, v string) (err error) {
		p.forcedIPs, err = parseAddrList(v, true)
		return err
	}},
	{AnnotationInternalIP, func(p *nodeParse, v string) (err error) {
		p.ownIPs, err = parseAddrList(v, false)
		return err
	}},
	{AnnotationEndpoint, func(p *nodeParse, v string) (err error) {
		p.published, err = parseAddrPort(v)
		return err
	}},
	{AnnotationForceEndpoint, parseForceEndpointAnnotation},
	{AnnotationAllowedLocationIPs, func(p *nodeParse, v string) (err error) {
		p.node.AllowedLocationIPs, err = ParsePrefixes(SplitList(v))
		return err
	}},
	{AnnotationPersistentKeepalive, parseKeepaliveAnnotation},
	{AnnotationWireGuardIP, func(p *nodeParse, v string) (err error) {
		p.node.WireGuardIPs, err = parseAddrList(v, false)
		return err
	}},
	{AnnotationDiscoveredEndpoints, func(p *nodeParse, v string) (err error) {
		p.node.DiscoveredEndpoints, err = parseDiscovered(v)
		return err
	}},
}

// annotations runs the parser of every non-blank annotation of the table.
func (p *nodeParse) annotations(ann map[string]string) []error {
	var errs []error
	for _, a := range nodeAnnotations {
		v := strings.TrimSpace(ann[a.name]) // nil maps read as empty
		if v == "" {
			continue
		}
		if err := a.parse(p, v); err != nil {
			errs = append(errs, &AnnotationError{Annotation: a.name, Value: v, Err: err})
		}
	}
	return errs
}

// maxLocation is the longest location name: what a Peer's status may
// record of its leaders' locations.
const maxLocation = 253

// parseLocationAnnotation takes any name of printable characters: a
// location is written into WireGuard configurations meshctl prints (as a
// comment), Events, logs and Peer statuses, where a line break or another
// control character could forge lines.
func parseLocationAnnotation(p *nodeParse, v string) error {
	if v == "" || len(v) > maxLocation || !utf8.ValidString(v) || strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("want 1-%d printable characters (no line breaks or other control characters)", maxLocation)
	}
	p.node.Location = v
	return nil
}

func parseLeaderAnnotation(p *nodeParse, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return errors.New(`want "true" or "false"`)
	}
	p.node.PreferLeader = b
	return nil
}

func parseKeyAnnotation(p *nodeParse, v string) error {
	k, err := wgtypes.ParseKey(v)
	if err != nil {
		return errors.New("want a base64-encoded 32-byte WireGuard key")
	}
	p.node.PublicKey = k
	return nil
}

func parseForceEndpointAnnotation(p *nodeParse, v string) error {
	ep, err := ParseEndpoint(v, int(p.port))
	if err != nil {
		return err
	}
	p.node.Endpoint, p.node.PublicEndpoint, p.forced = ep, true, true
	return nil
}

func parseKeepaliveAnnotation(p *nodeParse, v string) error {
	s, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return errors.New("want whole seconds between 0 and 65535")
	}
	p.node.PersistentKeepalive = time.Duration(s) * time.Second
	return nil
}

// podCIDRs takes spec.podCIDRs, else spec.podCIDR.
func (p *nodeParse) podCIDRs(n *corev1.Node) error {
	podCIDRs, field := n.Spec.PodCIDRs, "spec.podCIDRs"
	if len(podCIDRs) == 0 && n.Spec.PodCIDR != "" {
		podCIDRs, field = []string{n.Spec.PodCIDR}, "spec.podCIDR"
	}
	if len(podCIDRs) == 0 {
		return nil
	}
	ps, err := ParsePrefixes(podCIDRs)
	if err != nil {
		return &AnnotationError{Annotation: field, Value: strings.Join(podCIDRs, ","), Err: err}
	}
	p.node.PodCIDRs = ps
	return nil
}

// resolveLocation falls back to the topology label without the annotation.
func (p *nodeParse) resolveLocation(n *corev1.Node, label string) {
	if p.node.Location != "" {
		return
	}
	if label == "" {
		label = DefaultTopologyLabel
	}
	p.node.Location = strings.TrimSpace(n.Labels[label])
}

// resolveInternalIPs: forced, else status InternalIPs, else published.
func (p *nodeParse) resolveInternalIPs(n *corev1.Node) {
	p.node.InternalIPs = p.forcedIPs
	if len(p.node.InternalIPs) == 0 {
		p.node.InternalIPs = statusAddrs(n, corev1.NodeInternalIP)
	}
	if len(p.node.InternalIPs) == 0 {
		p.node.InternalIPs = p.ownIPs
	}
}

// resolveEndpoint: forced (already set), else the first ExternalIP with the
// published port, else the published endpoint, else the first internal IP.
func (p *nodeParse) resolveEndpoint(n *corev1.Node) {
	if p.forced {
		return
	}
	port := p.port
	if p.published.IsValid() {
		port = p.published.Port()
	}
	switch ext := statusAddrs(n, corev1.NodeExternalIP); {
	case len(ext) > 0:
		p.node.Endpoint = mesh.Endpoint{Addr: netip.AddrPortFrom(firstExternal(n, ext), port)}
		p.node.PublicEndpoint = true
	case p.published.IsValid():
		p.node.Endpoint = mesh.Endpoint{Addr: p.published}
	case len(p.node.InternalIPs) > 0:
		p.node.Endpoint = mesh.Endpoint{Addr: netip.AddrPortFrom(p.node.InternalIPs[0], p.port)}
	}
}

// ParseEndpoint parses a WireGuard endpoint: "host:port", "[v6]:port", a
// bare IPv4/IPv6 address or a bare host name (then defaultPort is used). A
// literal IP gives Endpoint{Addr: ip:port}; a DNS name (which must be a
// DNS-1123 subdomain; it is lower-cased and a trailing dot dropped) gives
// Endpoint{Host: name, Addr: netip.AddrPortFrom(netip.Addr{}, port)}, whose
// Addr is invalid but whose Addr.Port() is the port.
func ParseEndpoint(s string, defaultPort int) (mesh.Endpoint, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return mesh.Endpoint{}, errors.New("empty endpoint")
	}
	host, portStr := s, ""
	switch {
	case strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]"):
		host = s[1 : len(s)-1]
	case strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "["):
		// A bare IPv6 address.
	case strings.Contains(s, ":"):
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			return mesh.Endpoint{}, fmt.Errorf("want host:port, [ipv6]:port or a host: %w", err)
		}
		host, portStr = h, p
	}
	port := defaultPort
	if portStr != "" {
		p, err := strconv.Atoi(portStr)
		if err != nil || p < 1 || p > 65535 {
			return mesh.Endpoint{}, fmt.Errorf("port %q is not between 1 and 65535", portStr)
		}
		port = p
	}
	if port < 1 || port > 65535 {
		return mesh.Endpoint{}, fmt.Errorf("port %d is not between 1 and 65535", port)
	}
	if host == "" {
		return mesh.Endpoint{}, errors.New("empty host")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return mesh.Endpoint{}, fmt.Errorf("address %q has a zone", host)
		}
		return mesh.Endpoint{Addr: netip.AddrPortFrom(a.Unmap(), uint16(port))}, nil
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(name); err == nil && a.Zone() == "" {
		// "1.2.3.4." is the address, not a DNS name.
		return mesh.Endpoint{Addr: netip.AddrPortFrom(a.Unmap(), uint16(port))}, nil
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return mesh.Endpoint{}, fmt.Errorf("host %q is neither an IP address nor a DNS name: %s", host, strings.Join(msgs, "; "))
	}
	return mesh.Endpoint{Host: name, Addr: netip.AddrPortFrom(netip.Addr{}, uint16(port))}, nil
}

// statusAddrs returns the node's status addresses of one type, at most one
// per family, IPv4 first; unparsable addresses are skipped.
func statusAddrs(n *corev1.Node, t corev1.NodeAddressType) []netip.Addr {
	var v4, v6 netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != t {
			continue
		}
		ip, err := netip.ParseAddr(strings.TrimSpace(a.Address))
		if err != nil || ip.Zone() != "" {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() && !v4.IsValid() {
			v4 = ip
		} else if ip.Is6() && !v6.IsValid() {
			v6 = ip
		}
	}
	var out []netip.Addr
	for _, ip := range []netip.Addr{v4, v6} {
		if ip.IsValid() {
			out = append(out, ip)
		}
	}
	return out
}

// firstExternal returns the first ExternalIP in status order that is among
// the parsed candidates.
func firstExternal(n *corev1.Node, candidates []netip.Addr) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(strings.TrimSpace(a.Address))
		if err == nil && slices.Contains(candidates, ip.Unmap()) {
			return ip.Unmap()
		}
	}
	return candidates[0]
}

// SplitList splits a comma separated list, dropping empty entries.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseAddrList parses a comma separated list of IPs (and, with allowCIDR,
// CIDRs whose address is taken) holding at most one address per family. The
// result is IPv4 first.
func parseAddrList(s string, allowCIDR bool) ([]netip.Addr, error) {
	var v4, v6 netip.Addr
	for _, f := range SplitList(s) {
		ip, err := netip.ParseAddr(f)
		if err != nil && allowCIDR {
			if p, perr := netip.ParsePrefix(f); perr == nil {
				ip, err = p.Addr(), nil
			}
		}
		if err != nil || ip.Zone() != "" {
			if allowCIDR {
				return nil, fmt.Errorf("%q is not an IP address or CIDR", f)
			}
			return nil, fmt.Errorf("%q is not an IP address", f)
		}
		ip = ip.Unmap()
		slot, family := &v6, 6
		if ip.Is4() {
			slot, family = &v4, 4
		}
		if slot.IsValid() {
			return nil, fmt.Errorf("more than one IPv%d address (%s and %s)", family, *slot, ip)
		}
		*slot = ip
	}
	var out []netip.Addr
	for _, ip := range []netip.Addr{v4, v6} {
		if ip.IsValid() {
			out = append(out, ip)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no addresses")
	}
	return out, nil
}

// ParsePrefixes parses CIDRs, masking host bits.
func ParsePrefixes(ss []string) ([]netip.Prefix, error) {
	if len(ss) == 0 {
		return nil, errors.New("no CIDRs")
	}
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR", s)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			if !p.IsValid() {
				return nil, fmt.Errorf("%q is not a CIDR", s)
			}
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// parseAddrPort parses "ip:port" or "[ipv6]:port".
func parseAddrPort(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("want ip:port or [ipv6]:port with a port between 1 and 65535")
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func parseDiscovered(s string) (map[wgtypes.Key]netip.AddrPort, error) {
	var raw map[string]string
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf(`want a JSON object {"<public key>": "ip:port"}: %w`, err)
	}
	if len(raw) == 0 {
		return nil, nil
	}
	out := make(map[wgtypes.Key]netip.AddrPort, len(raw))
	seen := make(map[wgtypes.Key]string, len(raw))
	// In key order: two spellings of one key (base64 ignores the last
	// character's unused bits) are an error, the same one every time.
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		v := raw[k]
		key, err := wgtypes.ParseKey(k)
		if err != nil {
			return nil, fmt.Errorf("%q is not a WireGuard public key", k)
		}
		if other, dup := seen[key]; dup {
			return nil, fmt.Errorf("%q and %q are the same public key", other, k)
		}
		seen[key] = k
		ap, err := parseAddrPort(v)
		if err != nil {
			return nil, fmt.Errorf("endpoint %q of %s: %w", v, k, err)
		}
		out[key] = ap
	}
	return out, nil
}
