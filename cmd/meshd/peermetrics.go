package main

import (
	"cmp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"meshd.io/meshd/pkg/wg"
)

// defaultPeerMetricsLimit is --peer-metrics-limit's default: more than a
// location leader has in a location mesh of a few dozen locations, far fewer
// than a node of a large full mesh has (N-1 peers each, N² series across the
// fleet).
const defaultPeerMetricsLimit = 64

// recentHandshake is how recent a handshake counts in
// meshd_wireguard_peers_handshake_recent: WireGuard re-handshakes every 2
// minutes while traffic or keepalives flow.
const recentHandshake = 3 * time.Minute

// peerSeriesLimit is the most WireGuard peers with per-peer series; 0: none.
// The zero value of the metrics (tests) means no limit.
type peerSeriesLimit struct {
	set   bool
	limit int
}

// setPeerSeriesLimit applies --peer-metrics-limit.
func (m *metrics) setPeerSeriesLimit(n int) {
	m.mu.Lock()
	m.peerSeries = peerSeriesLimit{set: true, limit: n}
	m.mu.Unlock()
}

var (
	descRecent = prometheus.NewDesc("meshd_wireguard_peers_handshake_recent",
		"WireGuard peers of this node with a handshake in the last 3 minutes, by kind (compare with meshd_wireguard_peers; bounded however large the mesh).",
		[]string{"kind"}, nil)
	descOmitted = prometheus.NewDesc("meshd_wireguard_peer_series_omitted",
		"WireGuard peers of this node without meshd_wireguard_peer_* series because of --peer-metrics-limit.", nil, nil)
)

// peerRank orders kinds for the per-peer series: what an operator set up
// by hand (Peers, cluster links) first, then locations, then nodes.
var peerRank = map[string]int{"peer": 0, "cluster": 1, "location": 2, "node": 3, "": 4}

// collectPeers emits the per-peer series of at most the limit's peers (by
// kind rank, then name) and the bounded per-kind summary of all of them.
func (m *metrics) collectPeers(ch chan<- prometheus.Metric, stats []wg.PeerStats, now time.Time) {
	m.mu.Lock()
	names, kinds, lim := m.names, m.kinds, m.peerSeries
	m.mu.Unlock()

	recent := make(map[string]int, len(wireGuardPeerKinds))
	for _, k := range wireGuardPeerKinds {
		recent[k] = 0
	}
	for _, s := range stats {
		if k, ok := kinds[s.PublicKey]; ok && !s.LastHandshake.IsZero() && now.Sub(s.LastHandshake) <= recentHandshake {
			recent[k]++
		}
	}
	for _, k := range wireGuardPeerKinds {
		ch <- prometheus.MustNewConstMetric(descRecent, prometheus.GaugeValue, float64(recent[k]), k)
	}

	keep := stats
	if lim.set && len(stats) > lim.limit {
		keep = slices.Clone(stats)
		slices.SortFunc(keep, func(a, b wg.PeerStats) int {
			if c := cmp.Compare(peerRank[kinds[a.PublicKey]], peerRank[kinds[b.PublicKey]]); c != 0 {
				return c
			}
			if c := cmp.Compare(names[a.PublicKey], names[b.PublicKey]); c != 0 {
				return c
			}
			return cmp.Compare(a.PublicKey.String(), b.PublicKey.String())
		})
		keep = keep[:lim.limit]
	}
	ch <- prometheus.MustNewConstMetric(descOmitted, prometheus.GaugeValue, float64(len(stats)-len(keep)))
	for _, s := range keep {
		name := names[s.PublicKey]
		key := s.PublicKey.String()
		hs := 0.0
		if !s.LastHandshake.IsZero() {
			hs = float64(s.LastHandshake.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(descHandshake, prometheus.GaugeValue, hs, name, key)
		ch <- prometheus.MustNewConstMetric(descRx, prometheus.CounterValue, float64(s.ReceiveBytes), name, key)
		ch <- prometheus.MustNewConstMetric(descTx, prometheus.CounterValue, float64(s.TransmitBytes), name, key)
	}
}
