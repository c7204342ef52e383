// Package convert translates between meshd's Kubernetes objects and the
// planner's types, in both directions. Inwards: Node objects become
// mesh.Node through a table of annotation parsers (NodeFromObject), Peer
// objects become mesh.Peer (PeerFromObject), and NewMeshInput assembles the
// planner input of a snapshot, with malformed annotations and unusable
// Peers reported (*AnnotationError, MeshInput.Problems), never fatal, and
// unchanged Nodes converted once (NodeCache); the
// location keys liveness is judged by come from here too. Outwards: the
// annotations meshd publishes on its own Node (NodeAnnotations,
// AnnotationPatch, PublishNode), the hysteresis and the limit of discovered
// endpoints (DiscoveredEndpoints, LimitDiscovered),
// and the Peer status the location leaders report (PeerStatusWriter: one
// background writer, only on change, never blocking the reconcile).
// It names every meshd annotation (annotations.go), and keeps informer
// caches lean (LeanNode, DropManagedFields: only what meshd reads).
//
// Out of scope: planning (pkg/mesh decides; this package only converts),
// heartbeat Leases and liveness (pkg/k8s/liveness), links to other clusters
// (pkg/k8s), reading Secrets (pkg/k8s/secrets: a SecretLookup is passed in),
// the DNS cache (pkg/dnscache: the daemon passes its cached lookup) and
// every kernel change (the executors).
package convert
