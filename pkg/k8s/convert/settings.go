package convert

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// AnnotationSettings is the node's effective meshd settings (the flags that
// shape the mesh), as JSON (see Settings). meshd publishes it on its own Node
// with the other annotations it owns, so it is written only when it changes
// (a restart with other flags, an upgrade): never at idle. meshctl reads it
// instead of needing the DaemonSet's flags copied by hand.
const AnnotationSettings = AnnotationPrefix + "settings"

// Settings are a node's effective meshd settings, as published in
// AnnotationSettings. Durations are Go duration strings ("40s"). It holds
// nothing secret. Fields added later must be optional (omitempty) so that
// an older meshctl still reads the annotation.
type Settings struct {
	// Version is the meshd version (informative: not compared between
	// nodes, so a rolling upgrade is no disagreement).
	Version string `json:"version,omitempty"`

	Granularity         string   `json:"granularity"`
	MeshCIDRs           []string `json:"meshCIDRs"`
	Port                int      `json:"port"`
	TopologyLabel       string   `json:"topologyLabel"`
	LeaseNamespace      string   `json:"leaseNamespace"`
	LeaseDuration       string   `json:"leaseDuration"`
	ServiceCIDRs        []string `json:"serviceCIDRs,omitempty"`
	PeerSecretNamespace string   `json:"peerSecretNamespace,omitempty"`
	ProbePort           int      `json:"probePort"`
	TakeoverDelay       string   `json:"takeoverDelay,omitempty"`
	// LeaderCandidates is --leader-candidates (0: not published, an older
	// meshd whose every node could lead).
	LeaderCandidates int    `json:"leaderCandidates,omitempty"`
	ClusterLinks     bool   `json:"clusterLinks"`
	Interface        string `json:"interface,omitempty"`
	// ListenPort is the port of meshd's HTTP endpoints (--listen: metrics,
	// health and the debug state); ListenLoopback is true when they listen
	// on a loopback address only (nothing off the node reaches them).
	ListenPort     int  `json:"listenPort,omitempty"`
	ListenLoopback bool `json:"listenLoopback,omitempty"`
}

// Encode renders s as the annotation value (compact JSON, fixed field
// order, so equal settings give equal strings and no write).
func (s Settings) Encode() string {
	b, err := json.Marshal(s)
	if err != nil { // strings, ints and bools only: cannot happen
		return ""
	}
	return string(b)
}

// ParseSettings reads an AnnotationSettings value.
func ParseSettings(v string) (Settings, error) {
	var s Settings
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return Settings{}, &AnnotationError{Annotation: AnnotationSettings, Value: v, Err: fmt.Errorf("not the JSON meshd writes: %w", err)}
	}
	return s, nil
}

// Differences lists the mesh-wide settings in which s and o differ, as
// "name a vs b" strings (nil when they agree). Version, Interface and the
// listen address are per node and not compared; CIDR lists are compared as
// sets.
func (s Settings) Differences(o Settings) []string {
	var out []string
	add := func(name string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			out = append(out, fmt.Sprintf("%s %v vs %v", name, a, b))
		}
	}
	add("mesh-granularity", s.Granularity, o.Granularity)
	add("mesh-cidr", sortedCopy(s.MeshCIDRs), sortedCopy(o.MeshCIDRs))
	add("port", s.Port, o.Port)
	add("topology-label", s.TopologyLabel, o.TopologyLabel)
	add("lease-namespace", s.LeaseNamespace, o.LeaseNamespace)
	add("lease-duration", s.LeaseDuration, o.LeaseDuration)
	add("service-cidr", sortedCopy(s.ServiceCIDRs), sortedCopy(o.ServiceCIDRs))
	add("peer-secret-namespace", s.PeerSecretNamespace, o.PeerSecretNamespace)
	add("probe-port", s.ProbePort, o.ProbePort)
	add("takeover-delay", s.TakeoverDelay, o.TakeoverDelay)
	add("leader-candidates", s.LeaderCandidates, o.LeaderCandidates)
	add("cluster-links", s.ClusterLinks, o.ClusterLinks)
	return out
}

func sortedCopy(ss []string) string {
	c := slices.Clone(ss)
	slices.Sort(c)
	return strings.Join(c, ",")
}
