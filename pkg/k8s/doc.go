// Package k8s is meshd's Kubernetes layer: it converts Node and Peer objects
// into the planner's mesh.Node and mesh.Peer (tolerating and reporting
// malformed annotations), publishes the annotations meshd owns on its Node,
// keeps the per-node heartbeat Lease and judges other nodes' liveness from
// when this process observed their leases change (remote clocks are read
// once, on first sight, to tell a long-dead node's stale Lease from a fresh
// one: clocks must agree to well within --lease-duration), and builds the clients, informers and event recorder the daemon uses.
//
// The Peer API types live in pkg/k8s/apis/meshd/v1alpha1 and the generated
// clientset, listers and informers in pkg/k8s/client; run
// hack/update-codegen.sh after changing the types.
//
// Cluster links (link Secrets, linked clusters' Nodes and Leases) live in
// pkg/clusterlink.
//
// Out of scope: planning (pkg/mesh decides; this package only converts and
// reports) and every kernel change (the executors pkg/wg, pkg/route and
// pkg/iptables); nothing here reads the network.
package k8s
