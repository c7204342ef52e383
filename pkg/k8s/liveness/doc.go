// Package liveness keeps this node's heartbeat Lease renewed (RunHeartbeat,
// with the node's data-plane probe report as Lease annotations and its
// leader candidacy as a label) and judges other nodes' liveness from when
// this process observed their Leases change (Liveness), combined with the
// probe reports of the leader candidates by location (Judge,
// DecideCandidates).
// Remote clocks are read once, on first sight, to tell a long-dead node's
// stale Lease from a fresh one, so clocks must agree to well within
// --lease-duration. While the API server is unreachable, decisions freeze.
//
// Out of scope: which nodes lead a location and which are candidates
// (pkg/mesh elects from the decisions and walks the candidates), probing
// (pkg/probe), the Leases of linked clusters (the link code in pkg/k8s runs
// one Liveness per cluster) and every kernel change.
package liveness
