package mcsdns

import (
	"strings"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// FuzzAnswer feeds the handler a query it did not write (a name of any
// bytes, any type) over objects it did not write either (a hostname,
// cluster ID, addresses and port name as the MCS controller copied them
// from another cluster). Invariants: no panic; the reply packs; outside
// the zone REFUSED and empty; inside it authoritative NOERROR or NXDOMAIN,
// every answer owned by the question's name and of its type (SRV targets
// and additional records inside the zone), the SOA on every negative
// answer.
func FuzzAnswer(f *testing.F) {
	f.Add("db-0.east.db.shop.svc.clusterset.local.", uint16(dns.TypeA), "db-0", "east", "10.1.0.5", "fd01::5", "10.96.0.1", "http")
	f.Add("_http._tcp.db.shop.svc.clusterset.local.", uint16(dns.TypeSRV), "db-0", "east", "10.1.0.5", "fd01::5", "10.96.0.1", "http")
	f.Add("_http._tcp.web.shop.svc.clusterset.local.", uint16(dns.TypeSRV), "", "east", "10.1.0.5", "::ffff:1.2.3.4", "fd00::1", "http")
	f.Add("db.shop.svc.clusterset.local.", uint16(dns.TypeANY), "A.B", "Ea.st", "fe80::1%eth0", "300.1.1.1", "::", "")
	f.Add("x\\.y.svc.clusterset.local.", uint16(dns.TypeAAAA), "..", "", "", "", "", "_tcp")
	f.Add("clusterset.local.", uint16(dns.TypeSOA), "h", "c", "1.1.1.1", "::1", "1.1.1.1", "p")
	f.Add("example.com.", uint16(dns.TypeA), "h", "c", "1.1.1.1", "::1", "1.1.1.1", "p")
	f.Fuzz(func(t *testing.T, qname string, qtype uint16, hostname, cluster, addr4, addr6, ip, portName string) {
		http := mcsv1beta1.ServicePort{Name: portName, Protocol: corev1.ProtocolTCP, Port: 80}
		ports := []discoveryv1.EndpointPort{port(portName, corev1.ProtocolTCP, 8080)}
		store, _, _ := newTestStore(t,
			serviceImport("shop", "web", mcsv1beta1.ClusterSetIP, []string{ip}, http),
			serviceImport("shop", "db", mcsv1beta1.Headless, nil, http),
			slice("shop", "db", cluster, "db-4", discoveryv1.AddressTypeIPv4, ports, ep{addrs: []string{addr4}, hostname: hostname}),
			slice("shop", "db", cluster, "db-6", discoveryv1.AddressTypeIPv6, ports, ep{addrs: []string{addr6}, hostname: hostname}),
		)
		h := &Handler{Zone: DefaultZone, TTL: DefaultTTL, Lookup: store}
		r := new(dns.Msg)
		r.Question = []dns.Question{{Name: qname, Qtype: qtype, Qclass: dns.ClassINET}}
		m := h.Answer(r)
		if _, err := m.Pack(); err != nil && dns.IsFqdn(qname) {
			if _, qerr := r.Pack(); qerr == nil { // a question that packs gets a reply that packs
				t.Fatalf("reply does not pack: %v\n%s", err, m)
			}
		}
		inZone := dns.IsSubDomain(DefaultZone, strings.ToLower(qname))
		if !inZone {
			if m.Rcode != dns.RcodeRefused || len(m.Answer)+len(m.Extra)+len(m.Ns) != 0 {
				t.Fatalf("outside the zone: %s", m)
			}
			return
		}
		if m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError {
			t.Fatalf("rcode %s", dns.RcodeToString[m.Rcode])
		}
		if !m.Authoritative {
			t.Fatal("not authoritative")
		}
		if m.Rcode == dns.RcodeNameError && len(m.Answer) != 0 {
			t.Fatalf("NXDOMAIN with answers: %s", m)
		}
		if len(m.Answer) == 0 && (len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != dns.TypeSOA) {
			t.Fatalf("negative answer without SOA: %s", m)
		}
		for _, rr := range m.Answer {
			if rr.Header().Name != qname || (qtype != dns.TypeANY && rr.Header().Rrtype != qtype) {
				t.Fatalf("answer %s to %s %s", rr, qname, dns.TypeToString[qtype])
			}
			if s, ok := rr.(*dns.SRV); ok && !dns.IsSubDomain(DefaultZone, s.Target) {
				t.Fatalf("SRV target outside the zone: %s", rr)
			}
		}
		for _, rr := range m.Extra {
			if !dns.IsSubDomain(DefaultZone, rr.Header().Name) {
				t.Fatalf("additional record outside the zone: %s", rr)
			}
		}
	})
}
