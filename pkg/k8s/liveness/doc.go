// Package liveness keeps this node's heartbeat Lease renewed (RunHeartbeat,
// with the node's data-plane probe report as Lease annotations) and judges
// other nodes' liveness from when this process observed their Leases
// change (Liveness), combined with the probe reports by location (Judge).
// Remote clocks are read once, on first sight, to tell a long-dead node's
// stale Lease from a fresh one, so clocks must agree to well within
// --lease-duration. While the API server is unreachable, decisions freeze.
//
// Out of scope: which nodes lead a location (pkg/mesh elects from the
// decisions), probing (pkg/probe), the Leases of linked clusters (the link
// code in pkg/k8s runs one Liveness per cluster) and every kernel change.
package liveness
