// Package secrets reads Peer preshared keys from a Secret informer's store,
// never from the API server, and keeps the last valid key of every
// reference so a Secret that disappears or turns malformed leaves the Peer
// working on its last known key (reported as a *StaleError).
//
// Out of scope: watching the Secrets (the daemon's informer, limited to
// --peer-secret-namespace), converting the Peer itself (pkg/k8s/convert)
// and link Secrets between clusters (pkg/k8s).
package secrets
