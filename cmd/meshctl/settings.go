package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"meshd.io/meshd/pkg/k8s/convert"
)

// Published settings: every meshd publishes its effective settings on its
// Node (convert.AnnotationSettings). meshctl takes the cluster's from there for
// every global flag not given on the command line, so its flags need not be
// copied from the DaemonSet; a flag given wins.

// clusterSettings is what the nodes publish.
type clusterSettings struct {
	// Settings is what most nodes publish; Nodes how many of them, Of how
	// many published any (0: none, Settings is zero).
	Settings  convert.Settings
	Nodes, Of int
	// ByNode is each publishing node's settings.
	ByNode map[string]convert.Settings
	// Problems: nodes whose settings differ from the majority's, and
	// malformed annotations.
	Problems []string
}

// comparableSettings returns the mesh-wide part of s as a string: equal strings,
// equal settings (see convert.Settings.Differences).
func comparableSettings(s convert.Settings) string {
	s.Version, s.Interface, s.ListenPort, s.ListenLoopback = "", "", 0, false
	s.MeshCIDRs, s.ServiceCIDRs = slices.Sorted(slices.Values(s.MeshCIDRs)), slices.Sorted(slices.Values(s.ServiceCIDRs))
	return s.Encode()
}

// readClusterSettings reads meshd.io/settings of every node and finds the
// settings most nodes agree on; a node that differs is a problem (its
// meshd runs with other flags and computes another mesh).
func readClusterSettings(nodes []*corev1.Node) clusterSettings {
	cs := clusterSettings{ByNode: map[string]convert.Settings{}}
	groups := map[string][]string{}
	for _, n := range nodes {
		v, ok := n.Annotations[convert.AnnotationSettings]
		if !ok {
			continue
		}
		s, err := convert.ParseSettings(v)
		if err != nil {
			cs.Problems = append(cs.Problems, fmt.Sprintf("node/%s: %v", n.Name, err))
			continue
		}
		cs.ByNode[n.Name] = s
		k := comparableSettings(s)
		groups[k] = append(groups[k], n.Name)
	}
	if len(groups) == 0 {
		return cs
	}
	// The largest group wins; ties go to the group with the first node
	// name, so the choice does not depend on map order.
	keys := slices.SortedFunc(maps.Keys(groups), func(a, b string) int {
		return cmp.Or(cmp.Compare(len(groups[b]), len(groups[a])), strings.Compare(slices.Min(groups[a]), slices.Min(groups[b])))
	})
	winner := groups[keys[0]]
	cs.Settings, cs.Nodes, cs.Of = cs.ByNode[slices.Min(winner)], len(winner), len(cs.ByNode)
	for _, k := range keys[1:] {
		for _, name := range slices.Sorted(slices.Values(groups[k])) {
			diff := cs.ByNode[name].Differences(cs.Settings)
			cs.Problems = append(cs.Problems, fmt.Sprintf("node/%s: meshd runs with other settings than %d of %d nodes (%s): %s",
				name, cs.Nodes, cs.Of, strings.Join(slices.Sorted(slices.Values(winner))[:min(3, len(winner))], ","), strings.Join(diff, "; ")))
		}
	}
	return cs
}

// withPublished returns s with every mesh flag (--mesh-granularity,
// --mesh-cidr, --port, --topology-label, --lease-namespace, --lease-duration,
// --leader-candidates) that was not
// given (changed reports whether it was; nil: none was) taken from p.
func (s settings) withPublished(p convert.Settings, changed func(string) bool) (settings, []string) {
	given := func(name string) bool { return changed != nil && changed(name) }
	var notes []string
	if !given("mesh-granularity") && p.Granularity != "" {
		s.granularity = p.Granularity
	}
	if !given("mesh-cidr") && len(p.MeshCIDRs) > 0 {
		s.meshCIDRs = slices.Clone(p.MeshCIDRs)
	}
	if !given("port") && p.Port != 0 {
		s.port = p.Port
	}
	if !given("topology-label") && p.TopologyLabel != "" {
		s.topologyLabel = p.TopologyLabel
	}
	if !given("lease-namespace") && p.LeaseNamespace != "" {
		s.leaseNamespace = p.LeaseNamespace
	}
	if !given("leader-candidates") && p.LeaderCandidates > 0 {
		s.leaderCandidates = p.LeaderCandidates
	}
	if !given("lease-duration") && p.LeaseDuration != "" {
		if d, err := time.ParseDuration(p.LeaseDuration); err == nil && d > 0 {
			s.leaseDuration = d
		} else {
			notes = append(notes, fmt.Sprintf("ignoring the published lease duration %q; using %s", p.LeaseDuration, s.leaseDuration))
		}
	}
	return s, notes
}

// overridden lists the given flags whose value differs from the published
// one: meshctl then computes another mesh than the nodes, which the user
// may want (what-if) but should know.
func (s settings) overridden(p convert.Settings, changed func(string) bool) []string {
	if changed == nil || p.Granularity == "" {
		return nil
	}
	pub, _ := settings{}.withPublished(p, nil)
	var out []string
	diff := func(name string, a, b any) {
		if changed(name) && fmt.Sprint(a) != fmt.Sprint(b) {
			out = append(out, fmt.Sprintf("--%s %v overrides the cluster's %v", name, a, b))
		}
	}
	diff("mesh-granularity", s.granularity, pub.granularity)
	diff("mesh-cidr", strings.Join(s.meshCIDRs, ","), strings.Join(pub.meshCIDRs, ","))
	diff("port", s.port, pub.port)
	diff("topology-label", s.topologyLabel, pub.topologyLabel)
	diff("lease-namespace", s.leaseNamespace, pub.leaseNamespace)
	diff("lease-duration", s.leaseDuration, pub.leaseDuration)
	if pub.leaderCandidates > 0 {
		diff("leader-candidates", s.leaderCandidates, pub.leaderCandidates)
	}
	return out
}

// settingsFrom says where status's settings come from.
func settingsFrom(cs clusterSettings) string {
	if cs.Of == 0 {
		return "flags, no node publishes them"
	}
	return fmt.Sprintf("published by %d of %d nodes", cs.Nodes, cs.Of)
}
