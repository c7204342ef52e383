//go:build e2e

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"meshd.io/meshd/pkg/clusterlink"
	meshdfake "meshd.io/meshd/pkg/k8s/client/clientset/versioned/fake"
)

// linkLoad is `e2etool linkload`: the load one cluster's meshd puts on a
// linked cluster's API server, for the link benchmark (bench_links_test.go).
//
//	-mode nodes: what every meshd node of main did for cluster links
//	  (meshd.io/meshd before the link controller): -n independent copies of
//	  the link watch of the node daemon (LinkWatcher and LinkLiveness, each
//	  with its own client, as each node had), all reading the linked
//	  cluster through the link Secret's kubeconfig;
//	-mode controller: one link controller (clusterlink.Controller), whose
//	  ClusterLinks go to an in-memory local cluster (the nodes reading them
//	  never reach the linked cluster).
//
// SECRET is the link Secret as JSON. It runs for -duration, then exits.
func linkLoad(args []string) {
	fs := flag.NewFlagSet("linkload", flag.ExitOnError)
	mode := fs.String("mode", "nodes", "nodes or controller")
	n := fs.Int("n", 50, "nodes (mode nodes)")
	d := fs.Duration("duration", time.Minute, "how long to run")
	ns := fs.String("namespace", "meshd-system", "namespace of the link Secret and the linked cluster's Leases")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		usage()
	}
	b, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		log.Fatal(err)
	}
	var sec corev1.Secret
	if err := json.Unmarshal(b, &sec); err != nil {
		log.Fatalf("%s: %v", fs.Arg(0), err)
	}
	sec.Namespace = *ns
	ctx, cancel := context.WithTimeout(context.Background(), *d)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	switch *mode {
	case "nodes":
		for i := 0; i < *n; i++ {
			kube := fake.NewClientset(sec.DeepCopy())
			live := clusterlink.NewLinkLiveness(quiet, *ns, 40*time.Second, 30*time.Second, 30*time.Second, func() {})
			var w *clusterlink.LinkWatcher
			// As the node daemon of main did: every change reconciles, and
			// each reconcile syncs the Lease watches to the links.
			w = clusterlink.NewLinkWatcher(quiet, kube, *ns, 30*time.Second, func() { live.Sync(w.Snapshot()) })
			go func() { _ = live.Run(ctx) }()
			go func() { _ = w.Run(ctx) }()
		}
		log.Printf("linkload: %d node link watches running", *n)
	case "controller":
		c := clusterlink.NewController(fake.NewClientset(sec.DeepCopy()), meshdfake.NewSimpleClientset(), clusterlink.ControllerOptions{
			Namespace: *ns, LeaseDuration: 40 * time.Second, TakeoverDelay: 30 * time.Second, Resync: 5 * time.Minute, Logger: quiet,
		}, nil)
		go func() { _ = c.Run(ctx) }()
		log.Printf("linkload: one link controller running")
	default:
		fmt.Fprintf(os.Stderr, "linkload: -mode %q: want nodes or controller\n", *mode)
		os.Exit(2)
	}
	<-ctx.Done()
	log.Printf("linkload: done")
}
