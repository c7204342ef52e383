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

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/mcsdns"
)

const mcsDNSNamespace = "mcsdns"

// `meshd dns` (docs/mcs-dns.md) against the testbed's real API server, as
// the ServiceAccount of manifests/components/mcs-dns (list/watch of
// ServiceImports and EndpointSlices only), inside a node's network
// namespace, queried with dig from a pod of that node. The ServiceImports
// and EndpointSlices are written here the way the MCS controller writes
// them (v1beta1; slices labelled service-name and source-cluster):
//
//   - a dual-stack ClusterSetIP import: A, AAAA, SRV of a named port, TCP;
//   - a headless import with slices of two clusters (one dual-stack pod
//     with a hostname, one without, one not ready): A, AAAA, SRV targets,
//     <hostname>.<cluster> names; the not-ready one never answers;
//   - NXDOMAIN and NODATA with the SOA, REFUSED outside the zone;
//   - the answers follow changes: the ClusterSetIP moves, an endpoint turns
//     not ready, a cluster's slice goes, the import goes (NXDOMAIN);
//   - /readyz, and meshd_dns_requests_total by rcode.
func TestMCSDNS(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.ensureServiceImportCRD()
	s.location("a", false)
	n := s.node(testbed.NodeOptions{Name: "dns1", Location: "a"})
	client := pod(n)
	s.mcsDNSCleanup()
	t.Cleanup(s.mcsDNSCleanup)

	if out, err := tb.Kubectl(ctx, "apply", "-f", filepath.Join(tb.RepoRoot, "manifests", "components", "mcs-dns", "mcs-dns.yaml")); err != nil {
		t.Fatalf("applying manifests/components/mcs-dns: %v\n%s", err, out)
	}
	ensureNamespace(ctx, t, tb.Kube, mcsDNSNamespace)

	// Objects before the server starts (the initial list) and after (watch).
	s.putImport("web", mcsv1beta1.ClusterSetIP, []string{"10.96.200.10", "fd00:96::10"}, mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80})

	kc := s.serviceAccountKubeconfig("meshd-mcs-dns")
	dnsIP := n.PodCIDR.Addr().Next() // cni0 of the node: the pod's gateway
	server := dnsIP.String()
	start := time.Now()
	proc := s.startMCSDNS(n, kc, server, "--log-level", "debug")
	t.Logf("meshd dns ready (caches synced) %s after start", time.Since(start).Round(time.Millisecond))
	dig := func(args ...string) digResult { return s.dig(client, server, args...) }

	// ClusterSetIP.
	const web = "web." + mcsDNSNamespace + ".svc.clusterset.local."
	dig(web, "A").want(t, "NOERROR", web+" 5 A 10.96.200.10")
	dig(web, "AAAA").want(t, "NOERROR", web+" 5 AAAA fd00:96::10")
	dig("+tcp", web, "A").want(t, "NOERROR", web+" 5 A 10.96.200.10")
	dig("_http._tcp."+web, "SRV").want(t, "NOERROR", "_http._tcp."+web+" 5 SRV 0 100 80 "+web)
	dig("_http._udp."+web, "SRV").want(t, "NXDOMAIN")
	dig(web, "TXT").want(t, "NODATA")

	// Headless, written after the server started (watch events).
	s.putImport("db", mcsv1beta1.Headless, nil, mcsv1beta1.ServicePort{Name: "pg", Protocol: corev1.ProtocolTCP, Port: 5432})
	pg := []discoveryv1.EndpointPort{{Name: ptr.To("pg"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(5432))}}
	s.putSlice("db-east-v4", "db", "east", discoveryv1.AddressTypeIPv4, pg,
		discoveryv1.Endpoint{Addresses: []string{"10.61.0.10"}, Hostname: ptr.To("db-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		discoveryv1.Endpoint{Addresses: []string{"10.61.0.11"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		discoveryv1.Endpoint{Addresses: []string{"10.61.0.12"}, Hostname: ptr.To("db-2"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}})
	s.putSlice("db-east-v6", "db", "east", discoveryv1.AddressTypeIPv6, pg,
		discoveryv1.Endpoint{Addresses: []string{"fd61::10"}, Hostname: ptr.To("db-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	s.putSlice("db-west-v4", "db", "west", discoveryv1.AddressTypeIPv4, pg,
		discoveryv1.Endpoint{Addresses: []string{"10.62.0.10"}, Hostname: ptr.To("db-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	const db = "db." + mcsDNSNamespace + ".svc.clusterset.local."
	s.digEventually(client, server, 10*time.Second, []string{db, "A"}, "NOERROR", db+" 5 A 10.61.0.10", db+" 5 A 10.61.0.11", db+" 5 A 10.62.0.10")
	dig(db, "AAAA").want(t, "NOERROR", db+" 5 AAAA fd61::10")
	dig("db-0.east."+db, "A").want(t, "NOERROR", "db-0.east."+db+" 5 A 10.61.0.10")
	dig("db-0.east."+db, "AAAA").want(t, "NOERROR", "db-0.east."+db+" 5 AAAA fd61::10")
	dig("db-0.west."+db, "A").want(t, "NOERROR", "db-0.west."+db+" 5 A 10.62.0.10")
	dig("db-0.west."+db, "AAAA").want(t, "NODATA")
	dig("10-61-0-11.east."+db, "A").want(t, "NOERROR", "10-61-0-11.east."+db+" 5 A 10.61.0.11")
	dig("db-2.east."+db, "A").want(t, "NXDOMAIN") // not ready
	srv := dig("_pg._tcp."+db, "SRV")
	srv.want(t, "NOERROR",
		"_pg._tcp."+db+" 5 SRV 0 33 5432 10-61-0-11.east."+db,
		"_pg._tcp."+db+" 5 SRV 0 33 5432 db-0.east."+db,
		"_pg._tcp."+db+" 5 SRV 0 33 5432 db-0.west."+db)
	if !slices.Contains(srv.additional, "db-0.east."+db+" 5 AAAA fd61::10") {
		t.Errorf("SRV answer without the targets' addresses in the additional section: %q", srv.additional)
	}

	// Names that do not exist, and outside the zone.
	nx := dig("nope."+mcsDNSNamespace+".svc.clusterset.local.", "A")
	nx.want(t, "NXDOMAIN")
	if len(nx.authority) != 1 || !strings.Contains(nx.authority[0], " 5 SOA ns.dns.clusterset.local. hostmaster.clusterset.local. ") {
		t.Errorf("NXDOMAIN without the zone's SOA (TTL 5) for negative caching: %q", nx.authority)
	}
	dig("web.other.svc.clusterset.local.", "A").want(t, "NXDOMAIN")
	dig("example.com.", "A").want(t, "REFUSED")
	dig("web."+mcsDNSNamespace+".svc.cluster.local.", "A").want(t, "REFUSED")

	// Changes: the answers follow.
	start = time.Now()
	s.putImport("web", mcsv1beta1.ClusterSetIP, []string{"10.96.200.20"}, mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80})
	s.digEventually(client, server, 10*time.Second, []string{web, "A"}, "NOERROR", web+" 5 A 10.96.200.20")
	t.Logf("ClusterSetIP change answered %s after the update", time.Since(start).Round(time.Millisecond))
	dig(web, "AAAA").want(t, "NODATA")

	start = time.Now()
	s.putSlice("db-east-v4", "db", "east", discoveryv1.AddressTypeIPv4, pg,
		discoveryv1.Endpoint{Addresses: []string{"10.61.0.10"}, Hostname: ptr.To("db-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		discoveryv1.Endpoint{Addresses: []string{"10.61.0.11"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	s.digEventually(client, server, 10*time.Second, []string{db, "A"}, "NOERROR", db+" 5 A 10.61.0.11", db+" 5 A 10.62.0.10")
	t.Logf("endpoint turned not ready: gone from the answer %s after the update", time.Since(start).Round(time.Millisecond))
	dig("db-0.east."+db, "A").want(t, "NODATA") // its IPv6 twin is still ready

	if err := tb.Kube.DiscoveryV1().EndpointSlices(mcsDNSNamespace).Delete(ctx, "db-west-v4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.digEventually(client, server, 10*time.Second, []string{db, "A"}, "NOERROR", db+" 5 A 10.61.0.11")
	s.digEventually(client, server, 10*time.Second, []string{"db-0.west." + db, "A"}, "NXDOMAIN")

	if err := tb.Dynamic.Resource(mcsdns.ServiceImportGVR).Namespace(mcsDNSNamespace).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.digEventually(client, server, 10*time.Second, []string{web, "A"}, "NXDOMAIN")

	// Metrics.
	out, err := n.Exec(ctx, "curl", "-sS", "-m", "3", "http://127.0.0.1:9479/metrics")
	if err != nil {
		t.Fatalf("metrics: %v\n%s", err, out)
	}
	for _, rc := range []string{"NOERROR", "NXDOMAIN", "REFUSED"} {
		if !metricPositive(out, `meshd_dns_requests_total{rcode="`+rc+`"}`) {
			t.Errorf("meshd_dns_requests_total{rcode=%q} not counted:\n%s", rc, grepLines(out, "meshd_dns_requests_total"))
		}
	}
	t.Logf("metrics:\n%s", grepLines(out, "meshd_dns_requests_total", "meshd_dns_request_duration_seconds_count"))
	if proc.Exited() {
		t.Fatalf("meshd dns exited: %v", proc.Err())
	}
}

// metricPositive reports whether the sample line of series is above 0.
func metricPositive(text, series string) bool {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return strings.TrimSpace(v) != "0"
		}
	}
	return false
}

// digResult is dig's view of one answer: the status (NODATA for NOERROR
// without answers), and the sections as "name ttl TYPE data".
type digResult struct {
	args                          []string
	status                        string
	aa                            bool
	answer, authority, additional []string
	raw                           string
}

// want checks the status and the answer section (any order); in-zone
// answers must be authoritative.
func (r digResult) want(t *testing.T, status string, answer ...string) {
	t.Helper()
	got := slices.Sorted(slices.Values(r.answer))
	exp := slices.Sorted(slices.Values(answer))
	if r.status != status || !slices.Equal(got, exp) {
		t.Errorf("dig %s: %s %q, want %s %q\n%s", strings.Join(r.args, " "), r.status, got, status, exp, r.raw)
		return
	}
	if status != "REFUSED" && !r.aa {
		t.Errorf("dig %s: answer not authoritative\n%s", strings.Join(r.args, " "), r.raw)
	}
}

func (s *scenario) dig(from *testbed.Pod, server string, args ...string) digResult {
	s.t.Helper()
	argv := append([]string{"dig", "@" + server, "+norecurse", "+time=2", "+tries=2", "+nocookie", "+noedns"}, args...)
	out, err := from.Exec(s.ctx, argv...)
	if err != nil {
		s.t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return parseDig(args, out)
}

func parseDig(args []string, out string) digResult {
	r := digResult{args: args, raw: out}
	section := ""
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.Contains(l, "->>HEADER<<-"):
			if _, st, ok := strings.Cut(l, "status: "); ok {
				r.status, _, _ = strings.Cut(st, ",")
			}
		case strings.HasPrefix(l, ";; flags:"):
			flags, _, _ := strings.Cut(strings.TrimPrefix(l, ";; flags:"), ";")
			r.aa = slices.Contains(strings.Fields(flags), "aa")
		case strings.HasPrefix(l, ";; ANSWER SECTION"):
			section = "answer"
		case strings.HasPrefix(l, ";; AUTHORITY SECTION"):
			section = "authority"
		case strings.HasPrefix(l, ";; ADDITIONAL SECTION"):
			section = "additional"
		case l == "" || strings.HasPrefix(l, ";"):
			if l == "" {
				section = ""
			}
		default:
			f := strings.Fields(l) // name ttl class type data...
			if len(f) < 5 {
				continue
			}
			rr := strings.Join(append([]string{f[0], f[1]}, f[3:]...), " ")
			switch section {
			case "answer":
				r.answer = append(r.answer, rr)
			case "authority":
				r.authority = append(r.authority, rr)
			case "additional":
				r.additional = append(r.additional, rr)
			}
		}
	}
	if r.status == "NOERROR" && len(r.answer) == 0 {
		r.status = "NODATA"
	}
	return r
}

// digEventually repeats a query until its status and answer are the wanted
// ones (the server follows the API through a watch).
func (s *scenario) digEventually(from *testbed.Pod, server string, timeout time.Duration, args []string, status string, answer ...string) {
	s.t.Helper()
	exp := slices.Sorted(slices.Values(answer))
	s.eventually(timeout, 50*time.Millisecond, fmt.Sprintf("dig %s answers %s %q", strings.Join(args, " "), status, exp), func() error {
		r := s.dig(from, server, args...)
		if got := slices.Sorted(slices.Values(r.answer)); r.status != status || !slices.Equal(got, exp) {
			return fmt.Errorf("got %s %q", r.status, got)
		}
		return nil
	})
}

// ensureServiceImportCRD installs upstream's ServiceImport CRD (v1beta1
// stored, v1alpha1 served; from the sigs.k8s.io/mcs-api module) unless the
// cluster has it, and waits for it.
func (s *scenario) ensureServiceImportCRD() {
	s.t.Helper()
	cs, err := apiextensions.NewForConfig(tb.RESTConfig)
	if err != nil {
		s.t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(mcscrd.ServiceImportCRD, &crd); err != nil {
		s.t.Fatal(err)
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(s.ctx, crd.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(s.ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			s.t.Fatal(err)
		}
	} else if err != nil {
		s.t.Fatal(err)
	}
	s.eventually(30*time.Second, 100*time.Millisecond, "the ServiceImport CRD is established and serves v1beta1", func() error {
		c, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(s.ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !crdEstablished(c) {
			return fmt.Errorf("not established")
		}
		_, err = tb.Dynamic.Resource(mcsdns.ServiceImportGVR).List(s.ctx, metav1.ListOptions{Limit: 1})
		return err
	})
}

func crdEstablished(c *apiextensionsv1.CustomResourceDefinition) bool {
	for _, cond := range c.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// putImport creates or replaces the ServiceImport name in mcsDNSNamespace.
func (s *scenario) putImport(name string, typ mcsv1beta1.ServiceImportType, ips []string, ports ...mcsv1beta1.ServicePort) {
	s.t.Helper()
	si := &mcsv1beta1.ServiceImport{
		TypeMeta:   metav1.TypeMeta{APIVersion: mcsv1beta1.GroupVersion.String(), Kind: "ServiceImport"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: mcsDNSNamespace},
		Spec:       mcsv1beta1.ServiceImportSpec{Type: typ, IPs: ips, Ports: ports},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(si)
	if err != nil {
		s.t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	res := tb.Dynamic.Resource(mcsdns.ServiceImportGVR).Namespace(mcsDNSNamespace)
	old, err := res.Get(s.ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = res.Create(s.ctx, u, metav1.CreateOptions{})
	case err == nil:
		u.SetResourceVersion(old.GetResourceVersion())
		_, err = res.Update(s.ctx, u, metav1.UpdateOptions{})
	}
	if err != nil {
		s.t.Fatalf("ServiceImport %s: %v", name, err)
	}
}

// putSlice creates or replaces an EndpointSlice of the import svc from
// source cluster, labelled as the MCS controller labels them.
func (s *scenario) putSlice(name, svc, cluster string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) {
	s.t.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: mcsDNSNamespace, Labels: map[string]string{
			mcsv1beta1.LabelServiceName:   svc,
			mcsv1beta1.LabelSourceCluster: cluster,
		}},
		AddressType: at, Ports: ports, Endpoints: eps,
	}
	c := tb.Kube.DiscoveryV1().EndpointSlices(mcsDNSNamespace)
	old, err := c.Get(s.ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Create(s.ctx, es, metav1.CreateOptions{})
	case err == nil:
		es.ResourceVersion = old.ResourceVersion
		_, err = c.Update(s.ctx, es, metav1.UpdateOptions{})
	}
	if err != nil {
		s.t.Fatalf("EndpointSlice %s: %v", name, err)
	}
}

// mcsDNSCleanup deletes the test's imports and slices (the API server
// outlives the scenario).
func (s *scenario) mcsDNSCleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = tb.Dynamic.Resource(mcsdns.ServiceImportGVR).Namespace(mcsDNSNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = tb.Kube.DiscoveryV1().EndpointSlices(mcsDNSNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: mcsv1beta1.LabelServiceName})
}

// startMCSDNS starts `meshd dns` on node with kubeconfig, answering on
// server:53 (metrics on 127.0.0.1:9479), and waits until it is ready (its
// caches synced). Its log is printed when the test fails.
func (s *scenario) startMCSDNS(node *testbed.Node, kubeconfig, server string, args ...string) *testbed.Proc {
	s.t.Helper()
	argv := append([]string{"dns", "--kubeconfig", kubeconfig, "--listen", server + ":53", "--metrics-listen", "127.0.0.1:9479"}, args...)
	proc, err := node.Start("mcs-dns", append([]string{tb.MeshdBinary}, argv...)...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		if s.t.Failed() || os.Getenv("E2E_DIAG") != "" {
			s.t.Logf("----- meshd dns log on %s (last 60 lines)\n%s", node.Name, testbed.Tail(proc.LogPath, 60))
		}
	})
	s.eventually(30*time.Second, 100*time.Millisecond, "meshd dns /readyz", func() error {
		if proc.Exited() {
			return fmt.Errorf("meshd dns exited: %v\n%s", proc.Err(), testbed.Tail(proc.LogPath, 20))
		}
		code, body, err := node.HTTPGet(s.ctx, "http://127.0.0.1:9479/readyz")
		if err != nil || code != 200 {
			return fmt.Errorf("/readyz: %d %q %v", code, body, err)
		}
		return nil
	})
	return proc
}

// serviceAccountKubeconfig is the admin kubeconfig with a token of the
// ServiceAccount sa of meshd-system instead of the admin's.
func (s *scenario) serviceAccountKubeconfig(sa string) string {
	s.t.Helper()
	return s.serviceAccountKubeconfigIn(tb.Kube, tb.Kubeconfig, tb.Token, tb.Dir, sa)
}

// serviceAccountKubeconfigIn is serviceAccountKubeconfig for the cluster of
// kube, whose admin kubeconfig (file) holds token; the file goes into dir.
func (s *scenario) serviceAccountKubeconfigIn(kube kubernetes.Interface, kubeconfig, token, dir, sa string) string {
	s.t.Helper()
	exp := int64(3600)
	tr, err := kube.CoreV1().ServiceAccounts(testbed.LeaseNamespace).CreateToken(s.ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("token of ServiceAccount %s: %v", sa, err)
	}
	admin, err := os.ReadFile(kubeconfig)
	if err != nil {
		s.t.Fatal(err)
	}
	kc := strings.Replace(string(admin), "user: {token: "+token+"}", "user: {token: "+tr.Status.Token+"}", 1)
	if kc == string(admin) {
		s.t.Fatalf("%s: no admin token to replace", kubeconfig)
	}
	path := filepath.Join(dir, sa+".kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}
