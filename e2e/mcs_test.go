//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/mirror"
)

// mcsNS is the namespace of the MCS scenario, in both clusters. Cluster 1
// outlives the scenario (no namespace controller): only the objects of the
// scenario are deleted.
const mcsNS = "mcs"

// The MCS conformance suite's time budgets (sigs.k8s.io/mcs-api conformance).
const (
	budgetImport      = 20 * time.Second // ServiceImport created / deleted
	budgetConditions  = 20 * time.Second // ServiceExport conditions
	budgetSlices      = 60 * time.Second // EndpointSlices appear
	budgetSlicesGone  = 20 * time.Second // EndpointSlices deleted after unexport
	mcsPoll           = 100 * time.Millisecond
	mcsTestLabelValue = "true"
)

// mcsCluster is one side of the scenario.
type mcsCluster struct {
	name string
	kube kubernetes.Interface
	dyn  dynamic.Interface
}

// Multi-Cluster Services (docs/mcs.md) between two linked clusters, a real
// kube-proxy on every node, and `meshd mirror --kubeconfig K
// --remote-kubeconfig R` for each cluster (the local side as the
// ServiceAccount of manifests/components/mirror). It covers what the SIG's
// conformance suite checks, with its budgets:
//
//   - ServiceImport lifecycle: created in both clusters (the exporting one
//     too) within 20 s, ClusterSetIP from a derived Service, slices labelled
//     by service name and source cluster within 60 s, deleted within 20 s of
//     the unexport;
//   - ServiceExport conditions Valid/Ready/Conflict within 20 s;
//   - traffic: a pod of cluster 2 fetches the ClusterSetIP through kube-proxy;
//     with both clusters exporting and cluster 1's backends gone, traffic
//     moves to cluster 2's;
//   - IP families, port union and port conflict, session affinity and
//     traffic policy carried through, headless, ExternalName (Valid=False),
//     type conflict (Conflict=True), an unexported Service not imported;
//   - the metrics.
func TestMultiClusterServices(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	b := s.twoClusters(true)
	c1 := mcsCluster{name: "cluster1", kube: tb.Kube, dyn: tb.Dynamic}
	c2 := mcsCluster{name: "cluster2", kube: b.c2.Kube, dyn: b.c2.Dynamic}
	s.mcsCleanup(c1) // leftovers of an interrupted run
	t.Cleanup(func() { s.mcsCleanup(c1) })
	s.link(b)
	s.crossPing(b, 60*time.Second)

	// The mirror's RBAC in both clusters, and one `meshd mirror` per
	// cluster: local side as its ServiceAccount, remote side with the
	// other cluster's admin kubeconfig.
	manifest := filepath.Join(tb.RepoRoot, "manifests", "components", "mirror", "mirror.yaml")
	if out, err := b.c2.Kubectl(ctx, "apply", "-f", manifest); err != nil {
		t.Fatalf("applying %s to cluster 2: %v\n%s", manifest, err, out)
	}
	if out, err := tb.Kubectl(ctx, "apply", "-f", manifest); err != nil {
		t.Fatalf("applying %s to cluster 1: %v\n%s", manifest, err, out)
	}
	kc2 := s.mirrorKubeconfig(b.c2)
	kc1 := s.mirrorKubeconfigMain()
	procs := map[string]*testbed.Proc{}
	for _, m := range []struct{ name, kc, remote, remoteName, listen string }{
		{"mirror-c2", kc2, tb.Kubeconfig, "cluster1", "127.0.0.1:9481"},
		{"mirror-c1", kc1, b.c2.Kubeconfig, "cluster2", "127.0.0.1:9482"},
	} {
		p, err := b.admin.Start(m.name, tb.MeshdBinary, "mirror", "--kubeconfig", m.kc, "--remote-kubeconfig", m.remote,
			"--remote-name", m.remoteName, "--namespace", testbed.LeaseNamespace, "--leader-elect=false",
			"--mirror-services=false", "--listen", m.listen, "--log-level", "debug")
		if err != nil {
			t.Fatal(err)
		}
		procs[m.name] = p
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("E2E_DIAG") != "" {
			for n, p := range procs {
				t.Logf("----- %s log (last 80 lines)\n%s", n, testbed.Tail(p.LogPath, 80))
			}
		}
	})
	ensureNamespace(ctx, t, c1.kube, mcsNS)
	ensureNamespace(ctx, t, c2.kube, mcsNS)

	// 1. Lifecycle: cluster 1 exports web.
	srv1, srv2 := pod(b.one[1]), pod(b.two[1])
	client := pod(b.two[0])
	const text1, text2 = "web from cluster 1", "web from cluster 2"
	if _, err := srv1.Start("http-mcs", tb.ToolBinary, "http", "0.0.0.0:8080", text1); err != nil {
		t.Fatal(err)
	}
	if _, err := srv2.Start("http-mcs", tb.ToolBinary, "http", "0.0.0.0:8080", text2); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.mcsService(c1, "web", nil, []*testbed.Pod{srv1}, false)
	s.mcsExport(c1, "web")
	for _, c := range []mcsCluster{c1, c2} {
		si := s.waitImport(c, "web", budgetImport, func(si *mcsv1beta1.ServiceImport) error {
			if si.Spec.Type != mcsv1beta1.ClusterSetIP || len(si.Spec.IPs) == 0 || len(si.Status.Clusters) != 1 {
				return fmt.Errorf("type %s, ips %v, clusters %v", si.Spec.Type, si.Spec.IPs, si.Status.Clusters)
			}
			return nil
		})
		t.Logf("ServiceImport %s/web in %s %s after the export: %s %v, derived Service %s", mcsNS, c.name, time.Since(start).Round(time.Millisecond),
			si.Spec.Type, si.Spec.IPs, si.Annotations[mirror.AnnotationDerivedService])
	}
	s.waitConditions(c1, "web", budgetConditions, map[string]string{"Valid": "True/Valid", "Ready": "True/Ready", "Conflict": "False/NoConflicts"})
	t.Logf("ServiceExport conditions Valid, Ready, Conflict in cluster 1 %s after the export", time.Since(start).Round(time.Millisecond))
	imported := s.waitImportSlices(c2, "web", budgetSlices, map[string][]string{"": {srv1.IP.String()}})
	t.Logf("EndpointSlices of web in cluster 2 (labelled service-name and source-cluster, not managed by the endpointslice controller) %s after the export", time.Since(start).Round(time.Millisecond))
	// The source cluster is cluster 1's ID: its ClusterProperty, the same
	// in both versions the CRD serves (v1beta1 stored, v1alpha1 read by the
	// mirror).
	id1 := s.clusterID(c1, "v1beta1")
	if alpha := s.clusterID(c1, "v1alpha1"); id1 == "" || alpha != id1 {
		t.Errorf("cluster 1's ClusterProperty %s: v1beta1 %q, v1alpha1 %q", mirror.ClusterIDProperty, id1, alpha)
	}
	for _, sl := range imported {
		if got := sl.Labels[mirror.LabelSourceCluster]; got != id1 {
			t.Errorf("slice %s in cluster 2: source cluster %q, want cluster 1's ID %q", sl.Name, got, id1)
		}
	}
	si2 := s.getImport(c2, "web")
	// IP families: the ServiceImport's and the derived Service's agree.
	derived, err := c2.kube.CoreV1().Services(mcsNS).Get(ctx, si2.Annotations[mirror.AnnotationDerivedService], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(derived.Spec.ClusterIPs, si2.Spec.IPs) || !slices.Equal(derived.Spec.IPFamilies, si2.Spec.IPFamilies) || len(si2.Spec.IPFamilies) == 0 {
		t.Errorf("IP families: ServiceImport ips %v families %v, derived Service %v %v", si2.Spec.IPs, si2.Spec.IPFamilies, derived.Spec.ClusterIPs, derived.Spec.IPFamilies)
	}
	// Traffic through the real kube-proxy of cluster 2.
	url := fmt.Sprintf("http://%s:80/", si2.Spec.IPs[0])
	start = time.Now()
	s.httpEventually(client, url, text1, 60*time.Second)
	t.Logf("a cluster 2 pod fetches the ClusterSetIP %s (kube-proxy -> cluster 1's pod over the mesh) %s after asking", url, time.Since(start).Round(time.Millisecond))
	s.clustersetName(b.c2, b.two[0], si2, text1)

	// 2. Cluster 2 exports web too (the HA case): one import, both
	// clusters' endpoints. Then cluster 1's backends go away.
	s.mcsService(c2, "web", nil, []*testbed.Pod{srv2}, false)
	s.mcsExport(c2, "web")
	s.waitImportSlices(c2, "web", budgetSlices, map[string][]string{"": {srv1.IP.String(), srv2.IP.String()}})
	s.waitConditions(c2, "web", budgetConditions, map[string]string{"Valid": "True/Valid", "Ready": "True/Ready", "Conflict": "False/NoConflicts"})
	start = time.Now()
	if err := c1.kube.DiscoveryV1().EndpointSlices(mcsNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web," + mirrorTestLabel}); err != nil {
		t.Fatal(err)
	}
	s.eventually(60*time.Second, 200*time.Millisecond, "all of 10 requests to the ClusterSetIP answered by cluster 2", func() error {
		for range 10 {
			out, err := client.Exec(ctx, "curl", "-sS", "-m", "2", url)
			if err != nil || !strings.Contains(out, text2) {
				return fmt.Errorf("%q %v", out, err)
			}
		}
		return nil
	})
	t.Logf("FAILOVER cluster 1's backends deleted: traffic to the ClusterSetIP answered only by cluster 2 %s later", time.Since(start).Round(time.Millisecond))

	// 3. Ports: union by name, and a conflict (cluster 2's export is newer).
	s.mcsService(c1, "ports", func(sp *corev1.ServiceSpec) {
		sp.Ports = []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
	}, nil, false)
	s.mcsExport(c1, "ports")
	s.waitImport(c2, "ports", budgetImport, nil)
	// Creation timestamps have a resolution of one second (ties go to the
	// lower cluster ID): make cluster 2's export the newer one.
	time.Sleep(1100 * time.Millisecond)
	s.mcsService(c2, "ports", func(sp *corev1.ServiceSpec) {
		sp.Ports = []corev1.ServicePort{
			{Name: "http", Port: 81, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
			{Name: "admin", Port: 9090, TargetPort: intstr.FromInt32(9090), Protocol: corev1.ProtocolTCP},
		}
	}, nil, false)
	s.mcsExport(c2, "ports")
	for _, c := range []mcsCluster{c1, c2} {
		s.waitImport(c, "ports", budgetImport, func(si *mcsv1beta1.ServiceImport) error {
			var got []string
			for _, p := range si.Spec.Ports {
				got = append(got, fmt.Sprintf("%s:%d", p.Name, p.Port))
			}
			if !slices.Equal(got, []string{"admin:9090", "http:80"}) {
				return fmt.Errorf("ports %v, want the union admin:9090 http:80 (the oldest export's http)", got)
			}
			return nil
		})
	}
	s.waitConditions(c2, "ports", budgetConditions, map[string]string{"Valid": "True/Valid", "Conflict": "True/PortConflict"})
	s.waitConditions(c1, "ports", budgetConditions, map[string]string{"Conflict": "False/NoConflicts"})
	t.Logf("ports: union by name in both clusters; cluster 2's http:81 gets Conflict=True PortConflict, cluster 1 (oldest) none")

	// 4. Session affinity, internal traffic policy and traffic distribution
	// carried through to the ServiceImport and the derived Service.
	s.mcsService(c1, "sticky", func(sp *corev1.ServiceSpec) {
		sp.SessionAffinity = corev1.ServiceAffinityClientIP
		sp.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptrTo(int32(600))}}
		sp.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicyLocal)
		sp.TrafficDistribution = ptrTo(corev1.ServiceTrafficDistributionPreferSameZone)
	}, []*testbed.Pod{srv1}, false)
	s.mcsExportSpec(c1, "sticky", map[string]any{"exportedLabels": map[string]any{"team": "checkout"}})
	sticky := s.waitImport(c2, "sticky", budgetImport, func(si *mcsv1beta1.ServiceImport) error {
		if si.Labels["team"] != "checkout" {
			return fmt.Errorf("labels %v, want the export's exportedLabels team=checkout", si.Labels)
		}
		if si.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || si.Spec.SessionAffinityConfig == nil ||
			deref(si.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds) != 600 ||
			deref(si.Spec.InternalTrafficPolicy) != corev1.ServiceInternalTrafficPolicyLocal ||
			deref(si.Spec.TrafficDistribution) != corev1.ServiceTrafficDistributionPreferSameZone || len(si.Spec.IPs) == 0 {
			return fmt.Errorf("spec %+v", si.Spec)
		}
		return nil
	})
	d, err := c2.kube.CoreV1().Services(mcsNS).Get(ctx, sticky.Annotations[mirror.AnnotationDerivedService], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || deref(d.Spec.InternalTrafficPolicy) != corev1.ServiceInternalTrafficPolicyLocal ||
		deref(d.Spec.TrafficDistribution) != corev1.ServiceTrafficDistributionPreferSameZone {
		t.Errorf("derived Service of sticky: affinity %s, internal traffic policy %v, traffic distribution %v", d.Spec.SessionAffinity, d.Spec.InternalTrafficPolicy, d.Spec.TrafficDistribution)
	}

	// 5. Headless: no IP, no derived Service, the pod IPs with hostnames.
	s.mcsService(c1, "db", nil, []*testbed.Pod{srv1}, true)
	s.mcsExport(c1, "db")
	db := s.waitImport(c2, "db", budgetImport, func(si *mcsv1beta1.ServiceImport) error {
		if si.Spec.Type != mcsv1beta1.Headless || len(si.Spec.IPs) != 0 || si.Annotations[mirror.AnnotationDerivedService] != "" {
			return fmt.Errorf("type %s ips %v annotations %v", si.Spec.Type, si.Spec.IPs, si.Annotations)
		}
		return nil
	})
	sls := s.waitImportSlices(c2, "db", budgetSlices, map[string][]string{"": {srv1.IP.String()}})
	if h := sls[0].Endpoints[0].Hostname; h == nil || *h != "db-0" {
		t.Errorf("headless endpoint hostname %v, want db-0", h)
	}
	if n := sls[0].Labels[discoveryv1.LabelServiceName]; n != "" {
		t.Errorf("headless import slice has %s=%s: kube-proxy would use it", discoveryv1.LabelServiceName, n)
	}
	t.Logf("headless db: ServiceImport %s without IPs, slice with %s (hostname db-0)", db.Spec.Type, srv1.IP)

	// 6. Type conflict: cluster 2 exports db as a ClusterIP Service (a
	// second later: the newer export).
	time.Sleep(1100 * time.Millisecond)
	s.mcsService(c2, "db", nil, []*testbed.Pod{srv2}, false)
	s.mcsExport(c2, "db")
	s.waitConditions(c2, "db", budgetConditions, map[string]string{"Valid": "True/Valid", "Conflict": "True/TypeConflict"})
	s.waitImport(c2, "db", budgetImport, func(si *mcsv1beta1.ServiceImport) error {
		if si.Spec.Type != mcsv1beta1.Headless {
			return fmt.Errorf("type %s, want the oldest export's Headless", si.Spec.Type)
		}
		return nil
	})

	// 7. ExternalName: Valid=False InvalidServiceType, nothing imported.
	s.mcsService(c1, "ext", func(sp *corev1.ServiceSpec) {
		*sp = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.invalid"}
	}, nil, false)
	s.mcsExport(c1, "ext")
	s.waitConditions(c1, "ext", budgetConditions, map[string]string{"Valid": "False/InvalidServiceType", "Ready": "False/Failed"})

	// 8. An unexported Service: never imported, its name not served.
	s.mcsService(c1, "hidden", nil, []*testbed.Pod{srv1}, false)
	// Meanwhile nothing is rewritten in a steady state (no write loop).
	rvs := func() string {
		si := s.getImport(c2, "sticky")
		d, err := c2.kube.CoreV1().Services(mcsNS).Get(ctx, si.Annotations[mirror.AnnotationDerivedService], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("import %s, derived %s, slices %v", si.ResourceVersion, d.ResourceVersion, s.importSliceNames(c2, "sticky"))
	}
	steady := rvs()
	time.Sleep(3 * time.Second) // what a wrong import would need
	if now := rvs(); now != steady {
		t.Errorf("sticky rewritten in a steady state: %s -> %s", steady, now)
	}
	for _, c := range []mcsCluster{c1, c2} {
		for _, n := range []string{"hidden", "ext"} {
			if _, err := c.dyn.Resource(mirror.ServiceImportGVR).Namespace(mcsNS).Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s: ServiceImport %s exists (%v), want none", c.name, n, err)
			}
		}
	}

	// 9. Metrics of cluster 2's mirror.
	if m, err := b.admin.Exec(ctx, "curl", "-sS", "-m", "3", "http://127.0.0.1:9481/metrics"); err != nil {
		t.Errorf("metrics: %v", err)
	} else {
		for _, want := range []string{"meshd_mcs_service_imports 4", `meshd_mcs_service_exports{condition="Conflict",status="True"} 2`, `meshd_mcs_endpoints{source_cluster=`} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %q:\n%s", want, grepLines(m, "meshd_mcs_"))
			}
		}
		t.Logf("cluster 2's mirror metrics:\n%s", grepLines(m, "meshd_mcs_"))
	}

	// 10. A restart that cannot reach cluster 1 (linkerd2#12499): the new
	// mirror of cluster 2 never deletes what it has not resynced. Then a
	// normal restart.
	stickySlices := s.importSliceNames(c2, "sticky")
	procs["mirror-c2"].Stop(5 * time.Second)
	unreachable := filepath.Join(b.c2.Dir, "unreachable-c1.kubeconfig")
	kcData, err := os.ReadFile(tb.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	bad := serverLine.ReplaceAllString(string(kcData), "${1}https://127.0.0.1:1")
	if bad == string(kcData) {
		t.Fatalf("%s: no server line", tb.Kubeconfig)
	}
	if err := os.WriteFile(unreachable, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	startC2 := func(name, remote string) {
		p, err := b.admin.Start(name, tb.MeshdBinary, "mirror", "--kubeconfig", kc2, "--remote-kubeconfig", remote,
			"--remote-name", "cluster1", "--namespace", testbed.LeaseNamespace, "--leader-elect=false",
			"--mirror-services=false", "--listen", "127.0.0.1:9481", "--log-level", "debug")
		if err != nil {
			t.Fatal(err)
		}
		procs[name] = p
	}
	startC2("mirror-c2-blind", unreachable)
	s.eventually(30*time.Second, 250*time.Millisecond, "the blind mirror of cluster 2 runs its MCS workers", func() error {
		if !strings.Contains(testbed.Tail(procs["mirror-c2-blind"].LogPath, 400), "writing Multi-Cluster Services objects") {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	never := func(d time.Duration, f func() error) {
		t.Helper()
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			if err := f(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	never(10*time.Second, func() error {
		if got := s.importSliceNames(c2, "sticky"); !slices.Equal(got, stickySlices) {
			return fmt.Errorf("cluster 1's slices of sticky changed before cluster 1 resynced: %v -> %v", stickySlices, got)
		}
		for _, n := range []string{"web", "sticky", "ports", "db"} {
			if _, err := c2.dyn.Resource(mirror.ServiceImportGVR).Namespace(mcsNS).Get(ctx, n, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("ServiceImport %s deleted before cluster 1 resynced: %v", n, err)
			}
		}
		// Exported by both clusters: a partial view (cluster 2's alone)
		// would change the ports to http:81 and admin:9090.
		var ports []string
		for _, p := range s.getImport(c2, "ports").Spec.Ports {
			ports = append(ports, fmt.Sprintf("%s:%d", p.Name, p.Port))
		}
		if !slices.Equal(ports, []string{"admin:9090", "http:80"}) {
			return fmt.Errorf("ServiceImport ports changed before cluster 1 resynced: %v", ports)
		}
		return nil
	})
	t.Logf("RESTART without cluster 1: ServiceImports and cluster 1's slices kept for 10s by the new mirror")
	procs["mirror-c2-blind"].Stop(5 * time.Second)
	startC2("mirror-c2-again", tb.Kubeconfig)
	s.waitImportSlices(c2, "sticky", budgetSlices, map[string][]string{"": {srv1.IP.String()}})

	// 11. Unexport web in both clusters: ServiceImport and slices gone
	// within the budgets, in both clusters.
	start = time.Now()
	for _, c := range []mcsCluster{c1, c2} {
		if err := c.dyn.Resource(mirror.ServiceExportGVR).Namespace(mcsNS).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []mcsCluster{c1, c2} {
		s.eventually(budgetSlicesGone, mcsPoll, c.name+": the EndpointSlices of web deleted", func() error {
			l, err := c.kube.DiscoveryV1().EndpointSlices(mcsNS).List(ctx, metav1.ListOptions{LabelSelector: mirror.LabelServiceName + "=web"})
			if err != nil {
				return err
			}
			if len(l.Items) > 0 {
				return fmt.Errorf("%d left", len(l.Items))
			}
			return nil
		})
		s.eventually(budgetImport, mcsPoll, c.name+": the ServiceImport web deleted", func() error {
			_, err := c.dyn.Resource(mirror.ServiceImportGVR).Namespace(mcsNS).Get(ctx, "web", metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
	t.Logf("unexported: ServiceImport and EndpointSlices of web gone in both clusters %s later", time.Since(start).Round(time.Millisecond))
	s.eventually(15*time.Second, 500*time.Millisecond, "the ClusterSetIP of web stops answering", func() error {
		if out, err := client.Exec(ctx, "curl", "-sS", "-m", "1", url); err == nil {
			return fmt.Errorf("%s still answers %q", url, out)
		}
		return nil
	})

	// 12. Stale endpoints expire per the source cluster's liveness data:
	// meshd on srv1's node of cluster 1 dies, its heartbeat Lease stops; the
	// imported endpoint of sticky on that node turns not ready in cluster 2
	// once the Lease is older than its leaseDurationSeconds.
	lease, err := c1.kube.CoordinationV1().Leases(testbed.LeaseNamespace).Get(ctx, "meshd-"+srv1.Node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ttl := time.Duration(deref(lease.Spec.LeaseDurationSeconds)) * time.Second
	start = time.Now()
	// The exit error is SIGKILL's.
	_ = srv1.Node.StopMeshd(syscall.SIGKILL, 5*time.Second)
	if !srv1.Node.Meshd().Exited() {
		t.Fatalf("meshd on %s still runs", srv1.Node.Name)
	}
	s.eventually(ttl+15*time.Second, 250*time.Millisecond, "cluster 2: the imported endpoint of sticky on the dead node not ready", func() error {
		for _, sl := range s.waitImportSlicesAny(c2, "sticky") {
			for _, ep := range sl.Endpoints {
				if slices.Contains(ep.Addresses, srv1.IP.String()) && ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					return nil
				}
			}
		}
		return fmt.Errorf("still ready")
	})
	t.Logf("STALE meshd of %s killed: its imported endpoint not ready in cluster 2 %s later (its Lease lasts %s)", srv1.Node.Name, time.Since(start).Round(time.Millisecond), ttl)
}

// waitImportSlicesAny lists the imported slices of name in c.
func (s *scenario) waitImportSlicesAny(c mcsCluster, name string) []discoveryv1.EndpointSlice {
	l, err := c.kube.DiscoveryV1().EndpointSlices(mcsNS).List(s.ctx, metav1.ListOptions{LabelSelector: mirror.LabelServiceName + "=" + name})
	if err != nil {
		return nil
	}
	return l.Items
}

// importSliceNames are the names of the imported slices of name in c.
func (s *scenario) importSliceNames(c mcsCluster, name string) []string {
	s.t.Helper()
	l, err := c.kube.DiscoveryV1().EndpointSlices(mcsNS).List(s.ctx, metav1.ListOptions{LabelSelector: mirror.LabelServiceName + "=" + name})
	if err != nil {
		s.t.Fatal(err)
	}
	var out []string
	for _, sl := range l.Items {
		out = append(out, sl.Name+"@"+sl.ResourceVersion)
	}
	slices.Sort(out)
	return out
}

var serverLine = regexp.MustCompile(`(?m)^(\s*server: ).*$`)

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// mirrorKubeconfigMain is mirrorKubeconfig for cluster 1 (the main one).
func (s *scenario) mirrorKubeconfigMain() string {
	return s.mirrorKubeconfig(&testbed.Cluster{
		ClusterOptions: testbed.ClusterOptions{Name: "cluster1"}, Dir: tb.Dir, Kubeconfig: tb.Kubeconfig, Token: tb.Token, Kube: tb.Kube,
	})
}

// mcsService creates (or replaces) a Service in c: port http 80 -> 8080,
// edited by edit, with one EndpointSlice of pods (ready, hostnames
// <name>-<i>), headless if asked.
func (s *scenario) mcsService(c mcsCluster, name string, edit func(*corev1.ServiceSpec), pods []*testbed.Pod, headless bool) {
	s.t.Helper()
	ctx := s.ctx
	_ = c.kube.CoreV1().Services(mcsNS).Delete(ctx, name, metav1.DeleteOptions{})
	_ = c.kube.DiscoveryV1().EndpointSlices(mcsNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name + "," + mirrorTestLabel})
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{mirrorTestLabel: mcsTestLabelValue}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP,
		}}},
	}
	if headless {
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	}
	if edit != nil {
		edit(&svc.Spec)
	}
	s.eventually(10*time.Second, 200*time.Millisecond, "creating Service "+name+" in "+c.name, func() error {
		_, err := c.kube.CoreV1().Services(mcsNS).Create(ctx, svc, metav1.CreateOptions{})
		return err
	})
	if len(pods) == 0 {
		return
	}
	pport, pname, proto, ready := int32(8080), "http", corev1.ProtocolTCP, true
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, mirrorTestLabel: mcsTestLabelValue,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &pport, Protocol: &proto}},
	}
	for i, p := range pods {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{p.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName: &p.Node.Name, Hostname: ptrTo(fmt.Sprintf("%s-%d", name, i)),
		})
	}
	if _, err := c.kube.DiscoveryV1().EndpointSlices(mcsNS).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

// mcsExport creates the v1beta1 ServiceExport of name in c.
func (s *scenario) mcsExport(c mcsCluster, name string) {
	s.t.Helper()
	s.mcsExportSpec(c, name, nil)
}

// mcsExportSpec creates the v1beta1 ServiceExport of name in c with spec.
func (s *scenario) mcsExportSpec(c mcsCluster, name string, spec map[string]any) {
	s.t.Helper()
	obj := map[string]any{
		"apiVersion": mirror.ServiceExportGVR.GroupVersion().String(),
		"kind":       "ServiceExport",
		"metadata":   map[string]any{"name": name, "namespace": mcsNS, "labels": map[string]any{mirrorTestLabel: mcsTestLabelValue}},
	}
	if spec != nil {
		obj["spec"] = spec
	}
	_, err := c.dyn.Resource(mirror.ServiceExportGVR).Namespace(mcsNS).Create(s.ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
}

func (s *scenario) getImport(c mcsCluster, name string) *mcsv1beta1.ServiceImport {
	s.t.Helper()
	u, err := c.dyn.Resource(mirror.ServiceImportGVR).Namespace(mcsNS).Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	var si mcsv1beta1.ServiceImport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
		s.t.Fatal(err)
	}
	return &si
}

// waitImport waits (within budget) for the ServiceImport name in c, written
// by meshd, to pass check.
func (s *scenario) waitImport(c mcsCluster, name string, budget time.Duration, check func(*mcsv1beta1.ServiceImport) error) *mcsv1beta1.ServiceImport {
	s.t.Helper()
	var si mcsv1beta1.ServiceImport
	s.eventually(budget, mcsPoll, fmt.Sprintf("%s: ServiceImport %s/%s", c.name, mcsNS, name), func() error {
		u, err := c.dyn.Resource(mirror.ServiceImportGVR).Namespace(mcsNS).Get(s.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
			return err
		}
		if si.Labels["app.kubernetes.io/managed-by"] != "meshd" {
			return fmt.Errorf("not written by meshd: labels %v", si.Labels)
		}
		if check != nil {
			return check(&si)
		}
		return nil
	})
	return &si
}

// waitConditions waits for the conditions (type → "Status/Reason") of the
// ServiceExport name in c.
func (s *scenario) waitConditions(c mcsCluster, name string, budget time.Duration, want map[string]string) {
	s.t.Helper()
	s.eventually(budget, mcsPoll, fmt.Sprintf("%s: conditions %v of ServiceExport %s", c.name, want, name), func() error {
		u, err := c.dyn.Resource(mirror.ServiceExportGVR).Namespace(mcsNS).Get(s.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var se mcsv1beta1.ServiceExport
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &se); err != nil {
			return err
		}
		for typ, sr := range want {
			cd := meta.FindStatusCondition(se.Status.Conditions, typ)
			if cd == nil || string(cd.Status)+"/"+cd.Reason != sr {
				return fmt.Errorf("%s: %+v", typ, cd)
			}
		}
		return nil
	})
}

// clustersetName checks the import's name end to end in cluster c:
// `meshd dns`, run on node as its manifest's ServiceAccount, answers
// <name>.<ns>.svc.clusterset.local with the ClusterSetIP the mirror gave the
// ServiceImport si, and a pod of node fetches want from the address of that
// answer (through kube-proxy and the derived Service).
func (s *scenario) clustersetName(c *testbed.Cluster, node *testbed.Node, si *mcsv1beta1.ServiceImport, want string) {
	s.t.Helper()
	var ip string
	for _, a := range si.Spec.IPs {
		if !strings.Contains(a, ":") {
			ip = a
			break
		}
	}
	if ip == "" {
		s.t.Fatalf("ServiceImport %s/%s has no IPv4 ClusterSetIP: %v", si.Namespace, si.Name, si.Spec.IPs)
	}
	manifest := filepath.Join(tb.RepoRoot, "manifests", "components", "mcs-dns", "mcs-dns.yaml")
	if out, err := c.Kubectl(s.ctx, "apply", "-f", manifest); err != nil {
		s.t.Fatalf("applying %s to cluster %s: %v\n%s", manifest, c.Name, err, out)
	}
	kc := s.serviceAccountKubeconfigIn(c.Kube, c.Kubeconfig, c.Token, c.Dir, "meshd-mcs-dns")
	server := node.PodCIDR.Addr().Next().String() // the pods' gateway
	proc := s.startMCSDNS(node, kc, server)
	defer proc.Stop(5 * time.Second)
	name := si.Name + "." + si.Namespace + ".svc.clusterset.local."
	s.digEventually(pod(node), server, 30*time.Second, []string{name, "A"}, "NOERROR", name+" 5 A "+ip)
	ans := s.dig(pod(node), server, name, "A")
	url := fmt.Sprintf("http://%s:80/", strings.Fields(ans.answer[0])[3])
	s.httpEventually(pod(node), url, want, 30*time.Second)
	s.t.Logf("meshd dns in cluster %s answers %s with the ServiceImport's ClusterSetIP %s; a pod fetches %q from it", c.Name, name, ip, want)
}

// clusterID is c's ClusterProperty cluster.clusterset.k8s.io, read as
// version.
func (s *scenario) clusterID(c mcsCluster, version string) string {
	s.t.Helper()
	gvr := mirror.ClusterPropertyGVR
	gvr.Version = version
	u, err := c.dyn.Resource(gvr).Get(s.ctx, mirror.ClusterIDProperty, metav1.GetOptions{})
	if err != nil {
		s.t.Errorf("%s: reading ClusterProperty %s as %s: %v", c.name, mirror.ClusterIDProperty, version, err)
		return ""
	}
	v, _, _ := unstructured.NestedString(u.Object, "spec", "value")
	return v
}

// waitImportSlices waits until the imported slices of name in c hold
// exactly the addresses want[""] (any source cluster), each slice labelled
// with a source cluster, not managed by the endpointslice controller, owned
// by the ServiceImport.
func (s *scenario) waitImportSlices(c mcsCluster, name string, budget time.Duration, want map[string][]string) []discoveryv1.EndpointSlice {
	s.t.Helper()
	var items []discoveryv1.EndpointSlice
	s.eventually(budget, mcsPoll, fmt.Sprintf("%s: imported EndpointSlices of %s with %v", c.name, name, want[""]), func() error {
		l, err := c.kube.DiscoveryV1().EndpointSlices(mcsNS).List(s.ctx, metav1.ListOptions{LabelSelector: mirror.LabelServiceName + "=" + name})
		if err != nil {
			return err
		}
		var addrs []string
		for _, sl := range l.Items {
			if sl.Labels[mirror.LabelSourceCluster] == "" || sl.Labels[discoveryv1.LabelManagedBy] == "endpointslice-controller.k8s.io" ||
				len(sl.OwnerReferences) != 1 || sl.OwnerReferences[0].Kind != "ServiceImport" || sl.OwnerReferences[0].Name != name {
				return fmt.Errorf("slice %s: labels %v owners %v", sl.Name, sl.Labels, sl.OwnerReferences)
			}
			for _, ep := range sl.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					addrs = append(addrs, ep.Addresses...)
				}
			}
		}
		slices.Sort(addrs)
		w := slices.Clone(want[""])
		slices.Sort(w)
		if !slices.Equal(addrs, w) {
			return fmt.Errorf("ready addresses %v", addrs)
		}
		items = l.Items
		return nil
	})
	return items
}

// mcsCleanup deletes the scenario's objects from cluster 1 (which outlives
// it): exports first, then what a mirror wrote, then the Services.
func (s *scenario) mcsCleanup(c mcsCluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: mirrorTestLabel}
	_ = c.dyn.Resource(mirror.ServiceExportGVR).Namespace(mcsNS).DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	_ = c.dyn.Resource(mirror.ServiceImportGVR).Namespace(mcsNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	meshd := metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=meshd"}
	_ = c.kube.DiscoveryV1().EndpointSlices(mcsNS).DeleteCollection(ctx, metav1.DeleteOptions{}, meshd)
	_ = c.kube.DiscoveryV1().EndpointSlices(mcsNS).DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	for _, l := range []metav1.ListOptions{sel, meshd} {
		if svcs, err := c.kube.CoreV1().Services(mcsNS).List(ctx, l); err == nil {
			for _, sv := range svcs.Items {
				_ = c.kube.CoreV1().Services(mcsNS).Delete(ctx, sv.Name, metav1.DeleteOptions{})
			}
		}
	}
}
