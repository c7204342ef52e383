package main

import (
	"net"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"k8s.io/apimachinery/pkg/runtime"

	"meshd.io/meshd/pkg/iptables"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/route"
	"meshd.io/meshd/pkg/wg"
)

type runtimeObject = runtime.Object

// wireGuardConfig turns the plan into the device's desired configuration.
func wireGuardConfig(p *mesh.Plan, key wgtypes.Key, mtu int) wg.Config {
	c := wg.Config{
		PrivateKey: key,
		ListenPort: p.WireGuard.ListenPort,
		Addresses:  p.WireGuard.Addresses,
		MTU:        mtu,
		Peers:      make([]wg.Peer, 0, len(p.WireGuard.Peers)),
	}
	for _, pp := range p.WireGuard.Peers {
		wp := wg.Peer{
			PublicKey:           pp.PublicKey,
			PresharedKey:        pp.PresharedKey,
			PersistentKeepalive: pp.PersistentKeepalive,
			AllowedIPs:          pp.AllowedIPs,
		}
		if pp.Endpoint.Addr.IsValid() {
			wp.Endpoint = net.UDPAddrFromAddrPort(pp.Endpoint.Addr)
		}
		c.Peers = append(c.Peers, wp)
	}
	return c
}

// routes is not a plain conversion: a route's type is a name in the plan and
// a kernel number in pkg/route.
func routes(p *mesh.Plan) []route.Route {
	out := make([]route.Route, len(p.Routes))
	for i, r := range p.Routes {
		out[i] = route.Route{Table: r.Table, Dst: r.Dst, Gateway: r.Gateway, Device: r.Device, Src: r.Src, Metric: r.Metric, Type: routeType(r.Type)}
	}
	return out
}

func routeType(t mesh.RouteType) route.Type {
	switch t {
	case mesh.RouteUnreachable:
		return route.TypeUnreachable
	case mesh.RouteUnicast:
		return route.TypeUnicast
	}
	return route.Type(-1) // unknown: route.Set refuses it
}

// rules, like the iptables chains and jumps below, converts between types
// of the same layout: a plain conversion, so a field added to one side only
// fails the build instead of being dropped here.
func rules(p *mesh.Plan) []route.Rule {
	out := make([]route.Rule, len(p.Rules))
	for i, r := range p.Rules {
		out[i] = route.Rule(r)
	}
	return out
}

func iptablesConfig(f mesh.IPTablesFamily) iptables.Config {
	c := iptables.Config{
		Chains: make([]iptables.Chain, len(f.Chains)),
		Jumps:  make([]iptables.Jump, len(f.Jumps)),
	}
	for i, ch := range f.Chains {
		c.Chains[i] = iptables.Chain(ch)
	}
	for i, j := range f.Jumps {
		c.Jumps[i] = iptables.Jump(j)
	}
	return c
}
