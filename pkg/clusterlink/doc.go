// Package clusterlink links meshd clusters (`meshctl link`): it grants one
// cluster read-only, expiring credentials for another and stores them as a
// labelled link Secret (GrantLink, RevokeLink, LinkFromSecret), watches those
// Secrets and, through them, the linked clusters' Nodes and heartbeat
// Leases (LinkWatcher, LinkLiveness), and turns a linked cluster's nodes
// into the WireGuard peers its location leaders are (RemotePeers, with the
// trust policy of pkg/mesh applied).
//
// Out of scope: the policy itself (which remote ranges are refused is
// decided by pkg/mesh), the local cluster's Node and Lease conversion
// (pkg/k8s), and every kernel change (the executors); nothing here runs on
// the reconcile path's goroutine or reads the network from it.
package clusterlink
