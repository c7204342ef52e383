// Package wg is meshd's WireGuard device executor. It opens the mesh
// interface — adopting an existing kernel link or UAPI-served userspace
// device, else creating a kernel WireGuard link, else running
// golang.zx2c4.com/wireguard's device in-process on a TUN device with its UAPI
// socket in /var/run/wireguard so that wg(8) and wgctrl see it as usual — and
// applies a desired Config to it as a minimal per-peer delta through wgctrl,
// plus the interface's addresses, MTU and up state through netlink.
//
// Nothing is written when nothing differs: Set reads the device back, compares
// normalised copies of both sides and calls ConfigureDevice only with the
// peers that changed (never ReplacePeers). Endpoints follow a roaming-friendly
// rule: a desired endpoint is written only when it differs from what this
// Device last wrote for that peer (or, after a restart, from the device's
// current endpoint), and an absent desired endpoint never resets one.
//
// A peer that is created with an endpoint gets its first handshake started at
// once, whatever its persistent keepalive: the delta briefly turns persistent
// keepalive on for it in the same ConfigureDevice call (the kernel and
// wireguard-go both send a keepalive — hence a handshake initiation — when it
// goes from off to on while the interface is up) and sets the desired value
// right after. So a restarted in-process device handshakes with all its peers
// immediately instead of waiting for traffic.
//
// A Manager owns the interface for the daemon's life, like route.Manager:
// Set applies the desired Config (opening the interface again when it has
// disappeared) and Run is the one worker that follows the interface between
// Sets — it puts back a deleted, replaced or downed interface with the last
// desired Config and asks for a reconcile, re-creates the peers whose
// first handshake is overdue, and with lazy peers takes the idle ones out.
// No timer outside Run writes to the device.
//
// Lazy peers (Options.LazyPeers, in-process devices only; lazy.go; with
// Options.LazyPeersAbove only while more peers than that are configured,
// every peer in the device up to it): the device holds only the peers
// that carry traffic. The others are kept as
// configured and put into the device, from the packet paths, by the first
// packet read from the TUN device for their allowed IPs or by their first
// handshake initiation (its sender identified and authenticated by
// package initiation before wireguard-go reads it); Run takes a peer out
// again after 5 minutes without traffic. Reads of the device through the
// Device list every configured peer, so Set's delta is unchanged; wg(8)
// lists the active ones. A peer with a persistent keepalive is never lazy,
// and a lazy peer gets no first-handshake nudge (nor its retries): it
// handshakes when traffic needs it.
//
// The in-process device keeps every socket it opens (UDP, route listener) in
// the network namespace of the thread that called Open or RunDevice, even when
// other namespaces exist in the same process (as in tests).
//
// It also reads and writes at most inProcessBatchSize (32) packets per call
// instead of wireguard-go's 128, on the UDP socket and on the TUN device
// (whose gso_max_segs is capped to match): the batch buffers were 24 MB of
// every device's heap whatever its peers (batch.go has the figures). After
// each send and TUN write it points the device's packet slices at a static
// buffer (detach): wireguard-go's two goroutines per peer otherwise keep
// their last batch's 64 KB buffers reachable, 30 MB with 1,000 idle peers.
//
// Out of scope: which peers, addresses and MTU the interface should have
// (pkg/mesh plans them), routes and policy rules (pkg/route) and iptables
// (pkg/iptables); this package imports nothing of meshd or k8s.io.
package wg
