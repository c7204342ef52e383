package mirror

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"meshd.io/meshd/pkg/k8s/liveness"
)

type mirrorFuzz []byte

func (b *mirrorFuzz) n(m int) int {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return int(c) % m
}

// boolPtr is nil, false or true.
func (b *mirrorFuzz) boolPtr() *bool {
	switch b.n(3) {
	case 0:
		return nil
	case 1:
		return ptr(false)
	}
	return ptr(true)
}

func (b *mirrorFuzz) ip() string {
	switch b.n(6) {
	case 0:
		return fmt.Sprintf("fd42::%x", b.n(4))
	case 1:
		return fmt.Sprintf("::ffff:10.42.0.%d", b.n(4))
	case 2:
		return []string{"", "None", "not-an-ip", "10.42.0.1/24"}[b.n(4)]
	}
	return fmt.Sprintf("10.42.0.%d", b.n(4))
}

func (b *mirrorFuzz) servicePorts() []corev1.ServicePort {
	var ps []corev1.ServicePort
	for range b.n(4) {
		p := corev1.ServicePort{Name: []string{"", "http", "dns"}[b.n(3)], Protocol: []corev1.Protocol{"", corev1.ProtocolTCP, corev1.ProtocolUDP}[b.n(3)], Port: int32(b.n(3) + 52)}
		if b.n(3) == 0 {
			p.AppProtocol = ptr("h2c")
		}
		ps = append(ps, p)
	}
	return ps
}

// slicePorts is one of a few port sets (slices of one Service usually
// share theirs), now and then with fields left unset.
func (b *mirrorFuzz) slicePorts() []discoveryv1.EndpointPort {
	switch b.n(4) {
	case 0:
		return nil
	case 1:
		var p discoveryv1.EndpointPort
		if b.n(2) == 1 {
			p.Name = ptr([]string{"", "http"}[b.n(2)])
		}
		if b.n(2) == 1 {
			p.Protocol = ptr([]corev1.Protocol{"", corev1.ProtocolUDP}[b.n(2)])
		}
		if b.n(3) > 0 {
			p.Port = ptr(int32(8080 + b.n(2)))
		}
		return []discoveryv1.EndpointPort{p}
	}
	return []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}}
}

// remoteSlices decodes a remote Service's EndpointSlices: both families and
// FQDN, several slices per family (sharing addresses, as during a rollout),
// endpoints with every combination of conditions, sometimes more than one
// slice's worth of endpoints.
func (b *mirrorFuzz) remoteSlices() []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for i := range b.n(5) {
		at := []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN}[b.n(4)]
		sl := &discoveryv1.EndpointSlice{AddressType: at, Ports: b.slicePorts()}
		sl.Name = fmt.Sprintf("remote-%d", i)
		n := b.n(6)
		if n == 5 {
			n = 100 + b.n(60) // more than one mirrored slice
		}
		for j := range n {
			ep := discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: b.boolPtr(), Serving: b.boolPtr(), Terminating: b.boolPtr()}}
			switch at {
			case discoveryv1.AddressTypeIPv6:
				ep.Addresses = []string{fmt.Sprintf("fd42::%x", j%100+b.n(3))}
			default:
				ep.Addresses = []string{fmt.Sprintf("10.42.%d.%d", j/100, j%100+b.n(3))}
			}
			if b.n(8) == 0 {
				ep.Addresses = nil
			} else if b.n(8) == 0 {
				ep.Addresses = append(ep.Addresses, "10.43.0.1")
			}
			if b.n(3) == 0 {
				ep.Hostname = ptr(fmt.Sprintf("pod-%d", b.n(3)))
			}
			if b.n(4) == 0 {
				ep.NodeName = ptr("remote-node")
			}
			sl.Endpoints = append(sl.Endpoints, ep)
		}
		out = append(out, sl)
	}
	return out
}

// FuzzDesiredSlices computes a mirror's Service and EndpointSlices from a
// fuzzed source Service and remote EndpointSlices. They are deterministic,
// also in the order the remote slices are listed (an informer lists them in
// random order); well formed (valid unique names, meshd's labels and
// annotation, one address family each, at most 100 endpoints, every
// condition set, no remote node or pod reference); their endpoints come from
// the source (its cluster IPs, or for a headless Service the remote
// endpoints' addresses, one endpoint per address); and they are up to date
// with themselves.
func FuzzDesiredSlices(f *testing.F) {
	f.Add("web", false, []byte{})
	f.Add("web", true, []byte{1, 0, 2, 1, 1, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add("db", false, []byte("\x01\x01headless with slices sharing endpoints across families and ports"))
	f.Add("dns", false, []byte{0, 3, 0, 1, 2, 0, 5, 4, 2, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1})
	f.Add("Bad_Name", false, []byte{1})
	f.Fuzz(func(t *testing.T, svcName string, suffix bool, data []byte) {
		b := mirrorFuzz(data)
		k := Key{Cluster: []string{"west", "east-1"}[b.n(2)], Namespace: []string{"default", "team-a"}[b.n(2)], Name: svcName}
		name := MirrorName(k, suffix)
		if validMirrorName(name) != nil || validation.IsDNS1035Label(svcName) != nil {
			return // the controller reports and skips these
		}
		headless := b.n(3) > 0
		src := &corev1.Service{}
		src.Name, src.Namespace = k.Name, k.Namespace
		if headless {
			src.Spec.ClusterIP = corev1.ClusterIPNone
			src.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
		} else {
			for range b.n(3) {
				src.Spec.ClusterIPs = append(src.Spec.ClusterIPs, b.ip())
			}
			if len(src.Spec.ClusterIPs) > 0 {
				src.Spec.ClusterIP = src.Spec.ClusterIPs[0]
			} else {
				src.Spec.ClusterIP = b.ip()
			}
		}
		src.Spec.Ports = b.servicePorts()
		if b.n(2) == 1 {
			src.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}
		remote := b.remoteSlices()
		headless = isHeadless(src) // a ClusterIP of "None" makes it headless too

		svc := desiredService(k, name, src)
		if !serviceUpToDate(svc, svc) || !ownedBy(svc, k) || svc.Name != name || svc.Namespace != k.Namespace {
			t.Fatalf("desired Service is not up to date with itself or not owned: %+v", svc)
		}
		got := desiredSlices(k, name, src, remote)
		if again := desiredSlices(k, name, src, remote); !reflect.DeepEqual(got, again) {
			t.Fatal("desiredSlices is not deterministic")
		}
		shuffled := slices.Clone(remote)
		slices.Reverse(shuffled)
		if len(shuffled) > 2 {
			shuffled[0], shuffled[1] = shuffled[1], shuffled[0]
		}
		if other := desiredSlices(k, name, src, shuffled); !reflect.DeepEqual(got, other) {
			t.Fatalf("desired slices depend on the order of the remote slices:\n%s\n---\n%s", dumpSlices(got), dumpSlices(other))
		}

		// Where endpoints may come from.
		sourceAddrs := map[discoveryv1.AddressType][][]string{}
		if headless {
			for _, sl := range remote {
				for _, ep := range sl.Endpoints {
					sourceAddrs[sl.AddressType] = append(sourceAddrs[sl.AddressType], ep.Addresses)
				}
			}
		} else {
			for _, ip := range append(slices.Clone(src.Spec.ClusterIPs), src.Spec.ClusterIP) {
				if a, err := netip.ParseAddr(ip); err == nil {
					at := discoveryv1.AddressTypeIPv6
					if a.Unmap().Is4() {
						at = discoveryv1.AddressTypeIPv4
					}
					sourceAddrs[at] = append(sourceAddrs[at], []string{ip})
				}
			}
		}

		names := map[string]bool{}
		firsts := map[string]bool{}
		families := map[discoveryv1.AddressType]int{}
		for _, sl := range got {
			if msgs := validation.IsDNS1123Subdomain(sl.Name); len(msgs) > 0 || names[sl.Name] {
				t.Errorf("slice name %q: %v (duplicate: %v)", sl.Name, msgs, names[sl.Name])
			}
			names[sl.Name] = true
			if sl.Namespace != k.Namespace || !ownedBy(sl, k) ||
				sl.Labels[discoveryv1.LabelServiceName] != name || sl.Labels[discoveryv1.LabelManagedBy] != ManagedByMirror ||
				sl.Labels[liveness.LabelManagedBy] != liveness.ManagedBy || sl.Annotations[AnnotationMirroredFrom] != k.source() {
				t.Errorf("slice %s: namespace %q, labels %v, annotations %v", sl.Name, sl.Namespace, sl.Labels, sl.Annotations)
			}
			for lk, lv := range sl.Labels {
				if msgs := validation.IsValidLabelValue(lv); len(msgs) > 0 {
					t.Errorf("slice %s: label %s=%q: %v", sl.Name, lk, lv, msgs)
				}
			}
			if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
				t.Errorf("slice %s: address type %q", sl.Name, sl.AddressType)
			}
			families[sl.AddressType]++
			if len(sl.Endpoints) > maxEndpointsPerSlice {
				t.Errorf("slice %s has %d endpoints", sl.Name, len(sl.Endpoints))
			}
			for _, p := range sl.Ports {
				if p.Name == nil || p.Protocol == nil || *p.Protocol == "" {
					t.Errorf("slice %s: port %+v not normalized", sl.Name, p)
				}
			}
			for _, ep := range sl.Endpoints {
				c := ep.Conditions
				if len(ep.Addresses) == 0 || c.Ready == nil || c.Serving == nil || c.Terminating == nil || ep.NodeName != nil || ep.TargetRef != nil {
					t.Errorf("slice %s: endpoint %+v", sl.Name, ep)
				}
				if !slices.ContainsFunc(sourceAddrs[sl.AddressType], func(as []string) bool { return slices.Equal(as, ep.Addresses) }) {
					t.Errorf("slice %s: endpoint %v is not from the source %v", sl.Name, ep.Addresses, sourceAddrs[sl.AddressType])
				}
				first := string(sl.AddressType) + "|" + portsSignature(sl.Ports) + "|" + ep.Addresses[0]
				if firsts[first] {
					t.Errorf("slice %s: address %s twice", sl.Name, ep.Addresses[0])
				}
				firsts[first] = true
			}
			if !sliceUpToDate(sl, sl) {
				t.Errorf("slice %s is not up to date with itself", sl.Name)
			}
		}
		if !headless && (families[discoveryv1.AddressTypeIPv4] > 1 || families[discoveryv1.AddressTypeIPv6] > 1) {
			t.Errorf("more than one slice per family for a cluster IP Service: %v", families)
		}
	})
}

func dumpSlices(ss []*discoveryv1.EndpointSlice) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "%s %s ports=%s\n", s.Name, s.AddressType, portsSignature(s.Ports))
		for _, ep := range s.Endpoints {
			fmt.Fprintf(&b, "  %v ready=%v serving=%v terminating=%v hostname=%v\n", ep.Addresses, *ep.Conditions.Ready, *ep.Conditions.Serving, *ep.Conditions.Terminating, deref(ep.Hostname))
		}
	}
	return b.String()
}
