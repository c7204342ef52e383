package mcsdns

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// DefaultZone is the MCS API's zone.
const DefaultZone = "clusterset.local."

// DefaultTTL is the TTL of every record and of negative answers (the SOA's
// minimum), in seconds: the kubernetes plugin's default.
const DefaultTTL = 5

// Handler is the plugin: a CoreDNS plugin.Handler answering for Zone from
// Lookup. It is the last plugin of its chain: it answers every query itself.
type Handler struct {
	// Zone is the zone served, fully qualified, lower case
	// (DefaultZone).
	Zone string
	// TTL of the answers and of negative answers, seconds.
	TTL uint32
	// Lookup is read for every query.
	Lookup Lookup
	// Ready reports whether Lookup has synced; until then every query in
	// the zone is SERVFAIL (nil: always ready).
	Ready func() bool
	// Serial is the SOA serial (nil: 1).
	Serial func() uint32
}

// Name implements plugin.Handler.
func (h *Handler) Name() string { return "mcsdns" }

// ServeDNS implements plugin.Handler: it writes the answer and returns its
// rcode.
func (h *Handler) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	m := h.Answer(r)
	if err := w.WriteMsg(m); err != nil {
		return dns.RcodeServerFailure, err
	}
	return m.Rcode, nil
}

// Answer is the reply to r.
func (h *Handler) Answer(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	if len(r.Question) != 1 || r.Opcode != dns.OpcodeQuery {
		m.SetRcode(r, dns.RcodeNotImplemented)
		if len(r.Question) != 1 {
			m.Rcode = dns.RcodeFormatError
		}
		return m
	}
	q := r.Question[0]
	qname := strings.ToLower(q.Name)
	if !dns.IsSubDomain(h.Zone, qname) {
		m.Rcode = dns.RcodeRefused
		return m
	}
	if h.Ready != nil && !h.Ready() {
		m.Rcode = dns.RcodeServerFailure
		return m
	}
	m.Authoritative = true
	rest := strings.TrimSuffix(strings.TrimSuffix(qname, h.Zone), ".")
	var labels []string
	if rest != "" {
		labels = dns.SplitDomainName(rest)
	}
	res := h.resolve(labels, q.Qtype)
	for _, rr := range res.answer {
		rr.Header().Name = q.Name // keep the asker's case
	}
	m.Answer, m.Extra = res.answer, res.extra
	if !res.exists {
		m.Rcode = dns.RcodeNameError
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{h.soa()}
	}
	return m
}

func (h *Handler) soa() *dns.SOA {
	serial := uint32(1)
	if h.Serial != nil {
		serial = h.Serial()
	}
	return &dns.SOA{
		Hdr:     dns.RR_Header{Name: h.Zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: h.TTL},
		Ns:      "ns.dns." + h.Zone,
		Mbox:    "hostmaster." + h.Zone,
		Serial:  serial,
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  h.TTL,
	}
}

// result is what a name resolves to: exists false is NXDOMAIN; exists with
// no answer is NODATA.
type result struct {
	exists bool
	answer []dns.RR
	extra  []dns.RR
}

var nxdomain = result{}
var nodata = result{exists: true}

// resolve answers the name whose labels below the zone are labels (left to
// right, as written).
func (h *Handler) resolve(labels []string, qtype uint16) result {
	n := len(labels)
	switch {
	case n == 0: // the zone apex
		if qtype == dns.TypeSOA {
			return result{exists: true, answer: []dns.RR{h.soa()}}
		}
		return nodata
	case labels[n-1] != "svc":
		return nxdomain
	case n == 1: // svc.<zone>
		return nodata
	case n == 2: // <ns>.svc.<zone>
		if h.Lookup.Namespace(labels[0]) {
			return nodata
		}
		return nxdomain
	}
	ns, svc := labels[n-2], labels[n-3]
	si := h.Lookup.Import(ns, svc)
	if si == nil {
		return nxdomain
	}
	base := svc + "." + ns + ".svc." + h.Zone
	headless := si.Spec.Type == mcsv1beta1.Headless
	switch n {
	case 3: // <svc>.<ns>.svc
		if headless {
			eps := h.endpoints(si, "", "")
			return h.records(qtype, eps.addrs(), func() []dns.RR { return h.headlessSRV(si, eps, base, "", "") }, func() []dns.RR { return eps.extra(h, base) })
		}
		ips := clusterSetIPs(si)
		return h.records(qtype, ips, func() []dns.RR { return h.clusterSetSRV(si, base, "", "") }, func() []dns.RR { return h.addrRRs(base, ips, dns.TypeANY) })
	case 4: // _<proto>.<svc>.<ns>.svc, or <cluster>.<svc>.<ns>.svc
		l := labels[0]
		if proto, ok := strings.CutPrefix(l, "_"); ok {
			if slices.ContainsFunc(si.Spec.Ports, func(p mcsv1beta1.ServicePort) bool {
				return strings.EqualFold(protocol(p.Protocol), proto) && p.Name != ""
			}) {
				return nodata
			}
			return nxdomain
		}
		if headless && len(h.endpoints(si, l, "").list) > 0 {
			return nodata
		}
		return nxdomain
	case 5: // _<port>._<proto>.<svc>.<ns>.svc, or <host>.<cluster>.<svc>.<ns>.svc
		if port, ok := strings.CutPrefix(labels[0], "_"); ok {
			proto, ok := strings.CutPrefix(labels[1], "_")
			if !ok || !slices.ContainsFunc(si.Spec.Ports, func(p mcsv1beta1.ServicePort) bool { return portMatches(p.Name, p.Protocol, port, proto) }) {
				return nxdomain
			}
			if qtype != dns.TypeSRV && qtype != dns.TypeANY {
				return nodata
			}
			var srv []dns.RR
			var extra []dns.RR
			if headless {
				eps := h.endpoints(si, "", "")
				srv, extra = h.headlessSRV(si, eps, base, port, proto), eps.extra(h, base)
			} else {
				srv, extra = h.clusterSetSRV(si, base, port, proto), h.addrRRs(base, clusterSetIPs(si), dns.TypeANY)
			}
			if len(srv) == 0 {
				return nodata
			}
			return result{exists: true, answer: srv, extra: onlyTargets(extra, srv)}
		}
		if !headless {
			return nxdomain
		}
		eps := h.endpoints(si, labels[1], labels[0])
		if len(eps.list) == 0 {
			return nxdomain
		}
		return h.records(qtype, eps.addrs(), nil, nil)
	}
	return nxdomain
}

// records answers qtype at a name with addrs and, for SRV, srv() with the
// targets' addresses of extra() (both computed only for SRV).
func (h *Handler) records(qtype uint16, addrs []netip.Addr, srv, extra func() []dns.RR) result {
	res := result{exists: true}
	switch qtype {
	case dns.TypeA, dns.TypeAAAA:
		res.answer = h.addrRRs("", addrs, qtype)
	case dns.TypeANY:
		res.answer = h.addrRRs("", addrs, qtype)
		if srv != nil {
			res.answer = append(res.answer, srv()...)
		}
	case dns.TypeSRV:
		if srv != nil {
			res.answer = srv()
			if extra != nil {
				res.extra = onlyTargets(extra(), res.answer)
			}
		}
	}
	return res
}

// addrRRs are A (qtype A), AAAA (qtype AAAA) or both (ANY) records of name.
func (h *Handler) addrRRs(name string, addrs []netip.Addr, qtype uint16) []dns.RR {
	var out []dns.RR
	for _, a := range addrs {
		switch {
		case a.Is4() && (qtype == dns.TypeA || qtype == dns.TypeANY):
			out = append(out, &dns.A{Hdr: h.hdr(name, dns.TypeA), A: a.AsSlice()})
		case a.Is6() && (qtype == dns.TypeAAAA || qtype == dns.TypeANY):
			out = append(out, &dns.AAAA{Hdr: h.hdr(name, dns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	return out
}

func (h *Handler) hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: h.TTL}
}

// clusterSetIPs are the valid addresses of spec.ips, sorted.
func clusterSetIPs(si *mcsv1beta1.ServiceImport) []netip.Addr {
	var out []netip.Addr
	for _, s := range si.Spec.IPs {
		if a, err := netip.ParseAddr(s); err == nil && !a.Is4In6() {
			out = append(out, a.WithZone(""))
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// clusterSetSRV: one SRV per port matching port/proto (both empty: every
// port), target the service name.
func (h *Handler) clusterSetSRV(si *mcsv1beta1.ServiceImport, base, port, proto string) []dns.RR {
	var out []dns.RR
	for _, p := range si.Spec.Ports {
		if port != "" && !portMatches(p.Name, p.Protocol, port, proto) {
			continue
		}
		out = append(out, &dns.SRV{Hdr: h.hdr("", dns.TypeSRV), Priority: 0, Port: uint16(p.Port), Target: base})
	}
	return weigh(out)
}

// headlessSRV: one SRV per ready endpoint and port matching port/proto
// (both empty: every port of the import), the endpoint's own port.
func (h *Handler) headlessSRV(si *mcsv1beta1.ServiceImport, eps endpointSet, base, port, proto string) []dns.RR {
	var out []dns.RR
	seen := map[string]bool{}
	for _, e := range eps.list {
		if !e.named {
			continue
		}
		target := e.host + "." + e.cluster + "." + base
		for _, p := range e.ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			pr := corev1.ProtocolTCP
			if p.Protocol != nil {
				pr = *p.Protocol
			}
			if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
				continue
			}
			if port != "" && !portMatches(name, pr, port, proto) {
				continue
			}
			if port == "" && !slices.ContainsFunc(si.Spec.Ports, func(sp mcsv1beta1.ServicePort) bool { return sp.Name == name && protocol(sp.Protocol) == string(pr) }) {
				continue
			}
			key := target + ":" + strconv.Itoa(int(*p.Port)) + "/" + string(pr)
			if seen[key] {
				continue
			}
			seen[key] = true
			out = append(out, &dns.SRV{Hdr: h.hdr("", dns.TypeSRV), Priority: 0, Port: uint16(*p.Port), Target: target})
		}
	}
	return weigh(out)
}

// weigh gives the records of one priority equal weights summing to about
// 100, as the kubernetes plugin does.
func weigh(srv []dns.RR) []dns.RR {
	if len(srv) == 0 {
		return nil
	}
	w := uint16(100 / len(srv))
	if w == 0 {
		w = 1
	}
	for _, rr := range srv {
		rr.(*dns.SRV).Weight = w
	}
	return srv
}

// onlyTargets keeps the records of extra whose owner is an SRV target.
func onlyTargets(extra, srv []dns.RR) []dns.RR {
	targets := map[string]bool{}
	for _, rr := range srv {
		if s, ok := rr.(*dns.SRV); ok {
			targets[s.Target] = true
		}
	}
	var out []dns.RR
	for _, rr := range extra {
		if targets[rr.Header().Name] {
			out = append(out, rr)
		}
	}
	return out
}

func protocol(p corev1.Protocol) string {
	if p == "" {
		return string(corev1.ProtocolTCP)
	}
	return string(p)
}

// portMatches reports whether a port named name with protocol pr is
// _<port>._<proto>. Unnamed ports have no SRV name.
func portMatches(name string, pr corev1.Protocol, port, proto string) bool {
	return name != "" && strings.EqualFold(name, port) && strings.EqualFold(protocol(pr), proto)
}

// endpoint is one ready endpoint of a source cluster, all its addresses
// (of every slice, so both families) under one name.
type endpoint struct {
	cluster string
	host    string // the hostname, or the address with dashes
	named   bool   // cluster is a DNS label: host.cluster.<svc> exists
	addrs   []netip.Addr
	ports   []discoveryv1.EndpointPort
}

type endpointSet struct{ list []*endpoint }

// endpoints are the ready endpoints of si's slices, of source cluster
// cluster and named host when those are not empty.
func (h *Handler) endpoints(si *mcsv1beta1.ServiceImport, cluster, host string) endpointSet {
	byName := map[string]*endpoint{}
	var order []string
	for _, es := range h.Lookup.Slices(si.Namespace, si.Name) {
		src := es.Labels[mcsv1beta1.LabelSourceCluster]
		if src == "" || (cluster != "" && src != cluster) {
			continue
		}
		// A cluster ID that is no DNS label (label values may hold dots
		// and upper case) cannot be part of a name: its endpoints answer
		// only under the service's own name.
		named := isLabel(src)
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			var addrs []netip.Addr
			for _, s := range ep.Addresses {
				if a, err := netip.ParseAddr(s); err == nil && !a.Is4In6() && a.Zone() == "" {
					addrs = append(addrs, a)
				}
			}
			if len(addrs) == 0 {
				continue
			}
			var name string
			if ep.Hostname != nil && isLabel(*ep.Hostname) {
				name = *ep.Hostname
			} else {
				name = dashed(addrs[0])
			}
			if host != "" && name != host {
				continue
			}
			key := src + "/" + name
			e := byName[key]
			if e == nil {
				e = &endpoint{cluster: src, host: name, named: named}
				byName[key] = e
				order = append(order, key)
			}
			e.addrs = append(e.addrs, addrs...)
			e.ports = append(e.ports, es.Ports...)
		}
	}
	slices.Sort(order)
	set := endpointSet{}
	for _, k := range order {
		e := byName[k]
		slices.SortFunc(e.addrs, netip.Addr.Compare)
		e.addrs = slices.Compact(e.addrs)
		set.list = append(set.list, e)
	}
	return set
}

// addrs are the addresses of every endpoint, sorted, without duplicates.
func (s endpointSet) addrs() []netip.Addr {
	var out []netip.Addr
	for _, e := range s.list {
		out = append(out, e.addrs...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// extra are the address records of every endpoint's own name.
func (s endpointSet) extra(h *Handler, base string) []dns.RR {
	var out []dns.RR
	for _, e := range s.list {
		if !e.named {
			continue
		}
		out = append(out, h.addrRRs(e.host+"."+e.cluster+"."+base, e.addrs, dns.TypeANY)...)
	}
	return out
}

// dashed is an address as one DNS label: 10-1-2-3, fd00--1.
func dashed(a netip.Addr) string {
	return strings.Map(func(r rune) rune {
		if r == '.' || r == ':' {
			return '-'
		}
		return r
	}, a.String())
}

// isLabel reports whether s is a lower-case RFC 1123 DNS label, as
// Kubernetes requires of hostnames and KEP-2149 of cluster IDs.
func isLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}
