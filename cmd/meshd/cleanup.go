package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"meshd.io/meshd/pkg/iptables"
	"meshd.io/meshd/pkg/mesh"
	"meshd.io/meshd/pkg/probe"
	"meshd.io/meshd/pkg/route"
	"meshd.io/meshd/pkg/wg"
)

// cleanup removes everything meshd owns on this node: its routes and rules,
// its iptables chains and the WireGuard interface. The key is kept.
func cleanup(c *config, log *slog.Logger) error {
	var errs []error
	if rm, err := route.New(route.Options{Protocol: mesh.DefaultRouteProto, Table: mesh.DefaultRouteTable, Logger: log}); err != nil {
		errs = append(errs, fmt.Errorf("opening netlink: %w", err))
	} else if err := rm.Cleanup(); err != nil {
		errs = append(errs, fmt.Errorf("removing routes and rules: %w", err))
	}
	// The data-plane probes' bypass rule (failover.go).
	if err := probe.RemoveBypass(probe.DefaultMark, mesh.DefaultRulePriority-1); err != nil {
		errs = append(errs, err)
	}
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		ipt, err := iptables.New(iptables.Options{Family: fam, Backend: c.IPTablesMode, Logger: log})
		if err != nil {
			errs = append(errs, fmt.Errorf("opening iptables: %w", err))
			continue
		}
		if err := ipt.Cleanup(); err != nil {
			errs = append(errs, fmt.Errorf("removing iptables chains: %w", err))
		}
	}
	// Open adopts an existing interface but would create a missing one: only
	// open what is there (a kernel link, or the TUN of a userspace device).
	if !route.LinkExists(c.Interface) {
		log.Info("no WireGuard interface to remove", "interface", c.Interface)
		return errors.Join(errs...)
	}
	dev, err := wg.Open(context.Background(), wg.Options{Name: c.Interface, Mode: wg.Mode(c.WireGuard), Logger: log})
	if err != nil {
		errs = append(errs, fmt.Errorf("opening WireGuard interface %s: %w", c.Interface, err))
	} else {
		errs = append(errs, dev.Delete(), dev.Close())
	}
	return errors.Join(errs...)
}
