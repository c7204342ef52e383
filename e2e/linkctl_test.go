//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/client/clientset/versioned"
)

// linkCtlName names the link controller process of cluster i (0: cluster 1).
func linkCtlName(i int) string { return fmt.Sprintf("link-c%d", i+1) }

// startLinkControllers runs `meshd link` for cluster 1 and cluster 2 on the
// admin host, as the Deployment meshd-link of manifests/ would (its
// ServiceAccount and RBAC are the testbed's: manifests/link-rbac.yaml),
// unless they already run.
func (s *scenario) startLinkControllers(b *mcBed) {
	s.t.Helper()
	for i := range b.linkCtl {
		if p := b.linkCtl[i]; p != nil && !p.Exited() {
			continue
		}
		s.startLinkController(b, i, linkCtlName(i))
	}
}

// startLinkController starts cluster i's link controller as process name.
func (s *scenario) startLinkController(b *mcBed, i int, name string) *testbed.Proc {
	s.t.Helper()
	kube, kc, tok, dir := tb.Kube, tb.Kubeconfig, tb.Token, tb.Dir
	if i == 1 {
		kube, kc, tok, dir = b.c2.Kube, b.c2.Kubeconfig, b.c2.Token, b.c2.Dir
	}
	path := s.saKubeconfig(kube, kc, tok, filepath.Join(dir, "link.kubeconfig"), "meshd-link")
	p, err := b.admin.Start(name, tb.MeshdBinary, "link", "--kubeconfig", path, "--namespace", testbed.LeaseNamespace,
		"--listen", fmt.Sprintf("127.0.0.1:%d", 9479+i), "--resync-period", "5s", "--log-level", "debug")
	if err != nil {
		s.t.Fatal(err)
	}
	b.linkCtl[i] = p
	t := s.t
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("E2E_DIAG") != "" {
			t.Logf("----- %s: meshd link log (last 40 lines)\n%s", name, testbed.Tail(p.LogPath, 40))
		}
	})
	return p
}

// linkEvents lists the Events about ClusterLink name (a cluster-scoped
// object: its Events are in the default namespace).
func linkEvents(ctx context.Context, kube kubernetes.Interface, name string) ([]corev1.Event, error) {
	evs, err := kube.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ClusterLink,involvedObject.name=" + name})
	if err != nil {
		return nil, err
	}
	return evs.Items, nil
}

// meshdClientFrom is a meshd.io client from a kubeconfig of the main
// cluster (dialing from its control-plane namespace).
func meshdClientFrom(t *testing.T, kubeconfig string) versioned.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dial = testbed.NetnsDialer("/run/netns/" + tb.CPNS)
	c, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLinkController (issue 13): linked clusters are watched once per
// cluster, by the link controller, and the nodes hold no link credentials:
//   - the node credentials (the meshd ServiceAccount) may read ClusterLinks
//     but are denied the link Secret, listing Secrets of meshd-system and
//     writing a ClusterLink, and no node's meshd watches a linked cluster;
//   - at idle the ClusterLinks are not written;
//   - 10 pps pings cross the clusters both ways while cluster 2's API server
//     hangs and, during that outage, cluster 1's link controller is killed
//     and restarted: the ClusterLink keeps cluster 2's leaders (Reachable
//     False), and at most one ping per path is lost.
func TestLinkController(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	b := s.twoClusters(false)
	s.link(b)
	s.crossPing(b, 60*time.Second)

	// The nodes' credentials.
	node := kubeFrom(t, tb.MeshdKubeconfig)
	if _, err := node.CoreV1().Secrets(testbed.LeaseNamespace).Get(ctx, clusterlink.LinkSecretPrefix+"cluster2", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node credentials reading the link Secret: %v, want Forbidden", err)
	}
	if _, err := node.CoreV1().Secrets(testbed.LeaseNamespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node credentials listing Secrets of %s: %v, want Forbidden", testbed.LeaseNamespace, err)
	}
	nodeMeshd := meshdClientFrom(t, tb.MeshdKubeconfig)
	cl, err := nodeMeshd.MeshdV1alpha1().ClusterLinks().Get(ctx, "cluster2", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node credentials reading ClusterLink cluster2: %v", err)
	}
	if len(cl.Status.Leaders) != 1 {
		t.Fatalf("ClusterLink cluster2 has leaders %+v, want cluster 2's one location leader", cl.Status.Leaders)
	}
	forged := cl.DeepCopy()
	forged.Status.Leaders[0].AllowedIPs = append(forged.Status.Leaders[0].AllowedIPs, "0.0.0.0/0")
	if _, err := nodeMeshd.MeshdV1alpha1().ClusterLinks().UpdateStatus(ctx, forged, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node credentials writing ClusterLink cluster2's status: %v, want Forbidden", err)
	}
	if err := nodeMeshd.MeshdV1alpha1().ClusterLinks().Delete(ctx, "cluster2", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node credentials deleting ClusterLink cluster2: %v, want Forbidden", err)
	}
	for _, n := range b.all() {
		if log := testbed.Tail(n.MeshdLog(), 2000); strings.Contains(log, "watching linked cluster") || strings.Contains(log, "meshd-link-") {
			t.Errorf("meshd on %s watches a linked cluster itself", n.Name)
		}
	}

	// Idle: no ClusterLink write over two controller resyncs.
	rv := map[string]string{}
	for i, kube := range []versioned.Interface{tbMeshd(t), c2Meshd(t, b)} {
		l, err := kube.MeshdV1alpha1().ClusterLinks().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("cluster %d: ClusterLinks %v (%v), want one", i+1, l, err)
		}
		rv[fmt.Sprint(i)] = l.Items[0].ResourceVersion
	}
	time.Sleep(11 * time.Second)
	for i, kube := range []versioned.Interface{tbMeshd(t), c2Meshd(t, b)} {
		l, err := kube.MeshdV1alpha1().ClusterLinks().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("cluster %d: ClusterLinks %v (%v)", i+1, l, err)
		}
		if got := l.Items[0].ResourceVersion; got != rv[fmt.Sprint(i)] {
			t.Errorf("cluster %d: ClusterLink %s written at idle (resourceVersion %s -> %s)", i+1, l.Items[0].Name, rv[fmt.Sprint(i)], got)
		}
	}

	// Cluster 2's API server hangs for longer than the lease duration (40 s);
	// cluster 1's controller restarts meanwhile. After it, every Lease of
	// cluster 2 is stale on the restarted controller's first sight and its
	// nodes renew them in any order: the controller must keep cluster 2's
	// leader, as cluster 2 does.
	const window, hangAtLeast = 60 * time.Second, 45 * time.Second
	there := s.startPingVia("c1-c2", pod(b.one[0]).Start, pod(b.two[0]).IP.String(), window)
	back := s.startPingVia("c2-c1", pod(b.two[1]).Start, pod(b.one[1]).IP.String(), window)
	time.Sleep(2 * time.Second)
	resume := s.hang(b.c2.APIServerProc(), "cluster 2's kube-apiserver")
	hungAt := time.Now()
	s.eventually(40*time.Second, 500*time.Millisecond, "ClusterLink cluster2 says cluster 2 is unreachable", func() error {
		cl, err := tbMeshd(t).MeshdV1alpha1().ClusterLinks().Get(ctx, "cluster2", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if r := clusterlink.RemoteFromObject(cl); !r.Unreachable || len(r.Leaders) != 1 {
			return fmt.Errorf("status %+v", cl.Status)
		}
		return nil
	})
	t.Logf("cluster 1's link controller reported cluster 2 unreachable %s after its API server hung; leaders kept", time.Since(hungAt).Round(100*time.Millisecond))
	old := b.linkCtl[0]
	if err := old.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.Done()
	restarted := s.startLinkController(b, 0, linkCtlName(0)+"-restarted")
	s.eventually(30*time.Second, 250*time.Millisecond, "the restarted link controller leads", func() error {
		if restarted.Exited() {
			return fmt.Errorf("exited: %v\n%s", restarted.Err(), testbed.Tail(restarted.LogPath, 20))
		}
		if !strings.Contains(testbed.Tail(restarted.LogPath, 400), "keeping ClusterLinks from the link Secrets") {
			return fmt.Errorf("not leading yet")
		}
		return nil
	})
	time.Sleep(3 * time.Second) // it has listed the link Secrets; cluster 2 still hung
	cl, err = tbMeshd(t).MeshdV1alpha1().ClusterLinks().Get(ctx, "cluster2", metav1.GetOptions{})
	if err != nil || len(cl.Status.Leaders) != 1 {
		t.Errorf("ClusterLink cluster2 after the controller restarted during cluster 2's outage: %+v (%v)", cl, err)
	}
	time.Sleep(time.Until(hungAt.Add(hangAtLeast)))
	resume()
	t.Logf("cluster 2's API server resumed after %s", time.Since(hungAt).Round(100*time.Millisecond))
	for _, p := range []*pinger{there, back} {
		sent, lost := s.result(p, window+30*time.Second)
		t.Logf("path %s: %d of %d pings lost at 10 pps across cluster 2's API outage and cluster 1's link controller restart", p.name, lost, sent)
		if lost > 1 {
			t.Errorf("path %s lost %d pings, want at most 1", p.name, lost)
		}
	}
	s.eventually(60*time.Second, time.Second, "ClusterLink cluster2 says cluster 2 is reachable again", func() error {
		cl, err := tbMeshd(t).MeshdV1alpha1().ClusterLinks().Get(ctx, "cluster2", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if r := clusterlink.RemoteFromObject(cl); r.Unreachable || !r.Observed {
			return fmt.Errorf("status %+v", cl.Status)
		}
		return nil
	})
	s.crossPing(b, 30*time.Second)
}

// tbMeshd is the admin's meshd.io client of cluster 1.
func tbMeshd(t *testing.T) versioned.Interface {
	t.Helper()
	c, err := versioned.NewForConfig(tb.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// c2Meshd is the admin's meshd.io client of cluster 2.
func c2Meshd(t *testing.T, b *mcBed) versioned.Interface {
	t.Helper()
	c, err := versioned.NewForConfig(b.c2.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
