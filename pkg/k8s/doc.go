// Package k8s is the root of meshd's Kubernetes layer. It holds no code of
// its own, only this map and the test that keeps the CRD reference docs
// true (crddoc_test.go); the layer is split by concern:
//
//   - pkg/k8s/apis/meshd/v1alpha1: the Peer and ClusterLink API types, and
//     pkg/k8s/client the generated clientset, listers and informers (run
//     hack/update-codegen.sh after changing the types);
//   - pkg/k8s/connect: API clients, the Peer informer, the event recorder;
//   - pkg/k8s/convert: Node and Peer objects to planner inputs and back
//     (annotations, publishing, Peer status, published settings);
//   - pkg/k8s/liveness: the heartbeat Lease and the liveness judge;
//   - pkg/k8s/secrets: Peer preshared keys from Secrets.
//
// Cluster links live in pkg/clusterlink, background DNS resolution in
// pkg/dnscache.
//
// Out of scope: planning (pkg/mesh decides; the layer only converts and
// reports) and every kernel change (the executors pkg/wg, pkg/route and
// pkg/iptables); nothing in the layer reads the network outside its watches.
package k8s
