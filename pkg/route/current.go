package route

import (
	"fmt"
	"maps"
	"slices"
)

// Current reads meshd's routes (those of its tables with its protocol) and
// its rules from the kernel now, each rendered like `ip route` / `ip rule`,
// sorted. It is for diagnostics (meshd's debug endpoint) and changes
// nothing; the reconcile never calls it.
func (m *Manager) Current() (routes, rules []string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range slices.Sorted(maps.Keys(m.tables)) {
		rs, err := m.k.ListRoutes(t, m.opts.Protocol)
		if err != nil {
			return nil, nil, fmt.Errorf("listing routes of table %d: %w", t, err)
		}
		for _, r := range rs {
			routes = append(routes, r.String())
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
