//go:build e2e

// Command testbed runs the e2e namespace testbed by hand; `make demo` uses
// it through hack/demo.sh.
//
//	testbed up   [-prefix mdemo-] [-dir /tmp/meshd-demo]
//	    control plane + 3 nodes in 2 locations (east-1, east-2, west-1), one
//	    pod each, meshd on every node (location granularity); then shows
//	    `wg show` of a leader, a cross-location pod ping and meshd's peer
//	    metrics, and leaves everything running in the background.
//	testbed down [-prefix mdemo-] [-dir /tmp/meshd-demo]
//	    kills every process in the prefix's namespaces (by pid) and deletes
//	    the namespaces and the directory.
//
// Out of scope: tests; this is the by-hand and demo front end of package
// testbed, which does the work.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"meshd.io/meshd/e2e/testbed"
)

func main() {
	log.SetFlags(0)
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	prefix := fs.String("prefix", "mdemo-", "prefix of every namespace")
	dir := fs.String("dir", envOr("MESHD_DEMO_DIR", "/tmp/meshd-demo"), "state directory")
	_ = fs.Parse(os.Args[2:])
	if os.Geteuid() != 0 {
		log.Fatal("testbed: needs root (network namespaces)")
	}
	ctx := context.Background()
	switch os.Args[1] {
	case "up":
		if err := up(ctx, *prefix, *dir); err != nil {
			log.Fatalf("testbed up: %v", err)
		}
	case "down":
		if err := testbed.RemoveLeftovers(ctx, *prefix, log.Printf); err != nil {
			log.Fatalf("testbed down: %v", err)
		}
		if *dir != "" && *dir != "/" {
			_ = os.RemoveAll(*dir)
		}
		log.Printf("testbed %s removed", *prefix)
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testbed up|down [-prefix P] [-dir D]")
	os.Exit(2)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func step(format string, args ...any) {
	fmt.Printf("\n\033[1m==> "+format+"\033[0m\n", args...)
}

func up(ctx context.Context, prefix, dir string) error {
	tb, err := testbed.New(testbed.Config{Prefix: prefix, Dir: dir, Logf: func(f string, a ...any) { log.Printf("    "+f, a...) }})
	if err != nil {
		return err
	}
	if err := tb.Lock(time.Minute); err != nil {
		return err
	}
	defer tb.Unlock()
	if err := tb.EnsureTools(ctx); err != nil {
		return err
	}
	if !tb.MeshdSourcePresent() {
		return fmt.Errorf("./cmd/meshd does not exist yet")
	}
	step("building meshd")
	if err := tb.BuildBinaries(ctx, true); err != nil {
		return err
	}
	fail := func(err error) error {
		_ = tb.Stop(context.Background())
		return err
	}
	step("starting etcd and kube-apiserver in namespace %scp", prefix)
	if err := tb.Start(ctx); err != nil {
		return fail(err)
	}
	step("creating locations east and west, nodes east-1, east-2, west-1, one pod each")
	for _, l := range []string{"east", "west"} {
		if _, err := tb.AddLocation(ctx, l, false); err != nil {
			return fail(err)
		}
	}
	var nodes []*testbed.Node
	for _, spec := range [][2]string{{"east-1", "east"}, {"east-2", "east"}, {"west-1", "west"}} {
		n, err := tb.AddNode(ctx, testbed.NodeOptions{Name: spec[0], Location: spec[1]})
		if err != nil {
			return fail(err)
		}
		if _, err := n.AddPod(ctx, "p0"); err != nil {
			return fail(err)
		}
		nodes = append(nodes, n)
		fmt.Printf("    %-7s underlay %-15s pods %-14s pod %s\n", n.Name, n.IP, n.PodCIDR, n.Pods()[0].IP)
	}
	step("starting meshd on every node (--mesh-granularity location)")
	for _, n := range nodes {
		if err := n.StartMeshd("--mesh-granularity", "location", "--resync-period", "30s"); err != nil {
			return fail(err)
		}
	}
	for _, n := range nodes {
		if err := n.WaitMeshdReady(ctx, time.Minute); err != nil {
			return fail(err)
		}
	}
	out, _ := tb.Kubectl(ctx, "get", "nodes", "-o", "wide")
	fmt.Print(out)

	step("waiting for pod-to-pod connectivity across locations")
	src, dst := nodes[1].Pods()[0], nodes[2].Pods()[0]
	deadline := time.Now().Add(60 * time.Second)
	for src.Ping(ctx, dst.IP, 1) != nil {
		if time.Now().After(deadline) {
			log.Printf("WARNING: %s cannot reach %s yet; look at %s/nodes/*/meshd.log", src.NS, dst.IP, dir)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	var leader *testbed.Node
	for _, n := range nodes {
		if d, err := n.WG(ctx, "meshd0"); err == nil && len(d.Peers) > 0 && n.Location.Name == "east" {
			leader = n
		}
	}
	if leader == nil {
		leader = nodes[0]
	}
	step("wg show on %s (leader of east)", leader.Name)
	out, err = leader.Exec(ctx, "wg", "show")
	fmt.Print(out)
	if err != nil {
		fmt.Println(err)
	}
	step("ping from pod on %s to pod on %s (%s)", nodes[1].Name, nodes[2].Name, dst.IP)
	out, err = src.Exec(ctx, "ping", "-n", "-c", "3", "-i", "0.3", dst.IP.String())
	fmt.Print(out)
	if err != nil {
		fmt.Println(err)
	}
	step("WireGuard peer metrics of %s (curl http://127.0.0.1:9477/metrics inside its namespace)", leader.Name)
	out, err = leader.Exec(ctx, "curl", "-sS", "--max-time", "5", "http://127.0.0.1:9477/metrics")
	if err != nil {
		fmt.Println(err)
	}
	for _, l := range strings.Split(out, "\n") {
		ll := strings.ToLower(l)
		if !strings.HasPrefix(l, "#") && (strings.Contains(ll, "peer") || strings.Contains(ll, "wireguard")) {
			fmt.Println("    " + l)
		}
	}
	fmt.Printf("\nThe mesh keeps running. Look around: %s/kubectl get nodes -o yaml; %s/nodes/<node>/exec wg show (no args: a shell in the node); logs in %s/nodes/<node>/meshd.log. Stop it: make demo-down\n",
		dir, dir, dir)
	return nil
}
