// Package k8s links clusters: it reads and writes the link Secrets that
// connect this cluster's mesh to another's (LinkFromSecret, GrantLink,
// RevokeLink), watches the linked clusters' Nodes and heartbeat Leases
// (LinkWatcher, LinkLiveness), and converts a linked cluster's nodes into
// the Peers this cluster routes to (RemotePeers, with the policy in
// pkg/mesh).
//
// The Kubernetes layer is split by concern: the Peer API types live in
// pkg/k8s/apis/meshd/v1alpha1 and the generated clientset, listers and
// informers in pkg/k8s/client (run hack/update-codegen.sh after changing
// the types); clients in pkg/k8s/connect; conversion of Nodes and Peers and
// publishing in pkg/k8s/convert; heartbeat and liveness in
// pkg/k8s/liveness; preshared-key Secrets in pkg/k8s/secrets.
//
// Out of scope: planning (pkg/mesh decides; this package only converts and
// reports) and every kernel change (the executors pkg/wg, pkg/route and
// pkg/iptables); nothing here reads the network outside the watches.
package k8s
