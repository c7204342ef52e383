// Package nodestate is the JSON a node's meshd serves on its --listen
// address for diagnostics, and meshctl reads through the API server's node
// proxy: GET /debug/meshd (State: the node's plan, what its executors find
// in the kernel now, its WireGuard peers as `wg show` lists them, its probe
// results) and GET /debug/meshd/ping?to=ADDR (Ping: ICMP echo from the
// node's mesh address through the mesh). Both sides use these types, so
// they cannot drift apart.
//
// Nothing here is secret: there is deliberately no field for a private or
// preshared key (a Peer with a preshared key only says so).
//
// Out of scope: producing the values (cmd/meshd reads its reconciler and
// executors) and presenting them (cmd/meshctl diagnose and check).
package nodestate

import "time"

// Paths on meshd's --listen address.
const (
	PathState = "/debug/meshd"
	PathPing  = "/debug/meshd/ping"
)

// State is a node's current state as its meshd knows it.
type State struct {
	Node    string    `json:"node"`
	Version string    `json:"version"`
	Time    time.Time `json:"time"`
	// Ready and Readiness are what /readyz answers.
	Ready     bool   `json:"ready"`
	Readiness string `json:"readiness"`
	// Settings is the node's meshd.io/settings value (JSON).
	Settings string `json:"settings,omitempty"`
	// LastReconcile is when the last reconcile was attempted; Errors are
	// that reconcile's errors (none: it applied and published everything).
	LastReconcile time.Time `json:"lastReconcile"`
	Errors        []string  `json:"errors"`
	// Plan is the last plan the node computed (nil before the first).
	Plan *Plan `json:"plan,omitempty"`
	// WireGuard is the interface as the device reports it now.
	WireGuard WireGuard `json:"wireguard"`
	// Kernel is what the route and iptables executors read from the kernel
	// now (meshd's routes, rules and chains only).
	Kernel Kernel `json:"kernel"`
	// Probes are the data-plane probe results (underlay UDP echo).
	Probes Probes `json:"probes"`
}

// Plan is the plan's content that matters for diagnosis.
type Plan struct {
	Location string              `json:"location"`
	Leader   bool                `json:"leader"`
	Leaders  map[string]string   `json:"leaders"`
	MeshIPs  map[string][]string `json:"meshIPs"`
	// Addresses and ListenPort of the WireGuard interface.
	Addresses  []string   `json:"addresses"`
	ListenPort int        `json:"listenPort"`
	Peers      []PlanPeer `json:"peers"`
	Routes     []string   `json:"routes"`
	Rules      []string   `json:"rules"`
	// Chains are meshd's iptables chains, "family table chain: rule".
	Chains   []string `json:"chains"`
	Warnings []string `json:"warnings"`
}

// PlanPeer is one WireGuard peer of the plan.
type PlanPeer struct {
	Name                string   `json:"name"`
	PublicKey           string   `json:"publicKey"`
	Endpoint            string   `json:"endpoint,omitempty"`
	PersistentKeepalive int      `json:"persistentKeepalive,omitempty"` // seconds
	AllowedIPs          []string `json:"allowedIPs"`
	// PresharedKey says whether one is configured; the key is never shown.
	PresharedKey bool `json:"presharedKey,omitempty"`
}

// WireGuard is the interface as `wg show` would list it (no keys but the
// public ones).
type WireGuard struct {
	Interface string   `json:"interface"`
	Kind      string   `json:"kind"`
	PublicKey string   `json:"publicKey"`
	Peers     []WGPeer `json:"peers"`
	Error     string   `json:"error,omitempty"`
}

// WGPeer is one peer of the device.
type WGPeer struct {
	PublicKey string `json:"publicKey"`
	// Name is the plan's name of the peer ("" if the plan has none).
	Name     string `json:"name,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	// LastHandshake is nil when there was none.
	LastHandshake *time.Time `json:"lastHandshake,omitempty"`
	ReceiveBytes  int64      `json:"receiveBytes"`
	TransmitBytes int64      `json:"transmitBytes"`
}

// Kernel is meshd's part of the kernel's routing and firewall state.
type Kernel struct {
	Routes   []string `json:"routes"`
	Rules    []string `json:"rules"`
	IPTables []string `json:"iptables"`
	Errors   []string `json:"errors,omitempty"`
}

// Probes are the prober's results by target node: "up" or "down"; the
// tunnel probes' targets are named <cluster>/<mesh address>.
type Probes struct {
	Port    int               `json:"port"`
	Targets map[string]string `json:"targets"`
}

// Ping is the answer of PathPing.
type Ping struct {
	From     string    `json:"from"`   // the node
	Source   string    `json:"source"` // its mesh address used
	To       string    `json:"to"`
	Sent     int       `json:"sent"`
	Received int       `json:"received"`
	RTTs     []float64 `json:"rttMillis"`
	Error    string    `json:"error,omitempty"`
}
