package clusterlink

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// splitList splits a comma separated list, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parsePrefixes parses CIDRs, masking host bits; none is an error.
func parsePrefixes(ss []string) ([]netip.Prefix, error) {
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
