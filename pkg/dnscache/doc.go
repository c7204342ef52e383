// Package dnscache resolves host names in the background into a cache
// (Resolver), so the reconcile never waits on DNS: a lookup answers from
// the cache at once, a failed resolution keeps the last known address, and
// OnChange asks for a reconcile when an address changes.
//
// Out of scope: which names are resolved (Peer endpoints and nodes' forced
// endpoints, decided by pkg/k8s/convert) and anything Kubernetes; it
// imports nothing of meshd.
package dnscache
