package mcsdns

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// The Handler inside CoreDNS's dnsserver, queried over real UDP and TCP
// sockets: answers, REFUSED outside the zone, truncation of a large UDP
// answer (then the full answer over TCP), and the rcode metrics.
func TestServer(t *testing.T) {
	srv, reg := startServer(t, fixture(t))
	for _, network := range []string{"udp", "tcp"} {
		r := ask(t, srv, network, "web.shop.svc.clusterset.local.", dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.96.0.10" || !r.Authoritative {
			t.Errorf("%s: %v", network, r)
		}
		if r := ask(t, srv, network, "nope.shop.svc.clusterset.local.", dns.TypeA); r.Rcode != dns.RcodeNameError {
			t.Errorf("%s: NXDOMAIN expected: %v", network, r)
		}
		if r := ask(t, srv, network, "example.org.", dns.TypeA); r.Rcode != dns.RcodeRefused {
			t.Errorf("%s: REFUSED expected outside the zone: %v", network, r)
		}
	}
	if r := ask(t, srv, "udp", "_http._tcp.db.shop.svc.clusterset.local.", dns.TypeSRV); len(r.Answer) != 3 || len(r.Extra) != 4 {
		t.Errorf("SRV over UDP: %v", r)
	}
	want := `
# HELP meshd_dns_requests_total DNS requests answered by meshd dns, by response code (NOERROR, NXDOMAIN, SERVFAIL, REFUSED, ...).
# TYPE meshd_dns_requests_total counter
meshd_dns_requests_total{rcode="NOERROR"} 3
meshd_dns_requests_total{rcode="NXDOMAIN"} 2
meshd_dns_requests_total{rcode="REFUSED"} 2
meshd_dns_requests_total{rcode="SERVFAIL"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshd_dns_requests_total"); err != nil {
		t.Error(err)
	}
}

// A headless service of 200 pods does not fit a 512-byte UDP answer: it is
// truncated (TC set), and complete over TCP.
func TestServerTruncates(t *testing.T) {
	var eps []ep
	for i := range 200 {
		eps = append(eps, ep{addrs: []string{fmt.Sprintf("10.5.%d.%d", i/250, i%250+1)}})
	}
	store, _, _ := newTestStore(t,
		serviceImport("ns", "big", mcsv1beta1.Headless, nil),
		slice("ns", "big", "c1", "big-c1", discoveryv1.AddressTypeIPv4, nil, eps...))
	srv, _ := startServer(t, &Handler{Zone: DefaultZone, TTL: DefaultTTL, Lookup: store})
	const name = "big.ns.svc.clusterset.local."
	r := ask(t, srv, "udp", name, dns.TypeA)
	r.Compress = true // as it was on the wire
	if !r.Truncated || len(r.Answer) >= 200 || r.Len() > 512 {
		t.Errorf("UDP: truncated=%v, %d answers, %d bytes; want TC set, fewer than 200 answers, at most 512 bytes", r.Truncated, len(r.Answer), r.Len())
	}
	r = ask(t, srv, "tcp", name, dns.TypeA)
	if r.Truncated || len(r.Answer) != 200 {
		t.Errorf("TCP: truncated=%v, %d answers; want all 200", r.Truncated, len(r.Answer))
	}
}

// startServer runs h behind Listen on a free loopback port until the test
// ends.
func startServer(t *testing.T, h *Handler) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	srv, err := Listen("127.0.0.1:0", h, NewMetrics(reg), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
	return srv, reg
}

func ask(t *testing.T, srv *Server, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	var err error
	for range 50 { // the sockets are bound; the serving goroutine may not have started yet
		var r *dns.Msg
		if r, _, err = c.Exchange(q, srv.Addr()); err == nil {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s %s %s: %v", network, name, dns.TypeToString[qtype], err)
	return nil
}
