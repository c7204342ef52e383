// Package initiationtest makes real WireGuard handshake initiations for
// tests: it runs a wireguard-go device on a channel bind and returns the
// first initiation it sends. It is for tests of package initiation and of
// pkg/wg's lazy peers only.
//
// Out of scope: anything a test does not need; no production code imports
// it.
package initiationtest
