//go:build e2e

package testbed

import (
	"context"
	"strings"
)

// APIServerProc is the main cluster's kube-apiserver process (SIGSTOP it to
// simulate a hung API server; SIGCONT resumes it).
func (tb *Testbed) APIServerProc() *Proc {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, p := range tb.cpProcs {
		if p.Name == "kube-apiserver" {
			return p
		}
	}
	return nil
}

// APIServerProc is the cluster's kube-apiserver process.
func (c *Cluster) APIServerProc() *Proc {
	c.tb.mu.Lock()
	defer c.tb.mu.Unlock()
	for _, p := range c.tb.procs {
		if p.Name == "kube-apiserver-"+c.Name {
			return p
		}
	}
	return nil
}

// RouterExec runs a command inside the router namespace (the WAN between
// locations: where a packet leaving a location is seen).
func (tb *Testbed) RouterExec(ctx context.Context, cmd ...string) (string, error) {
	out, err := run(ctx, append([]string{"ip", "netns", "exec", tb.RouterNS}, cmd...)...)
	return strings.TrimSpace(out), err
}
