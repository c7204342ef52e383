//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mirror"
)

// budgetTunnelDown: a remote cluster's endpoints turn not ready within 10 s
// of the tunnel to it going down (issue 15).
const budgetTunnelDown = 10 * time.Second

// TestEndpointsFollowTheTunnel: cluster 1 exports web, `meshd mirror` of
// cluster 2 imports it. The WireGuard tunnel between the clusters is cut on
// the WAN (the router drops UDP 51820; both API servers and the underlay
// probes still answer): cluster 2's leader stops hearing cluster 1's
// leaders through the tunnel, publishes meshd.io/clusters-down=cluster1 on
// its Lease, and the mirror sets cluster 1's imported endpoints not ready
// within 10 s, the slice kept; after the repair they are ready again. Three
// cuts, each timed.
func TestEndpointsFollowTheTunnel(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	b := s.twoClusters(false)
	c1 := mcsCluster{name: "cluster1", kube: tb.Kube, dyn: tb.Dynamic}
	c2 := mcsCluster{name: "cluster2", kube: b.c2.Kube, dyn: b.c2.Dynamic}
	s.mcsCleanup(c1)
	t.Cleanup(func() { s.mcsCleanup(c1) })
	s.link(b)
	s.crossPing(b, 60*time.Second)

	manifest := filepath.Join(tb.RepoRoot, "manifests", "components", "mirror", "mirror.yaml")
	if out, err := b.c2.Kubectl(ctx, "apply", "-f", manifest); err != nil {
		t.Fatalf("applying %s to cluster 2: %v\n%s", manifest, err, out)
	}
	kc2 := s.mirrorKubeconfig(b.c2)
	p, err := b.admin.Start("mirror-c2-tunnel", tb.MeshdBinary, "mirror", "--kubeconfig", kc2, "--remote-kubeconfig", tb.Kubeconfig,
		"--remote-name", "cluster1", "--namespace", testbed.LeaseNamespace, "--leader-elect=false",
		"--mirror-services=false", "--listen", "127.0.0.1:9483", "--log-level", "debug")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("E2E_DIAG") != "" {
			t.Logf("----- mirror-c2-tunnel log (last 80 lines)\n%s", testbed.Tail(p.LogPath, 80))
			for _, n := range b.all() {
				data, _ := os.ReadFile(filepath.Join(n.Dir, "meshd.log"))
				var lines []string
				for _, l := range strings.Split(string(data), "\n") {
					if strings.Contains(l, "tunnel") || strings.Contains(l, "ICMP") {
						lines = append(lines, l)
					}
				}
				t.Logf("----- %s: meshd's tunnel probe lines\n%s", n.Name, strings.Join(lines, "\n"))
			}
		}
	})
	ensureNamespace(ctx, t, c1.kube, mcsNS)
	ensureNamespace(ctx, t, c2.kube, mcsNS)

	srv1 := pod(b.one[1])
	s.mcsService(c1, "web", nil, []*testbed.Pod{srv1}, false)
	s.mcsExport(c1, "web")
	s.waitImportSlices(c2, "web", budgetSlices, map[string][]string{"": {srv1.IP.String()}})

	// Cluster 2's leader probes cluster 1 through the tunnel and says so.
	reports := func(list string) func() error {
		return func() error {
			l, err := c2.kube.CoordinationV1().Leases(testbed.LeaseNamespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			var seen []string
			for _, le := range l.Items {
				if slices.Contains(liveness.ReportFromLease(&le).ClustersUp, "cluster1") && list == "up" ||
					slices.Contains(liveness.ReportFromLease(&le).ClustersDown, "cluster1") && list == "down" {
					return nil
				}
				seen = append(seen, le.Name+": "+fmt.Sprint(le.Annotations))
			}
			return fmt.Errorf("no Lease says cluster1 %s: %v", list, seen)
		}
	}
	s.eventually(30*time.Second, 250*time.Millisecond, "a cluster 2 Lease reports the tunnel to cluster 1 up", reports("up"))

	// ready reports the readiness of srv1's imported endpoint, and the
	// slice's UID (a slice is never deleted for this).
	ready := func() (bool, string, error) {
		for _, sl := range s.waitImportSlicesAny(c2, "web") {
			if sl.Labels[mirror.LabelSourceCluster] == "" {
				continue
			}
			for _, ep := range sl.Endpoints {
				if slices.Contains(ep.Addresses, srv1.IP.String()) {
					return ep.Conditions.Ready != nil && *ep.Conditions.Ready && ep.Conditions.Serving != nil && *ep.Conditions.Serving, string(sl.UID), nil
				}
			}
		}
		return false, "", fmt.Errorf("no imported endpoint %s", srv1.IP)
	}
	_, uid, err := ready()
	if err != nil {
		t.Fatal(err)
	}
	waitReady := func(want bool, budget time.Duration, what string) time.Duration {
		t.Helper()
		start := time.Now()
		s.eventually(budget, mcsPoll, what, func() error {
			r, u, err := ready()
			if err != nil {
				return err
			}
			if u != uid {
				t.Fatalf("the imported slice was replaced (%s -> %s)", uid, u)
			}
			if r != want {
				return fmt.Errorf("ready %v", r)
			}
			return nil
		})
		return time.Since(start)
	}
	rules := [][]string{{"-p", "udp", "--dport", "51820"}, {"-p", "udp", "--sport", "51820"}}
	cut := func(op string) {
		for _, rule := range rules {
			if out, err := tb.RouterExec(context.Background(), append([]string{"iptables", op, "FORWARD"}, append(rule, "-j", "DROP")...)...); err != nil {
				t.Errorf("iptables %s %v: %v: %s", op, rule, err, out)
			}
		}
	}
	cutNow := false
	t.Cleanup(func() {
		if cutNow {
			cut("-D")
		}
	})
	for run := 1; run <= 3; run++ {
		cut("-I")
		cutNow = true
		down := waitReady(false, budgetTunnelDown, fmt.Sprintf("run %d: cluster 1's endpoint in cluster 2 not ready after the tunnel cut", run))
		// Both API servers still answer.
		if _, err := c1.kube.CoreV1().Services(mcsNS).Get(ctx, "web", metav1.GetOptions{}); err != nil {
			t.Fatalf("cluster 1's API with the tunnel cut: %v", err)
		}
		if err := reports("down")(); err != nil {
			t.Error(err)
		}
		cut("-D")
		cutNow = false
		up := waitReady(true, 30*time.Second, fmt.Sprintf("run %d: cluster 1's endpoint in cluster 2 ready after the repair", run))
		t.Logf("TUNNEL run %d: not ready %s after the cut, ready %s after the repair", run, down.Round(time.Millisecond), up.Round(time.Millisecond))
		if len(s.waitImportSlicesAny(c2, "web")) == 0 {
			t.Fatal("imported slices gone")
		}
	}
}
