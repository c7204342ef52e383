package wg

import (
	"log/slog"
	"net"
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Mode selects the WireGuard implementation.
type Mode string

const (
	// ModeAuto adopts an existing WireGuard interface, else creates a kernel
	// link, else runs the userspace device in-process.
	ModeAuto Mode = "auto"
	// ModeKernel requires kernel WireGuard (adopts an existing kernel link).
	ModeKernel Mode = "kernel"
	// ModeUserspace requires userspace WireGuard: it adopts a device served
	// over UAPI by another process (the `meshd device` sidecar), else runs
	// one in-process.
	ModeUserspace Mode = "userspace"
)

// Kinds reported by Device.Kind.
const (
	KindKernel             = "kernel"
	KindUserspaceInProcess = "userspace-inprocess"
	KindUserspaceExternal  = "userspace-external"
	KindFake               = "fake"
	uapiSocketDir          = "/var/run/wireguard"
	defaultMTU             = 1420
	nudgeKeepalive         = time.Second
	keyFileName            = "private-key"
	nextKeyFileName        = "private-key.next"
)

// ParseMode parses a --wireguard-mode style flag value ("" means auto).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeAuto:
		return ModeAuto, nil
	case ModeKernel, ModeUserspace:
		return Mode(s), nil
	}
	return "", &modeError{s}
}

type modeError struct{ s string }

func (e *modeError) Error() string {
	return "invalid WireGuard mode " + `"` + e.s + `"` + " (want auto, kernel or userspace)"
}

// Options says which interface Open works on and how.
type Options struct {
	Name   string // interface name, e.g. "meshd0"
	Mode   Mode   // "" means ModeAuto
	MTU    int    // MTU for a created interface and default for Set; 0 means 1420 on creation and "leave as is" in Set
	Logger *slog.Logger
	// LazyPeers keeps the peers of an in-process device that carry no
	// traffic out of it (see lazyPeers); it does nothing for a kernel or
	// external userspace device.
	LazyPeers bool
	// LazyPeersAbove, with LazyPeers, makes the device lazy only while
	// more than this many peers are configured: up to it, every peer is in
	// the device, as without LazyPeers. 0: always lazy.
	LazyPeersAbove int
}

// Peer is one desired WireGuard peer.
type Peer struct {
	PublicKey    wgtypes.Key
	PresharedKey *wgtypes.Key // nil: none
	// Endpoint nil (or zero IP) never resets the current endpoint, so
	// WireGuard's roaming is left alone.
	Endpoint *net.UDPAddr
	// PersistentKeepalive is applied in whole seconds; 0 turns it off.
	PersistentKeepalive time.Duration
	AllowedIPs          []netip.Prefix
}

// Config is the whole desired state of the interface.
type Config struct {
	PrivateKey wgtypes.Key    // zero: leave unchanged
	ListenPort int            // 0: leave unchanged
	Addresses  []netip.Prefix // every address meshd wants on the link; others are removed (IPv6 link-local kept)
	MTU        int            // 0: Options.MTU, and if that is 0 too, leave unchanged
	Peers      []Peer
}

// PeerStats is what the device reports about one peer.
type PeerStats struct {
	PublicKey     wgtypes.Key
	Endpoint      *net.UDPAddr // current endpoint, learned by roaming too; nil if none
	LastHandshake time.Time    // zero if never
	ReceiveBytes  int64
	TransmitBytes int64
}
