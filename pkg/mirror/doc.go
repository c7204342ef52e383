// Package mirror mirrors exported Services of remote clusters into the local
// cluster. A Service of a remote (source) cluster is exported when a
// multicluster.x-k8s.io ServiceExport of the same name and namespace exists
// next to it; its mirror in the local cluster is a selector-less Service with
// the same ports and EndpointSlices pointing at the remote cluster IP (or, for
// a headless Service, at the remote pod IPs), which the mesh routes.
//
// The Controller follows the sample-controller pattern: informers on the
// remote Services, ServiceExports and EndpointSlices of every remote cluster
// and on the local mirrors feed one rate-limited workqueue keyed by
// cluster/namespace/name, and one reconcile compares the desired mirror with
// the actual one. meshd never changes or deletes a Service it did not create:
// a name clash is reported (Event, log, metric) and skipped. A remote cluster
// that stops answering keeps its mirrors; after a grace period their
// endpoints are marked not ready until it answers again.
//
// With Options.ClusterID the Controller also writes the Multi-Cluster
// Services API objects (KEP-1645, sigs.k8s.io/mcs-api v1beta1) of the local
// cluster, from the exports of every source cluster including the local one:
// a ServiceImport per exported Service (only meshd writes it), for a
// ClusterSetIP import a derived selector-less Service whose cluster IP is the
// ClusterSetIP, EndpointSlices per source cluster (labelled
// multicluster.kubernetes.io/service-name and source-cluster, owned by the
// ServiceImport), and the Valid/Ready/Conflict conditions of the local
// ServiceExports. Properties merge as the KEP says: the oldest export wins,
// ports are the union by name. Nothing is deleted before every source cluster
// has synced (restarts, new leaders). The cluster ID is the About API's
// ClusterProperty cluster.clusterset.k8s.io (EnsureClusterID).
//
// Remote clusters come from the cluster-link Secrets (WatchLinks) or are
// added directly (AddRemote). RunLeaderElected keeps one active replica.
//
// Out of scope: the mesh itself. Reaching a mirrored Service's addresses is
// the routes and WireGuard peers meshd's node daemon plans; this package uses
// no executor and writes only Kubernetes objects.
package mirror
