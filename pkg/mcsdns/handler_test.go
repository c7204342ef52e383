package mcsdns

import (
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

func serviceImport(ns, name string, typ mcsv1beta1.ServiceImportType, ips []string, ports ...mcsv1beta1.ServicePort) *mcsv1beta1.ServiceImport {
	return &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       mcsv1beta1.ServiceImportSpec{Type: typ, IPs: ips, Ports: ports},
	}
}

type ep struct {
	addrs    []string
	hostname string
	ready    *bool
}

func slice(ns, svc, cluster, name string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			mcsv1beta1.LabelServiceName:   svc,
			mcsv1beta1.LabelSourceCluster: cluster,
		}},
		AddressType: at,
		Ports:       ports,
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{Addresses: e.addrs, Conditions: discoveryv1.EndpointConditions{Ready: e.ready}}
		if e.hostname != "" {
			x.Hostname = ptr.To(e.hostname)
		}
		es.Endpoints = append(es.Endpoints, x)
	}
	return es
}

func port(name string, proto corev1.Protocol, p int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Protocol: ptr.To(proto), Port: ptr.To(p)}
}

// newTestStore is a Store over plain indexers (the informers' own kind of
// cache) holding objs.
func newTestStore(t testing.TB, objs ...any) (*Store, cache.Indexer, cache.Indexer) {
	t.Helper()
	imports := cache.NewIndexer(cache.MetaNamespaceKeyFunc, ImportIndexers())
	slices := cache.NewIndexer(cache.MetaNamespaceKeyFunc, SliceIndexers())
	for _, o := range objs {
		var err error
		switch o.(type) {
		case *mcsv1beta1.ServiceImport:
			err = imports.Add(o)
		case *discoveryv1.EndpointSlice:
			err = slices.Add(o)
		default:
			t.Fatalf("unexpected %T", o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return NewStore(imports, slices), imports, slices
}

// fixture: a ClusterSetIP service (dual-stack), a headless one with ready
// and not-ready endpoints in two clusters (one dual-stack pod with a
// hostname), and a ClusterSetIP import without IPs yet.
func fixture(t testing.TB) *Handler {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	dnsP := mcsv1beta1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}
	plain := mcsv1beta1.ServicePort{Port: 9000}
	epPorts := []discoveryv1.EndpointPort{port("http", corev1.ProtocolTCP, 8080), port("dns", corev1.ProtocolUDP, 5353)}
	store, _, _ := newTestStore(t,
		serviceImport("shop", "web", mcsv1beta1.ClusterSetIP, []string{"10.96.0.10", "fd00:96::10"}, http, dnsP, plain),
		serviceImport("shop", "v4only", mcsv1beta1.ClusterSetIP, []string{"10.96.0.11"}, http),
		serviceImport("shop", "pending", mcsv1beta1.ClusterSetIP, nil, http),
		serviceImport("shop", "db", mcsv1beta1.Headless, nil, http, dnsP),
		serviceImport("shop", "empty", mcsv1beta1.Headless, nil, http),
		slice("shop", "db", "east", "db-east-4", discoveryv1.AddressTypeIPv4, epPorts,
			ep{addrs: []string{"10.1.0.5"}, hostname: "db-0"},
			ep{addrs: []string{"10.1.0.6"}, ready: ptr.To(true)},
			ep{addrs: []string{"10.1.0.7"}, hostname: "db-2", ready: ptr.To(false)}),
		slice("shop", "db", "east", "db-east-6", discoveryv1.AddressTypeIPv6, epPorts,
			ep{addrs: []string{"fd01::5"}, hostname: "db-0"}),
		slice("shop", "db", "west", "db-west-4", discoveryv1.AddressTypeIPv4, epPorts,
			ep{addrs: []string{"10.2.0.5"}, hostname: "db-0"},
			ep{addrs: []string{"10.2.0.9"}, hostname: "gone", ready: ptr.To(false)}),
		// A slice of the ClusterSetIP service: never answered directly.
		slice("shop", "web", "east", "web-east", discoveryv1.AddressTypeIPv4, epPorts, ep{addrs: []string{"10.1.0.99"}}),
		// Only not-ready endpoints.
		slice("shop", "empty", "east", "empty-east", discoveryv1.AddressTypeIPv4, epPorts, ep{addrs: []string{"10.1.0.50"}, ready: ptr.To(false)}),
	)
	return &Handler{Zone: DefaultZone, TTL: DefaultTTL, Lookup: store, Serial: func() uint32 { return 42 }}
}

func query(h *Handler, name string, qtype uint16) *dns.Msg {
	r := new(dns.Msg)
	r.SetQuestion(name, qtype)
	return h.Answer(r)
}

// rrs renders a section without TTLs and classes, sorted: "name TYPE data".
func rrs(section []dns.RR) []string {
	var out []string
	for _, rr := range section {
		f := strings.Fields(rr.String())
		out = append(out, f[0]+" "+strings.Join(f[3:], " "))
	}
	sort.Strings(out)
	return out
}

func TestAnswers(t *testing.T) {
	h := fixture(t)
	const z = "clusterset.local."
	for _, tc := range []struct {
		name   string
		qname  string
		qtype  uint16
		rcode  int
		answer []string
		extra  []string
	}{
		// ClusterSetIP
		{"clustersetip A", "web.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, []string{"web.shop.svc.clusterset.local. A 10.96.0.10"}, nil},
		{"clustersetip AAAA (dual-stack)", "web.shop.svc." + z, dns.TypeAAAA, dns.RcodeSuccess, []string{"web.shop.svc.clusterset.local. AAAA fd00:96::10"}, nil},
		{"clustersetip case kept", "Web.Shop.svc." + z, dns.TypeA, dns.RcodeSuccess, []string{"Web.Shop.svc.clusterset.local. A 10.96.0.10"}, nil},
		{"ipv4-only AAAA is NODATA", "v4only.shop.svc." + z, dns.TypeAAAA, dns.RcodeSuccess, nil, nil},
		{"no IP allocated yet: NODATA", "pending.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, nil, nil},
		{"clustersetip TXT is NODATA", "web.shop.svc." + z, dns.TypeTXT, dns.RcodeSuccess, nil, nil},
		{"clustersetip SRV of a named port", "_http._tcp.web.shop.svc." + z, dns.TypeSRV, dns.RcodeSuccess,
			[]string{"_http._tcp.web.shop.svc.clusterset.local. SRV 0 100 80 web.shop.svc.clusterset.local."},
			[]string{"web.shop.svc.clusterset.local. A 10.96.0.10", "web.shop.svc.clusterset.local. AAAA fd00:96::10"}},
		{"clustersetip SRV udp port", "_dns._udp.web.shop.svc." + z, dns.TypeSRV, dns.RcodeSuccess,
			[]string{"_dns._udp.web.shop.svc.clusterset.local. SRV 0 100 53 web.shop.svc.clusterset.local."},
			[]string{"web.shop.svc.clusterset.local. A 10.96.0.10", "web.shop.svc.clusterset.local. AAAA fd00:96::10"}},
		{"clustersetip SRV wrong protocol", "_dns._tcp.web.shop.svc." + z, dns.TypeSRV, dns.RcodeNameError, nil, nil},
		{"clustersetip SRV unknown port", "_grpc._tcp.web.shop.svc." + z, dns.TypeSRV, dns.RcodeNameError, nil, nil},
		{"clustersetip A at the port name is NODATA", "_http._tcp.web.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, nil, nil},
		{"clustersetip SRV of the service: every port", "web.shop.svc." + z, dns.TypeSRV, dns.RcodeSuccess,
			[]string{
				"web.shop.svc.clusterset.local. SRV 0 33 53 web.shop.svc.clusterset.local.",
				"web.shop.svc.clusterset.local. SRV 0 33 80 web.shop.svc.clusterset.local.",
				"web.shop.svc.clusterset.local. SRV 0 33 9000 web.shop.svc.clusterset.local.",
			},
			[]string{"web.shop.svc.clusterset.local. A 10.96.0.10", "web.shop.svc.clusterset.local. AAAA fd00:96::10"}},
		{"_proto node exists", "_tcp.web.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, nil, nil},
		{"_proto node without such ports", "_sctp.web.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"clustersetip has no cluster names", "east.web.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"clustersetip has no endpoint names", "db-0.east.web.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},

		// Headless
		{"headless A: ready endpoints of every cluster", "db.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, []string{
			"db.shop.svc.clusterset.local. A 10.1.0.5",
			"db.shop.svc.clusterset.local. A 10.1.0.6",
			"db.shop.svc.clusterset.local. A 10.2.0.5",
		}, nil},
		{"headless AAAA", "db.shop.svc." + z, dns.TypeAAAA, dns.RcodeSuccess, []string{"db.shop.svc.clusterset.local. AAAA fd01::5"}, nil},
		{"headless hostname A", "db-0.east.db.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, []string{"db-0.east.db.shop.svc.clusterset.local. A 10.1.0.5"}, nil},
		{"headless hostname AAAA (dual-stack pod)", "db-0.east.db.shop.svc." + z, dns.TypeAAAA, dns.RcodeSuccess, []string{"db-0.east.db.shop.svc.clusterset.local. AAAA fd01::5"}, nil},
		{"same hostname, other cluster", "db-0.west.db.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, []string{"db-0.west.db.shop.svc.clusterset.local. A 10.2.0.5"}, nil},
		{"v4-only endpoint AAAA is NODATA", "db-0.west.db.shop.svc." + z, dns.TypeAAAA, dns.RcodeSuccess, nil, nil},
		{"endpoint without hostname by its dashed address", "10-1-0-6.east.db.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, []string{"10-1-0-6.east.db.shop.svc.clusterset.local. A 10.1.0.6"}, nil},
		{"not-ready endpoint's hostname is NXDOMAIN", "db-2.east.db.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"not-ready endpoint in another cluster", "gone.west.db.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"unknown hostname", "db-9.east.db.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"cluster node exists", "east.db.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, nil, nil},
		{"unknown cluster", "north.db.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"headless SRV: one per ready endpoint", "_http._tcp.db.shop.svc." + z, dns.TypeSRV, dns.RcodeSuccess, []string{
			"_http._tcp.db.shop.svc.clusterset.local. SRV 0 33 8080 10-1-0-6.east.db.shop.svc.clusterset.local.",
			"_http._tcp.db.shop.svc.clusterset.local. SRV 0 33 8080 db-0.east.db.shop.svc.clusterset.local.",
			"_http._tcp.db.shop.svc.clusterset.local. SRV 0 33 8080 db-0.west.db.shop.svc.clusterset.local.",
		}, []string{
			"10-1-0-6.east.db.shop.svc.clusterset.local. A 10.1.0.6",
			"db-0.east.db.shop.svc.clusterset.local. A 10.1.0.5",
			"db-0.east.db.shop.svc.clusterset.local. AAAA fd01::5",
			"db-0.west.db.shop.svc.clusterset.local. A 10.2.0.5",
		}},
		{"headless SRV udp port", "_dns._udp.db.shop.svc." + z, dns.TypeSRV, dns.RcodeSuccess, []string{
			"_dns._udp.db.shop.svc.clusterset.local. SRV 0 33 5353 10-1-0-6.east.db.shop.svc.clusterset.local.",
			"_dns._udp.db.shop.svc.clusterset.local. SRV 0 33 5353 db-0.east.db.shop.svc.clusterset.local.",
			"_dns._udp.db.shop.svc.clusterset.local. SRV 0 33 5353 db-0.west.db.shop.svc.clusterset.local.",
		}, []string{
			"10-1-0-6.east.db.shop.svc.clusterset.local. A 10.1.0.6",
			"db-0.east.db.shop.svc.clusterset.local. A 10.1.0.5",
			"db-0.east.db.shop.svc.clusterset.local. AAAA fd01::5",
			"db-0.west.db.shop.svc.clusterset.local. A 10.2.0.5",
		}},
		{"headless, only not-ready endpoints: NODATA", "empty.shop.svc." + z, dns.TypeA, dns.RcodeSuccess, nil, nil},
		{"headless, only not-ready endpoints: SRV NODATA", "_http._tcp.empty.shop.svc." + z, dns.TypeSRV, dns.RcodeSuccess, nil, nil},

		// Names that do not exist, and the structure above services.
		{"unknown service", "nope.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"unknown namespace", "web.other.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"namespace node", "shop.svc." + z, dns.TypeA, dns.RcodeSuccess, nil, nil},
		{"empty namespace node", "other.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"svc node", "svc." + z, dns.TypeA, dns.RcodeSuccess, nil, nil},
		{"not under svc", "web.shop.pod." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"too deep", "a.db-0.east.db.shop.svc." + z, dns.TypeA, dns.RcodeNameError, nil, nil},
		{"apex SOA", z, dns.TypeSOA, dns.RcodeSuccess, []string{"clusterset.local. SOA ns.dns.clusterset.local. hostmaster.clusterset.local. 42 7200 1800 86400 5"}, nil},
		{"apex A is NODATA", z, dns.TypeA, dns.RcodeSuccess, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := query(h, tc.qname, tc.qtype)
			if m.Rcode != tc.rcode {
				t.Fatalf("rcode %s, want %s\n%s", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode], m)
			}
			if !m.Authoritative {
				t.Errorf("answer not authoritative")
			}
			if got := rrs(m.Answer); !slices.Equal(got, tc.answer) {
				t.Errorf("answer:\n got %q\nwant %q", got, tc.answer)
			}
			if got := rrs(m.Extra); !slices.Equal(got, tc.extra) {
				t.Errorf("extra:\n got %q\nwant %q", got, tc.extra)
			}
			for _, rr := range append(append([]dns.RR{}, m.Answer...), m.Extra...) {
				if rr.Header().Ttl != DefaultTTL {
					t.Errorf("TTL %d of %s, want %d", rr.Header().Ttl, rr, DefaultTTL)
				}
			}
			// Negative answers (NXDOMAIN and NODATA) carry the SOA for
			// negative caching, its TTL the zone's.
			if len(m.Answer) == 0 {
				if len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != dns.TypeSOA || m.Ns[0].Header().Ttl != DefaultTTL || m.Ns[0].(*dns.SOA).Minttl != DefaultTTL {
					t.Errorf("negative answer without the SOA of TTL %d: %v", DefaultTTL, m.Ns)
				}
			} else if len(m.Ns) != 0 {
				t.Errorf("authority section on a positive answer: %v", m.Ns)
			}
		})
	}
}

func TestOutsideZoneRefused(t *testing.T) {
	h := fixture(t)
	for _, name := range []string{"example.com.", "web.shop.svc.cluster.local.", "local.", ".", "xclusterset.local."} {
		m := query(h, name, dns.TypeA)
		if m.Rcode != dns.RcodeRefused || len(m.Answer) != 0 || m.Authoritative {
			t.Errorf("%s: rcode %s, %d answers, aa=%v; want REFUSED, none, not authoritative", name, dns.RcodeToString[m.Rcode], len(m.Answer), m.Authoritative)
		}
	}
}

func TestNotSyncedIsServfail(t *testing.T) {
	h := fixture(t)
	synced := false
	h.Ready = func() bool { return synced }
	if m := query(h, "web.shop.svc.clusterset.local.", dns.TypeA); m.Rcode != dns.RcodeServerFailure {
		t.Fatalf("before sync: %s, want SERVFAIL (never a cacheable NXDOMAIN)", dns.RcodeToString[m.Rcode])
	}
	synced = true
	if m := query(h, "web.shop.svc.clusterset.local.", dns.TypeA); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Fatalf("after sync: %s with %d answers", dns.RcodeToString[m.Rcode], len(m.Answer))
	}
}

// The answers follow the caches: an update of the import or a slice shows
// in the next query.
func TestAnswersFollowTheCache(t *testing.T) {
	si := serviceImport("ns", "svc", mcsv1beta1.ClusterSetIP, []string{"10.96.1.1"}, mcsv1beta1.ServicePort{Name: "http", Port: 80})
	store, imports, sl := newTestStore(t, si)
	h := &Handler{Zone: DefaultZone, TTL: DefaultTTL, Lookup: store}
	const name = "svc.ns.svc.clusterset.local."
	check := func(qtype uint16, want ...string) {
		t.Helper()
		var full []string
		for _, w := range want {
			full = append(full, name+" "+w)
		}
		if got := rrs(query(h, name, qtype).Answer); !slices.Equal(got, full) {
			t.Fatalf("got %q, want %q", got, full)
		}
	}
	check(dns.TypeA, "A 10.96.1.1")
	si2 := si.DeepCopy()
	si2.Spec.IPs = []string{"10.96.1.2"}
	if err := imports.Update(si2); err != nil {
		t.Fatal(err)
	}
	check(dns.TypeA, "A 10.96.1.2")
	// It becomes headless: its slices answer.
	si3 := si2.DeepCopy()
	si3.Spec.Type, si3.Spec.IPs = mcsv1beta1.Headless, nil
	if err := imports.Update(si3); err != nil {
		t.Fatal(err)
	}
	check(dns.TypeA)
	es := slice("ns", "svc", "c1", "svc-c1", discoveryv1.AddressTypeIPv4, nil, ep{addrs: []string{"10.3.0.1"}})
	if err := sl.Add(es); err != nil {
		t.Fatal(err)
	}
	check(dns.TypeA, "A 10.3.0.1")
	es2 := es.DeepCopy()
	es2.Endpoints[0].Conditions.Ready = ptr.To(false)
	if err := sl.Update(es2); err != nil {
		t.Fatal(err)
	}
	check(dns.TypeA)
	if err := imports.Delete(si3); err != nil {
		t.Fatal(err)
	}
	if m := query(h, name, dns.TypeA); m.Rcode != dns.RcodeNameError {
		t.Fatalf("deleted import: %s, want NXDOMAIN", dns.RcodeToString[m.Rcode])
	}
}

// A slice without the source-cluster label, of another address type, or
// of a service label pointing elsewhere never answers.
func TestForeignSlicesIgnored(t *testing.T) {
	si := serviceImport("ns", "h", mcsv1beta1.Headless, nil)
	noCluster := slice("ns", "h", "", "a", discoveryv1.AddressTypeIPv4, nil, ep{addrs: []string{"10.9.0.1"}})
	fqdn := slice("ns", "h", "c", "b", discoveryv1.AddressTypeFQDN, nil, ep{addrs: []string{"example.com"}})
	other := slice("ns", "other", "c", "c", discoveryv1.AddressTypeIPv4, nil, ep{addrs: []string{"10.9.0.3"}})
	otherNS := slice("ns2", "h", "c", "d", discoveryv1.AddressTypeIPv4, nil, ep{addrs: []string{"10.9.0.4"}})
	store, _, _ := newTestStore(t, si, noCluster, fqdn, other, otherNS)
	h := &Handler{Zone: DefaultZone, TTL: DefaultTTL, Lookup: store}
	if m := query(h, "h.ns.svc.clusterset.local.", dns.TypeA); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
		t.Fatalf("got %s %v, want NODATA", dns.RcodeToString[m.Rcode], m.Answer)
	}
}

// BenchmarkAnswer: one query against the caches, for a ClusterSetIP import
// and for a headless import of 100 endpoints in 2 clusters (SRV: 100
// records plus their addresses).
func BenchmarkAnswer(b *testing.B) {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	ports := []discoveryv1.EndpointPort{port("http", corev1.ProtocolTCP, 8080)}
	objs := []any{
		serviceImport("ns", "web", mcsv1beta1.ClusterSetIP, []string{"10.96.0.1"}, http),
		serviceImport("ns", "db", mcsv1beta1.Headless, nil, http),
	}
	for c, cluster := range []string{"east", "west"} {
		var eps []ep
		for i := range 50 {
			eps = append(eps, ep{addrs: []string{netipString(c, i)}, hostname: "db-" + strconv.Itoa(i)})
		}
		objs = append(objs, slice("ns", "db", cluster, "db-"+cluster, discoveryv1.AddressTypeIPv4, ports, eps...))
	}
	store, _, _ := newTestStore(b, objs...)
	h := &Handler{Zone: DefaultZone, TTL: DefaultTTL, Lookup: store}
	for _, bc := range []struct {
		name  string
		qname string
		qtype uint16
	}{
		{"clustersetip-A", "web.ns.svc.clusterset.local.", dns.TypeA},
		{"headless-100-A", "db.ns.svc.clusterset.local.", dns.TypeA},
		{"headless-100-SRV", "_http._tcp.db.ns.svc.clusterset.local.", dns.TypeSRV},
		{"headless-hostname-A", "db-7.west.db.ns.svc.clusterset.local.", dns.TypeA},
		{"nxdomain", "nope.ns.svc.clusterset.local.", dns.TypeA},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := new(dns.Msg)
			r.SetQuestion(bc.qname, bc.qtype)
			for b.Loop() {
				h.Answer(r)
			}
		})
	}
}

func netipString(c, i int) string { return "10." + strconv.Itoa(60+c) + ".0." + strconv.Itoa(i+1) }

// isLabel is Kubernetes' DNS-1123 label check, without its regexp.
func TestIsLabel(t *testing.T) {
	for _, s := range []string{"a", "db-0", "0", "10-1-0-6", "a-b-c", strings.Repeat("a", 63), "", "-a", "a-", "A", "a.b", "a_b", strings.Repeat("a", 64), "é"} {
		if got, want := isLabel(s), len(validation.IsDNS1123Label(s)) == 0; got != want {
			t.Errorf("isLabel(%q) = %v, want %v", s, got, want)
		}
	}
}
