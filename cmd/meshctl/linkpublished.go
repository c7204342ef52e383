package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/connect"
)

// fillPublished sets every mesh flag of side s that was not given
// (--PREFIXmesh-cidr, --PREFIXservice-cidr, --PREFIXmesh-granularity,
// --PREFIXtopology-label, --PREFIXport) from the settings the side's
// cluster's nodes publish (meshd.io/settings), as the global flags are for
// the other commands. It returns notes for stderr (nodes that disagree).
func fillPublished(ctx context.Context, c *connect.Clients, s *side, prefix string, changed func(string) bool) ([]string, error) {
	nl, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: listing its Nodes for the settings its meshd publishes: %w", s.name, err)
	}
	nodes := make([]*corev1.Node, len(nl.Items))
	for i := range nl.Items {
		nodes[i] = &nl.Items[i]
	}
	cs := readClusterSettings(nodes)
	var notes []string
	for _, p := range cs.Problems {
		notes = append(notes, fmt.Sprintf("cluster %s: %s", s.name, p))
	}
	if cs.Of == 0 {
		return notes, nil
	}
	p := cs.Settings
	given := func(name string) bool { return changed != nil && changed(prefix+name) }
	if !given("mesh-cidr") && len(p.MeshCIDRs) > 0 {
		s.meshCIDRs = slices.Clone(p.MeshCIDRs)
	}
	if !given("service-cidr") && len(p.ServiceCIDRs) > 0 {
		s.serviceCIDRs = slices.Clone(p.ServiceCIDRs)
	}
	if !given("mesh-granularity") && p.Granularity != "" {
		s.granularity = p.Granularity
	}
	if !given("topology-label") && p.TopologyLabel != "" {
		s.topology = p.TopologyLabel
	}
	if !given("port") && p.Port != 0 {
		s.port = p.Port
	}
	return notes, nil
}

// linkSettingsFromClusters fills both sides from what their clusters
// publish, validates them again and refuses overlapping ranges.
func (e *env) linkSettingsFromClusters(ctx context.Context, cmd *cobra.Command, from, to *side, fc, tc *connect.Clients) (fs, ts clusterlink.LinkSettings, err error) {
	for _, x := range []struct {
		s      *side
		c      *connect.Clients
		prefix string
	}{{from, fc, "from-"}, {to, tc, "to-"}} {
		notes, err := fillPublished(ctx, x.c, x.s, x.prefix, cmd.Flags().Changed)
		if err != nil {
			return fs, ts, err
		}
		for _, n := range notes {
			fmt.Fprintf(e.stderr, "meshctl: %s\n", n)
		}
	}
	if fs, ts, err = e.settingsOf(from, to); err != nil {
		return fs, ts, err
	}
	if o := overlaps(fs, ts); len(o) > 0 {
		return fs, ts, fmt.Errorf("the clusters' ranges overlap, refusing to link:\n  %s", strings.Join(o, "\n  "))
	}
	return fs, ts, nil
}

// givenOnly is ls without the mesh CIDRs when --PREFIXmesh-cidr was not
// given: before the clusters are read, only ranges given on the command
// line can be compared (a default may not be the cluster's).
func givenOnly(ls clusterlink.LinkSettings, prefix string, cmd *cobra.Command) clusterlink.LinkSettings {
	if !cmd.Flags().Changed(prefix + "mesh-cidr") {
		ls.MeshCIDRs = nil
	}
	return ls
}
