package route

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// deviceNames maps the link indexes of the devices meshd's desired routes
// name to those names, so Current can say "dev meshd0", not "ifindex 7".
func (m *Manager) deviceNames() map[int]string {
	names := map[int]string{}
	seen := map[string]bool{}
	for _, d := range m.routes {
		if d.Device == "" || seen[d.Device] {
			continue
		}
		seen[d.Device] = true
		if idx, err := m.k.LinkIndex(d.Device); err == nil {
			names[idx] = d.Device
		}
	}
	return names
}

// Current reads meshd's routes (those of its tables with its protocol) and
// its rules from the kernel now, each rendered like `ip route` / `ip rule`,
// sorted. It is for diagnostics (meshd's debug endpoint) and changes
// nothing; the reconcile never calls it.
func (m *Manager) Current() (routes, rules []string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := m.deviceNames()
	for _, t := range slices.Sorted(maps.Keys(m.tables)) {
		rs, err := m.k.ListRoutes(t, m.opts.Protocol)
		if err != nil {
			return nil, nil, fmt.Errorf("listing routes of table %d: %w", t, err)
		}
		for _, r := range rs {
			s := r.String()
			if name, ok := names[r.LinkIndex]; ok && r.LinkIndex != 0 {
				s = strings.Replace(s, fmt.Sprintf(" ifindex %d", r.LinkIndex), " dev "+name, 1)
			}
			routes = append(routes, s)
		}
	}
	rl, err := m.k.ListRules()
	if err != nil {
		return nil, nil, fmt.Errorf("listing rules: %w", err)
	}
	for _, r := range rl {
		if m.ownsRule(r) {
			rules = append(rules, r.String())
		}
	}
	slices.Sort(routes)
	slices.Sort(rules)
	return routes, rules, nil
}
