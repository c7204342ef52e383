package mesh

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Errors returned by NewTopology and Build; match them with errors.Is.
var (
	// ErrInvalidOptions wraps every problem with Options.
	ErrInvalidOptions = errors.New("invalid mesh options")
	// ErrLocalNodeNotFound means Local.NodeName is not among the nodes.
	ErrLocalNodeNotFound = errors.New("local node not found")
)

// normalized is Options after defaults and validation, with the mesh CIDRs
// split by family.
type normalized struct {
	Options
	mesh [2]netip.Prefix // zero when the family has no mesh CIDR
	svc  []netip.Prefix
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.Granularity == "" {
		o.Granularity = GranularityLocation
	}
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Interface == "" {
		o.Interface = DefaultInterface
	}
	if o.RouteTable == 0 {
		o.RouteTable = DefaultRouteTable
	}
	if o.RulePriority == 0 {
		o.RulePriority = DefaultRulePriority
	}
	return o
}

// normalize applies defaults and checks that the options are usable.
func normalize(o Options) (normalized, error) {
	o = o.WithDefaults()
	n := normalized{Options: o}
	bad := func(format string, args ...any) (normalized, error) {
		return normalized{}, fmt.Errorf("%w: %s", ErrInvalidOptions, fmt.Sprintf(format, args...))
	}
	switch o.Granularity {
	case GranularityLocation, GranularityFull:
	default:
		return bad("unknown granularity %q", o.Granularity)
	}
	if o.Port < 1 || o.Port > 65535 {
		return bad("port %d out of range", o.Port)
	}
	if len(o.Interface) > 15 {
		return bad("interface name %q longer than 15 characters", o.Interface)
	}
	if o.RouteTable < 0 || (o.RouteTable >= 253 && o.RouteTable <= 255) {
		return bad("route table %d is reserved", o.RouteTable)
	}
	if o.RulePriority < 0 {
		return bad("negative rule priority %d", o.RulePriority)
	}
	for _, c := range o.MeshCIDRs {
		p, ok := normPrefix(c)
		if !ok {
			return bad("invalid mesh CIDR %v", c)
		}
		f := family(p.Addr())
		if n.mesh[f].IsValid() {
			return bad("more than one mesh CIDR of the same family: %v and %v", n.mesh[f], p)
		}
		if p.Addr().BitLen()-p.Bits() < 2 {
			return bad("mesh CIDR %v has no host addresses", p)
		}
		n.mesh[f] = p
	}
	if !n.mesh[v4].IsValid() && !n.mesh[v6].IsValid() {
		return bad("no mesh CIDR")
	}
	n.MeshCIDRs = make([]netip.Prefix, 0, 2)
	for _, p := range n.mesh {
		if p.IsValid() {
			n.MeshCIDRs = append(n.MeshCIDRs, p)
		}
	}
	for _, c := range o.ServiceCIDRs {
		if p, ok := normPrefix(c); ok {
			n.svc = append(n.svc, p)
		}
	}
	n.svc = mergePrefixes(n.svc)
	n.ServiceCIDRs = n.svc
	return n, nil
}

// ParseGranularity parses a granularity name.
func ParseGranularity(s string) (Granularity, error) {
	switch g := Granularity(s); g {
	case GranularityLocation, GranularityFull:
		return g, nil
	}
	return "", fmt.Errorf("%q: want %s or %s", s, GranularityLocation, GranularityFull)
}

// ParseMeshCIDRs parses mesh CIDRs as given on a command line: at least one,
// at most one IPv4 and one IPv6, returned masked.
func ParseMeshCIDRs(ss []string) ([]netip.Prefix, error) {
	var errs []error
	var out []netip.Prefix
	var fams [2]int
	for _, s := range ss {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			errs = append(errs, fmt.Errorf("%q: %w", s, err))
			continue
		}
		fams[family(p.Addr())]++
		out = append(out, p.Masked())
	}
	if fams[v4] > 1 || fams[v6] > 1 {
		errs = append(errs, fmt.Errorf("at most one IPv4 and one IPv6 CIDR, got %v", ss))
	}
	if len(ss) == 0 {
		errs = append(errs, errors.New("at least one CIDR is required"))
	}
	return out, errors.Join(errs...)
}
