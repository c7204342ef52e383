//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/mirror"
)

// ServiceExportGVR is the Multi-Cluster Services API's ServiceExport.
var serviceExportGVR = schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1alpha1", Resource: "serviceexports"}

const (
	// mirrorNS is the namespace of the exported Services in cluster 1. It
	// does not exist in cluster 2: the mirror creates it. Cluster 1 outlives
	// the scenario and has no namespace controller, so the namespace stays
	// and only the objects labelled mirrorTestLabel are deleted.
	mirrorNS        = "shop"
	mirrorBulkNS    = "bulk"
	mirrorTestLabel = "e2e.meshd.io/mirror-test"
	// mirrorRemote is cluster 1's name in cluster 2's link (linkCmd).
	mirrorRemote = "cluster1"
	// mirrorBulk is how many exported Services the bulk step creates.
	mirrorBulk = 60
)

// Service mirroring (docs/service-mirroring.md) between two clusters linked
// with `meshctl link`, a real kube-proxy on every node. `meshd mirror` runs
// for cluster 2 on the admin host (it only talks to the two API servers), in
// link mode, with leader election, as the ServiceAccount of
// manifests/components/mirror (least-privilege RBAC of the manifests), and
// reads cluster 1 through the link Secret's credentials (the link reader
// ClusterRole of meshctl link). Then:
//
//   - cluster 1 exports important-service (Service + EndpointSlice to an
//     HTTP pod + ServiceExport): cluster 2 gets a selector-less Service of
//     that name whose EndpointSlice points at cluster 1's cluster IP, and a
//     cluster 2 pod fetches the mirror's cluster IP through kube-proxy;
//   - the remote port changes: the mirror follows (timed), the new port
//     answers;
//   - a local Service already has the name of an export: MirrorNameClash
//     Event, the local Service untouched; once it is deleted, the mirror
//     appears;
//   - a headless Service mirrors headless, with the remote pod IPs;
//   - deleting the export deletes the mirror;
//   - bulk: mirrorBulk exports at once, then all their ports at once
//     (p50/p99 of the propagation).
func TestMultiClusterMirror(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	b := s.twoClusters(true)
	c1dyn := tb.Dynamic
	for _, ns := range []string{mirrorNS, mirrorBulkNS} {
		s.mirrorCleanupRemote(ns) // leftovers of an interrupted run
	}
	t.Cleanup(func() {
		for _, ns := range []string{mirrorNS, mirrorBulkNS} {
			s.mirrorCleanupRemote(ns)
		}
		// Cluster 1 outlives the scenario: take the link back out of it.
		if b.admin != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := b.admin.Exec(cctx, append(append([]string{"env"}, s.adminHost(b)...), "bash", "-c", unlinkCmd)...)
			if err != nil {
				t.Logf("cleanup: %s: %v\n%s", unlinkCmd, err, out)
			}
		}
	})

	start := time.Now()
	s.link(b)
	s.crossPing(b, 60*time.Second)
	t.Logf("linked: all cross-cluster pod pairs ping %s after linking", time.Since(start).Round(time.Millisecond))

	// The mirror's ServiceAccount and RBAC from the manifests (the
	// Deployment is applied too; without a controller manager it never
	// runs), and a kubeconfig with a token of that ServiceAccount.
	if out, err := b.c2.Kubectl(ctx, "apply", "-f", filepath.Join(tb.RepoRoot, "manifests", "components", "mirror", "mirror.yaml")); err != nil {
		t.Fatalf("applying manifests/components/mirror/mirror.yaml to cluster 2: %v\n%s", err, out)
	}
	kc := s.mirrorKubeconfig(b.c2)
	proc, err := b.admin.Start("mirror", tb.MeshdBinary, "mirror",
		"--kubeconfig", kc, "--namespace", testbed.LeaseNamespace,
		"--listen", "127.0.0.1:9478", "--log-level", "debug")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("E2E_DIAG") != "" {
			t.Logf("----- meshd mirror log (last 60 lines)\n%s", testbed.Tail(proc.LogPath, 60))
		}
	})
	s.eventually(30*time.Second, 250*time.Millisecond, "meshd mirror holds the Lease meshd-mirror in cluster 2", func() error {
		if proc.Exited() {
			return fmt.Errorf("meshd mirror exited: %v\n%s", proc.Err(), testbed.Tail(proc.LogPath, 20))
		}
		l, err := b.c2.Kube.CoordinationV1().Leases(testbed.LeaseNamespace).Get(ctx, "meshd-mirror", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return fmt.Errorf("Lease has no holder")
		}
		return nil
	})
	s.eventually(30*time.Second, 250*time.Millisecond, "meshd mirror watches the link to cluster1", func() error {
		log := testbed.Tail(proc.LogPath, 200)
		if !strings.Contains(log, "mirroring linked clusters") {
			return fmt.Errorf("not in link mode yet")
		}
		if strings.Contains(log, "cannot watch a remote cluster") {
			return fmt.Errorf("the link's credentials cannot watch cluster 1:\n%s", log)
		}
		return nil
	})

	// 1. Export important-service in cluster 1.
	server, other := pod(b.one[1]), pod(b.one[0])
	const text = "important answer from cluster 1"
	if _, err := server.Start("http", tb.ToolBinary, "http", "0.0.0.0:8080", text); err != nil {
		t.Fatal(err)
	}
	ensureNamespace(ctx, t, tb.Kube, mirrorNS)
	start = time.Now()
	src := s.exportService(tb.Kube, c1dyn, mirrorNS, "important-service", 80, []*testbed.Pod{server}, false)
	var mip string
	s.eventually(30*time.Second, 100*time.Millisecond, "the mirror of important-service in cluster 2", func() error {
		m, err := s.checkMirror(b.c2.Kube, mirrorNS, "important-service", 80, []string{src.Spec.ClusterIP})
		if err != nil {
			return err
		}
		mip = m.Spec.ClusterIP
		return nil
	})
	t.Logf("mirror %s/important-service = %s:80 -> %s:80 in cluster 2, %s after the Service, EndpointSlice and ServiceExport were created in cluster 1", mirrorNS, mip, src.Spec.ClusterIP, time.Since(start).Round(time.Millisecond))
	s.httpEventually(other, fmt.Sprintf("http://%s:80/", src.Spec.ClusterIP), text, 30*time.Second)
	start = time.Now()
	for _, n := range b.two {
		s.httpEventually(pod(n), fmt.Sprintf("http://%s:80/", mip), text, 60*time.Second)
	}
	t.Logf("cluster 2's pods fetch the mirror's cluster IP (kube-proxy -> cluster 1's cluster IP over the mesh) %s after the mirror appeared", time.Since(start).Round(time.Millisecond))

	// 2. Port changes: the mirror follows. The first one is also fetched on
	// the new port; then 10 more are only timed.
	var lat []time.Duration
	lastPort := int32(80)
	for i, port := range []int32{8081, 8082, 8083, 8084, 8085, 8086, 8087, 8088, 8089, 8090, 8091} {
		d := s.changePortAndWait(tb.Kube, b.c2.Kube, mirrorNS, "important-service", port, src.Spec.ClusterIP)
		lat = append(lat, d)
		lastPort = port
		if i == 0 {
			t.Logf("remote port 80 -> %d: mirror Service and EndpointSlice updated %s after the remote update", port, d.Round(time.Millisecond))
			start := time.Now()
			for _, n := range b.two {
				s.httpEventually(pod(n), fmt.Sprintf("http://%s:%d/", mip, port), text, 60*time.Second)
			}
			t.Logf("the new port %d answers from cluster 2's pods %s later", port, time.Since(start).Round(time.Millisecond))
			if out, err := pod(b.two[0]).Exec(ctx, "curl", "-sS", "-m", "2", fmt.Sprintf("http://%s:80/", mip)); err == nil {
				t.Errorf("the old port 80 of the mirror still answers: %q", out)
			}
		}
	}
	p50, p99, worst := percentiles(lat)
	t.Logf("PROPAGATION remote port change -> local mirror (Service + EndpointSlice) updated, %d changes one after the other, polled every 5ms: p50 %s, p99 %s, max %s",
		len(lat), p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond))
	// The mirror's own view (remote informer event -> local write done).
	if m, err := b.admin.Exec(ctx, "curl", "-sS", "-m", "3", "http://127.0.0.1:9478/metrics"); err != nil {
		t.Errorf("mirror metrics: %v", err)
	} else {
		t.Logf("mirror metrics:\n%s", grepLines(m, "meshd_mirror_propagation_seconds_sum", "meshd_mirror_propagation_seconds_count", "meshd_mirror_services", "meshd_mirror_remote_cluster_reachable", "meshd_mirror_sync_errors_total"))
	}

	// 3. A name clash: a local Service of cluster 2 first, then the export.
	ensureNamespace(ctx, t, b.c2.Kube, mirrorNS)
	local, err := b.c2.Kube.CoreV1().Services(mirrorNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "clash-service", Labels: map[string]string{"owner": "cluster2-team"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Port: 9999, TargetPort: intstr.FromInt32(9999), Protocol: corev1.ProtocolTCP,
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clashSrc := s.exportService(tb.Kube, c1dyn, mirrorNS, "clash-service", 80, []*testbed.Pod{server}, false)
	start = time.Now()
	s.eventually(30*time.Second, 250*time.Millisecond, "a MirrorNameClash Event on cluster 2's clash-service", func() error {
		evs, err := b.c2.Kube.CoreV1().Events(mirrorNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=clash-service"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == mirror.EventReasonClash {
				t.Logf("Event %s/%s on %s/%s: %s", e.Type, e.Reason, e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Message)
				return nil
			}
		}
		return fmt.Errorf("%d Events, none %s", len(evs.Items), mirror.EventReasonClash)
	})
	t.Logf("clash reported %s after the export", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Second) // give a wrong write the time to happen
	now, err := b.c2.Kube.CoreV1().Services(mirrorNS).Get(ctx, "clash-service", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.ResourceVersion != local.ResourceVersion || now.UID != local.UID || now.Labels[mirror.LabelMirroredFromCluster] != "" ||
		len(now.Spec.Ports) != 1 || now.Spec.Ports[0].Port != 9999 {
		t.Errorf("the local clash-service was changed: resourceVersion %s -> %s, labels %v, ports %v", local.ResourceVersion, now.ResourceVersion, now.Labels, now.Spec.Ports)
	}
	if sl, err := b.c2.Kube.DiscoveryV1().EndpointSlices(mirrorNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=clash-service"}); err != nil {
		t.Fatal(err)
	} else if len(sl.Items) > 0 {
		t.Errorf("EndpointSlices were created for the local clash-service: %d", len(sl.Items))
	}
	if m, err := b.admin.Exec(ctx, "curl", "-sS", "-m", "3", "http://127.0.0.1:9478/metrics"); err == nil {
		if !strings.Contains(m, `meshd_mirror_clashes{cluster="cluster1"} 1`) {
			t.Errorf("meshd_mirror_clashes: %s", grepLines(m, "meshd_mirror_clashes"))
		}
	}
	// The local Service goes: the mirror takes the name.
	if err := b.c2.Kube.CoreV1().Services(mirrorNS).Delete(ctx, "clash-service", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	s.eventually(30*time.Second, 100*time.Millisecond, "the mirror of clash-service once the local one is gone", func() error {
		_, err := s.checkMirror(b.c2.Kube, mirrorNS, "clash-service", 80, []string{clashSrc.Spec.ClusterIP})
		return err
	})
	t.Logf("local clash-service deleted: the mirror took its name %s later", time.Since(start).Round(time.Millisecond))

	// 4. Headless: mirrored headless, with the remote pod IPs.
	hsrc := s.exportService(tb.Kube, c1dyn, mirrorNS, "db", 8080, []*testbed.Pod{server, other}, true)
	s.eventually(30*time.Second, 100*time.Millisecond, "the headless mirror of db", func() error {
		_, err := s.checkMirror(b.c2.Kube, mirrorNS, "db", 8080, []string{server.IP.String(), other.IP.String()})
		return err
	})
	t.Logf("headless %s/db (clusterIP %s) mirrored headless with endpoints %s, %s", mirrorNS, hsrc.Spec.ClusterIP, server.IP, other.IP)
	s.httpEventually(pod(b.two[0]), fmt.Sprintf("http://%s:8080/", server.IP), text, 30*time.Second)

	// 5. Deleting the export deletes the mirror (Service and slices).
	start = time.Now()
	if err := c1dyn.Resource(serviceExportGVR).Namespace(mirrorNS).Delete(ctx, "important-service", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.eventually(30*time.Second, 50*time.Millisecond, "the mirror of important-service deleted", func() error {
		_, err := b.c2.Kube.CoreV1().Services(mirrorNS).Get(ctx, "important-service", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("Get: %v", err)
		}
		sl, err := b.c2.Kube.DiscoveryV1().EndpointSlices(mirrorNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=important-service"})
		if err != nil {
			return err
		}
		if len(sl.Items) > 0 {
			return fmt.Errorf("%d EndpointSlices left", len(sl.Items))
		}
		return nil
	})
	t.Logf("export deleted: mirror Service and EndpointSlices gone %s later", time.Since(start).Round(time.Millisecond))
	// kube-proxy drops the rules at its next sync (at most 1s apart).
	s.eventually(15*time.Second, 500*time.Millisecond, "the deleted mirror's cluster IP stops answering", func() error {
		if out, err := pod(b.two[0]).Exec(ctx, "curl", "-sS", "-m", "1", fmt.Sprintf("http://%s:%d/", mip, lastPort)); err == nil {
			return fmt.Errorf("%s:%d still answers %q", mip, lastPort, out)
		}
		return nil
	})

	// 6. Bulk.
	s.mirrorBulk(b)
	// Client-side throttling of the mirror's API clients (client-go logs
	// the waits longer than 1s).
	var throttled []string
	for _, l := range strings.Split(testbed.Tail(proc.LogPath, 100000), "\n") {
		if strings.Contains(l, "client-side throttling") {
			throttled = append(throttled, l)
		}
	}
	t.Logf("meshd mirror logged %d client-side throttling waits%s", len(throttled), func() string {
		if len(throttled) == 0 {
			return ""
		}
		return ", e.g.\n" + strings.Join(throttled[:min(len(throttled), 3)], "\n")
	}())
	if m, err := b.admin.Exec(ctx, "curl", "-sS", "-m", "3", "http://127.0.0.1:9478/metrics"); err == nil {
		t.Logf("mirror metrics at the end:\n%s", grepLines(m, "meshd_mirror_propagation_seconds", "meshd_mirror_services", "meshd_mirror_clashes", "meshd_mirror_sync_errors_total"))
	}
}

// mirrorKubeconfig writes a kubeconfig for cluster c authenticating as the
// ServiceAccount meshd-system/meshd-mirror of the manifests.
func (s *scenario) mirrorKubeconfig(c *testbed.Cluster) string {
	s.t.Helper()
	return s.saKubeconfig(c.Kube, c.Kubeconfig, c.Token, filepath.Join(c.Dir, "mirror.kubeconfig"), "meshd-mirror")
}

// saKubeconfig writes to path the admin kubeconfig adminKubeconfig (whose
// token is adminToken) with a one-hour token of ServiceAccount sa of
// LeaseNamespace instead: what a Deployment of that ServiceAccount gets.
func (s *scenario) saKubeconfig(kube kubernetes.Interface, adminKubeconfig, adminToken, path, sa string) string {
	s.t.Helper()
	exp := int64(3600)
	tr, err := kube.CoreV1().ServiceAccounts(testbed.LeaseNamespace).CreateToken(s.ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("token of ServiceAccount %s (%s): %v", sa, adminKubeconfig, err)
	}
	admin, err := os.ReadFile(adminKubeconfig)
	if err != nil {
		s.t.Fatal(err)
	}
	kc := strings.Replace(string(admin), "user: {token: "+adminToken+"}", "user: {token: "+tr.Status.Token+"}", 1)
	if kc == string(admin) {
		s.t.Fatalf("%s: no admin token to replace", adminKubeconfig)
	}
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

func ensureNamespace(ctx context.Context, t *testing.T, kube kubernetes.Interface, name string) {
	t.Helper()
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// exportService creates in cluster 1 a selector-less Service (port ->
// targetPort 8080, headless if asked) with one EndpointSlice of the pods
// (ready, port 8080), and a ServiceExport of it.
func (s *scenario) exportService(kube kubernetes.Interface, dyn dynamic.Interface, ns, name string, port int32, pods []*testbed.Pod, headless bool) *corev1.Service {
	s.t.Helper()
	ctx := s.ctx
	labels := map[string]string{mirrorTestLabel: "true"}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Port: port, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP,
		}}},
	}
	if headless {
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	}
	svc, err := kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if len(pods) > 0 {
		ready := true
		pport, pname, proto := int32(8080), "http", corev1.ProtocolTCP
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{
				discoveryv1.LabelServiceName: name, mirrorTestLabel: "true",
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &pport, Protocol: &proto}},
		}
		for i, p := range pods {
			ep := discoveryv1.Endpoint{
				Addresses: []string{p.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				NodeName: &p.Node.Name,
			}
			if headless {
				ep.Hostname = ptrTo(fmt.Sprintf("%s-%d", name, i))
			}
			sl.Endpoints = append(sl.Endpoints, ep)
		}
		if _, err := kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := createExport(ctx, dyn, ns, name); err != nil {
		s.t.Fatal(err)
	}
	return svc
}

func createExport(ctx context.Context, dyn dynamic.Interface, ns, name string) error {
	_, err := dyn.Resource(serviceExportGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1alpha1",
		"kind":       "ServiceExport",
		"metadata":   map[string]any{"name": name, "namespace": ns, "labels": map[string]any{mirrorTestLabel: "true"}},
	}}, metav1.CreateOptions{})
	return err
}

func ptrTo[T any](v T) *T { return &v }

// checkMirror returns the mirror ns/name of cluster 1's Service if it is
// meshd's mirror from cluster1, selector-less, with port port (target the
// same) and ready endpoints exactly addrs on port port (the remote cluster
// IP; for a headless one the remote pod IPs, port the pods' 8080).
func (s *scenario) checkMirror(kube kubernetes.Interface, ns, name string, port int32, addrs []string) (*corev1.Service, error) {
	m, err := kube.CoreV1().Services(ns).Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if m.Labels[mirror.LabelMirroredFromCluster] != mirrorRemote || m.Annotations[mirror.AnnotationMirroredFrom] != ns+"/"+name {
		return nil, fmt.Errorf("Service %s/%s is not the mirror of %s/%s from %s: labels %v, annotations %v", ns, name, ns, name, mirrorRemote, m.Labels, m.Annotations)
	}
	if len(m.Spec.Selector) > 0 {
		return nil, fmt.Errorf("mirror has a selector %v", m.Spec.Selector)
	}
	if len(m.Spec.Ports) != 1 || m.Spec.Ports[0].Port != port || m.Spec.Ports[0].TargetPort.IntValue() != int(port) {
		return nil, fmt.Errorf("mirror ports %v, want %d -> %d", m.Spec.Ports, port, port)
	}
	var got []string
	sls, err := kube.DiscoveryV1().EndpointSlices(ns).List(s.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil, err
	}
	for _, sl := range sls.Items {
		if sl.Labels[discoveryv1.LabelManagedBy] != mirror.ManagedByMirror {
			return nil, fmt.Errorf("EndpointSlice %s managed by %q", sl.Name, sl.Labels[discoveryv1.LabelManagedBy])
		}
		if len(sl.Ports) != 1 || sl.Ports[0].Port == nil || *sl.Ports[0].Port != port {
			return nil, fmt.Errorf("EndpointSlice %s ports %v, want %d", sl.Name, sl.Ports, port)
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready == nil || !*ep.Conditions.Ready {
				return nil, fmt.Errorf("EndpointSlice %s: endpoint %v not ready", sl.Name, ep.Addresses)
			}
			got = append(got, ep.Addresses...)
		}
	}
	sort.Strings(got)
	want := slices.Clone(addrs)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		return nil, fmt.Errorf("mirror endpoints %v, want %v", got, want)
	}
	return m, nil
}

// changePortAndWait changes the port of cluster 1's Service ns/name and
// returns the time until cluster 2's mirror Service and its EndpointSlice
// both have it (polling every 5 ms).
func (s *scenario) changePortAndWait(remote, local kubernetes.Interface, ns, name string, port int32, clusterIP string) time.Duration {
	s.t.Helper()
	svc, err := remote.CoreV1().Services(ns).Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	svc.Spec.Ports[0].Port = port
	start := time.Now()
	if _, err := remote.CoreV1().Services(ns).Update(s.ctx, svc, metav1.UpdateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	if err := poll(s.ctx, 30*time.Second, 5*time.Millisecond, func() error {
		_, err := s.checkMirror(local, ns, name, port, []string{clusterIP})
		return err
	}); err != nil {
		s.t.Fatalf("mirror of %s/%s does not follow the port change to %d: %v", ns, name, port, err)
	}
	return time.Since(start)
}

// mirrorBulk exports mirrorBulk Services at once (no endpoints: their
// mirrors are not ready, which is enough here), then changes all their
// ports at once, and logs p50/p99 from each remote write to the local
// mirror's (watched) update.
func (s *scenario) mirrorBulk(b *mcBed) {
	t, ctx := s.t, s.ctx
	ensureNamespace(ctx, t, tb.Kube, mirrorBulkNS)
	names := make([]string, mirrorBulk)
	for i := range names {
		names[i] = fmt.Sprintf("svc-%03d", i)
	}
	w := s.watchMirrors(b.c2.Kube, mirrorBulkNS)
	defer w.stop()

	// Create: Service then ServiceExport, 8 in parallel.
	created := make([]time.Time, len(names))
	begin := time.Now()
	parallel(len(names), 8, func(i int) {
		_, err := tb.Kube.CoreV1().Services(mirrorBulkNS).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{mirrorTestLabel: "true"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
				Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP,
			}}},
		}, metav1.CreateOptions{})
		if err == nil {
			err = createExport(ctx, tb.Dynamic, mirrorBulkNS, names[i])
		}
		created[i] = time.Now()
		if err != nil {
			t.Error(err)
		}
	})
	writes := time.Since(begin)
	seen := w.wait(t, names, 80, 60*time.Second)
	all := time.Since(begin)
	var lat []time.Duration
	for i, n := range names {
		lat = append(lat, seen[n].Sub(created[i]))
	}
	p50, p99, worst := percentiles(lat)
	t.Logf("BULK %d exports created in %s (8 parallel writers); all mirrored %s after the first write; per export (ServiceExport created -> mirror Service seen): p50 %s, p99 %s, max %s",
		len(names), writes.Round(time.Millisecond), all.Round(time.Millisecond), p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond))

	// Port change on all of them at once.
	updated := make([]time.Time, len(names))
	begin = time.Now()
	parallel(len(names), 8, func(i int) {
		svc, err := tb.Kube.CoreV1().Services(mirrorBulkNS).Get(ctx, names[i], metav1.GetOptions{})
		if err == nil {
			svc.Spec.Ports[0].Port = 81
			_, err = tb.Kube.CoreV1().Services(mirrorBulkNS).Update(ctx, svc, metav1.UpdateOptions{})
		}
		updated[i] = time.Now()
		if err != nil {
			t.Error(err)
		}
	})
	writes = time.Since(begin)
	seen = w.wait(t, names, 81, 60*time.Second)
	all = time.Since(begin)
	lat = lat[:0]
	for i, n := range names {
		lat = append(lat, seen[n].Sub(updated[i]))
	}
	p50, p99, worst = percentiles(lat)
	t.Logf("BULK %d remote port changes in %s; all mirrors updated %s after the first write; per Service (remote update returned -> mirror Service updated): p50 %s, p99 %s, max %s",
		len(names), writes.Round(time.Millisecond), all.Round(time.Millisecond), p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond))

	// Unexport all: the mirrors go.
	begin = time.Now()
	parallel(len(names), 8, func(i int) {
		if err := tb.Dynamic.Resource(serviceExportGVR).Namespace(mirrorBulkNS).Delete(ctx, names[i], metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})
	s.eventually(60*time.Second, 100*time.Millisecond, "all bulk mirrors deleted", func() error {
		l, err := b.c2.Kube.CoreV1().Services(mirrorBulkNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d mirrors left", len(l.Items))
		}
		return nil
	})
	t.Logf("BULK %d exports deleted: all mirrors gone %s after the first delete", len(names), time.Since(begin).Round(time.Millisecond))
}

// mirrorWatch records, per Service name of one namespace of the local
// cluster, the first time a mirror with each first port was seen (an
// informer, so a closed watch is resumed).
type mirrorWatch struct {
	mu   sync.Mutex
	seen map[string]map[int32]time.Time
	stop func()
}

func (s *scenario) watchMirrors(kube kubernetes.Interface, ns string) *mirrorWatch {
	s.t.Helper()
	mw := &mirrorWatch{seen: map[string]map[int32]time.Time{}}
	record := func(o any) {
		now := time.Now()
		svc, ok := o.(*corev1.Service)
		if !ok || len(svc.Spec.Ports) == 0 || svc.Labels[mirror.LabelMirroredFromCluster] == "" {
			return
		}
		mw.mu.Lock()
		defer mw.mu.Unlock()
		if mw.seen[svc.Name] == nil {
			mw.seen[svc.Name] = map[int32]time.Time{}
		}
		if _, ok := mw.seen[svc.Name][svc.Spec.Ports[0].Port]; !ok {
			mw.seen[svc.Name][svc.Spec.Ports[0].Port] = now
		}
	}
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Services().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, o any) { record(o) },
	}); err != nil {
		s.t.Fatal(err)
	}
	stop := make(chan struct{})
	f.Start(stop)
	if !cache.WaitForCacheSync(s.ctx.Done(), inf.HasSynced) {
		close(stop)
		s.t.Fatal("the informer on the mirrors did not sync")
	}
	mw.stop = func() { close(stop); f.Shutdown() }
	return mw
}

// wait returns when every name was seen with port.
func (mw *mirrorWatch) wait(t *testing.T, names []string, port int32, timeout time.Duration) map[string]time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		mw.mu.Lock()
		out := map[string]time.Time{}
		for _, n := range names {
			if at, ok := mw.seen[n][port]; ok {
				out[n] = at
			}
		}
		mw.mu.Unlock()
		if len(out) == len(names) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d mirrors with port %d after %s", len(out), len(names), port, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// parallel runs f(0..n-1) on workers goroutines.
func parallel(n, workers int, f func(i int)) {
	ch := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				f(i)
			}
		}()
	}
	for i := range n {
		ch <- i
	}
	close(ch)
	wg.Wait()
}

// percentiles are the p50, p99 and max of ds (nearest rank).
func percentiles(ds []time.Duration) (p50, p99, worst time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return rank(0.50), rank(0.99), s[len(s)-1]
}

// grepLines returns the lines of text starting with one of the prefixes
// (metrics: no HELP/TYPE comments).
func grepLines(text string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// mirrorCleanupRemote deletes what this scenario created in cluster 1's
// namespace ns (ServiceExports, Services, EndpointSlices labelled
// mirrorTestLabel); cluster 1 outlives the scenario.
func (s *scenario) mirrorCleanupRemote(ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: mirrorTestLabel + "=true"}
	if err := tb.Dynamic.Resource(serviceExportGVR).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil && !apierrors.IsNotFound(err) {
		s.t.Logf("cleanup: ServiceExports of %s: %v", ns, err)
	}
	if err := tb.Kube.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil && !apierrors.IsNotFound(err) {
		s.t.Logf("cleanup: EndpointSlices of %s: %v", ns, err)
	}
	l, err := tb.Kube.CoreV1().Services(ns).List(ctx, sel)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			s.t.Logf("cleanup: Services of %s: %v", ns, err)
		}
		return
	}
	parallel(len(l.Items), 8, func(i int) {
		if err := tb.Kube.CoreV1().Services(ns).Delete(ctx, l.Items[i].Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			s.t.Logf("cleanup: Service %s/%s: %v", ns, l.Items[i].Name, err)
		}
	})
}
