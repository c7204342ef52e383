package mirror

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
)

// Labels and annotations of the mirrors.
const (
	// LabelMirroredFromCluster names the source cluster of a mirror.
	LabelMirroredFromCluster = convert.AnnotationPrefix + "mirrored-from-cluster"
	// AnnotationMirroredFrom is the source Service of a mirror, namespace/name.
	AnnotationMirroredFrom = convert.AnnotationPrefix + "mirrored-from"
	// ManagedByMirror is the endpointslice.kubernetes.io/managed-by value of
	// the EndpointSlices of mirrors, so the EndpointSlice controllers leave
	// them alone. (A label value cannot contain "/", so not "meshd.io/mirror";
	// the built-in controllers use the same <name>.<domain> form, e.g.
	// endpointslice-controller.k8s.io.)
	ManagedByMirror = "mirror.meshd.io"
	// maxEndpointsPerSlice is the EndpointSlice controller's default.
	maxEndpointsPerSlice = 100
)

// Key names an exported Service: its cluster, namespace and name there.
type Key struct {
	Cluster, Namespace, Name string
}

func (k Key) String() string { return k.Cluster + "/" + k.Namespace + "/" + k.Name }

// source is the mirrored-from annotation value.
func (k Key) source() string { return k.Namespace + "/" + k.Name }

// MirrorName is the name of the local mirror of k: the source name, or with
// suffix <name>-<cluster>. The namespace is always the source's.
func MirrorName(k Key, suffix bool) string {
	if suffix {
		return k.Name + "-" + k.Cluster
	}
	return k.Name
}

func validMirrorName(name string) error {
	if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
		return fmt.Errorf("mirror name %q is not a valid Service name: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// ownerKey reads the source of a mirror Service or EndpointSlice from its
// labels and annotation; ok is false for objects meshd did not create.
func ownerKey(o metav1.Object) (Key, bool) {
	l := o.GetLabels()
	cluster := l[LabelMirroredFromCluster]
	if cluster == "" || l[liveness.LabelManagedBy] != liveness.ManagedBy {
		return Key{}, false
	}
	ns, name, ok := strings.Cut(o.GetAnnotations()[AnnotationMirroredFrom], "/")
	if !ok || ns == "" || name == "" {
		return Key{}, false
	}
	return Key{Cluster: cluster, Namespace: ns, Name: name}, true
}

// ownedBy reports whether o is meshd's mirror of k.
func ownedBy(o metav1.Object, k Key) bool {
	ok2, ok := ownerKey(o)
	return ok && ok2 == k
}

func mirrorMeta(k Key, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:        name,
		Namespace:   k.Namespace,
		Labels:      map[string]string{liveness.LabelManagedBy: liveness.ManagedBy, LabelMirroredFromCluster: k.Cluster},
		Annotations: map[string]string{AnnotationMirroredFrom: k.source()},
	}
}

func isHeadless(s *corev1.Service) bool { return s.Spec.ClusterIP == corev1.ClusterIPNone }

// desiredService is the mirror of the remote Service src: no selector, the
// same ports, headless when src is.
func desiredService(k Key, name string, src *corev1.Service) *corev1.Service {
	s := &corev1.Service{ObjectMeta: mirrorMeta(k, name)}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.SessionAffinity = src.Spec.SessionAffinity
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP && src.Spec.SessionAffinityConfig != nil {
		s.Spec.SessionAffinityConfig = src.Spec.SessionAffinityConfig.DeepCopy()
	}
	if isHeadless(src) {
		s.Spec.ClusterIP = corev1.ClusterIPNone
		s.Spec.PublishNotReadyAddresses = src.Spec.PublishNotReadyAddresses
	}
	for _, p := range src.Spec.Ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Protocol: protocol(p.Protocol), AppProtocol: p.AppProtocol,
			Port: p.Port, TargetPort: intstr.FromInt32(p.Port),
		})
	}
	return s
}

func protocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// serviceUpToDate compares the fields of the mirror meshd sets.
func serviceUpToDate(have, want *corev1.Service) bool {
	if have.Spec.Selector != nil || have.Spec.Type != want.Spec.Type ||
		have.Spec.SessionAffinity != cmp.Or(want.Spec.SessionAffinity, have.Spec.SessionAffinity) ||
		(want.Spec.SessionAffinityConfig != nil && !equality.Semantic.DeepEqual(have.Spec.SessionAffinityConfig, want.Spec.SessionAffinityConfig)) ||
		have.Spec.PublishNotReadyAddresses != want.Spec.PublishNotReadyAddresses ||
		isHeadless(have) != isHeadless(want) || len(have.Spec.Ports) != len(want.Spec.Ports) ||
		!metaUpToDate(&have.ObjectMeta, &want.ObjectMeta) {
		return false
	}
	for i, p := range have.Spec.Ports {
		w := want.Spec.Ports[i]
		if p.Name != w.Name || protocol(p.Protocol) != w.Protocol || p.Port != w.Port ||
			p.TargetPort != w.TargetPort || !equalPtr(p.AppProtocol, w.AppProtocol) {
			return false
		}
	}
	return true
}

// updateService returns have with the fields meshd sets taken from want.
func updateService(have, want *corev1.Service) *corev1.Service {
	s := have.DeepCopy()
	mergeMeta(&s.ObjectMeta, &want.ObjectMeta)
	s.Spec.Selector = nil
	s.Spec.Type = want.Spec.Type
	s.Spec.Ports = want.Spec.Ports
	if want.Spec.SessionAffinity != "" {
		s.Spec.SessionAffinity = want.Spec.SessionAffinity
	}
	s.Spec.SessionAffinityConfig = want.Spec.SessionAffinityConfig
	s.Spec.PublishNotReadyAddresses = want.Spec.PublishNotReadyAddresses
	// Fields of other Service types the API server refuses on a ClusterIP one.
	s.Spec.ExternalName = ""
	s.Spec.ExternalTrafficPolicy = ""
	s.Spec.HealthCheckNodePort = 0
	s.Spec.LoadBalancerClass = nil
	s.Spec.AllocateLoadBalancerNodePorts = nil
	for i := range s.Spec.Ports {
		s.Spec.Ports[i].NodePort = 0
	}
	return s
}

func metaUpToDate(have, want *metav1.ObjectMeta) bool {
	for k, v := range want.Labels {
		if have.Labels[k] != v {
			return false
		}
	}
	for k, v := range want.Annotations {
		if have.Annotations[k] != v {
			return false
		}
	}
	return true
}

func mergeMeta(have, want *metav1.ObjectMeta) {
	if have.Labels == nil {
		have.Labels = map[string]string{}
	}
	for k, v := range want.Labels {
		have.Labels[k] = v
	}
	if have.Annotations == nil {
		have.Annotations = map[string]string{}
	}
	for k, v := range want.Annotations {
		have.Annotations[k] = v
	}
}

func equalPtr[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

// readiness summarises the remote endpoints of a Service: ready when any
// endpoint is ready, serving when any is serving.
func readiness(remote []*discoveryv1.EndpointSlice) (ready, serving bool) {
	for _, sl := range remote {
		for _, ep := range sl.Endpoints {
			r := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			ready = ready || r
			serving = serving || (ep.Conditions.Serving == nil && r) || (ep.Conditions.Serving != nil && *ep.Conditions.Serving)
		}
	}
	return ready, serving
}

func addressType(ip string) (discoveryv1.AddressType, bool) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return "", false
	}
	if a.Is4() || a.Is4In6() {
		return discoveryv1.AddressTypeIPv4, true
	}
	return discoveryv1.AddressTypeIPv6, true
}

// desiredSlices are the EndpointSlices of the mirror of src: one endpoint
// per cluster IP of src (per address family), ready when src has a ready
// endpoint; for a headless src, the remote endpoints themselves (pod IPs,
// with their conditions and hostnames; remote node and pod references are
// dropped). Names are deterministic, so desired and actual compare by name.
func desiredSlices(k Key, name string, src *corev1.Service, remote []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	if isHeadless(src) {
		return headlessSlices(k, name, remote)
	}
	ready, serving := readiness(remote)
	var ports []discoveryv1.EndpointPort
	for _, p := range src.Spec.Ports {
		ports = append(ports, discoveryv1.EndpointPort{
			Name: ptr(p.Name), Protocol: ptr(protocol(p.Protocol)), Port: ptr(p.Port), AppProtocol: p.AppProtocol,
		})
	}
	ips := src.Spec.ClusterIPs
	if len(ips) == 0 && src.Spec.ClusterIP != "" {
		ips = []string{src.Spec.ClusterIP}
	}
	var out []*discoveryv1.EndpointSlice
	seen := map[discoveryv1.AddressType]bool{}
	for _, ip := range ips {
		at, ok := addressType(ip)
		if !ok || seen[at] {
			continue
		}
		seen[at] = true
		out = append(out, newSlice(k, name, at, ports, []discoveryv1.Endpoint{{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(false)},
		}}, ""))
	}
	return out
}

func headlessSlices(k Key, name string, remote []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	type group struct {
		at    discoveryv1.AddressType
		ports []discoveryv1.EndpointPort
		eps   map[string]discoveryv1.Endpoint // by first address
	}
	groups := map[string]*group{}
	for _, sl := range remote {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		ports := normalPorts(sl.Ports)
		gk := string(sl.AddressType) + "|" + portsSignature(ports)
		g := groups[gk]
		if g == nil {
			g = &group{at: sl.AddressType, ports: ports, eps: map[string]discoveryv1.Endpoint{}}
			groups[gk] = g
		}
		for _, ep := range sl.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			r := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			s := r
			if ep.Conditions.Serving != nil {
				s = *ep.Conditions.Serving
			}
			t := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			e := discoveryv1.Endpoint{
				Addresses:  slices.Clone(ep.Addresses),
				Hostname:   ep.Hostname,
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(r), Serving: ptr(s), Terminating: ptr(t)},
			}
			// An address in two remote slices (as during a rollout) keeps
			// the endpoint chosen by content: the informer lists the
			// slices in random order.
			if old, dup := g.eps[ep.Addresses[0]]; !dup || compareEndpoints(e, old) < 0 {
				g.eps[ep.Addresses[0]] = e
			}
		}
	}
	gks := make([]string, 0, len(groups))
	for gk := range groups {
		gks = append(gks, gk)
	}
	slices.Sort(gks)
	var out []*discoveryv1.EndpointSlice
	for _, gk := range gks {
		g := groups[gk]
		addrs := make([]string, 0, len(g.eps))
		for a := range g.eps {
			addrs = append(addrs, a)
		}
		slices.Sort(addrs)
		for i := 0; i < len(addrs) || i == 0; i += maxEndpointsPerSlice {
			chunk := addrs[i:min(i+maxEndpointsPerSlice, len(addrs))]
			eps := make([]discoveryv1.Endpoint, len(chunk))
			for j, a := range chunk {
				eps[j] = g.eps[a]
			}
			out = append(out, newSlice(k, name, g.at, g.ports, eps, fmt.Sprintf("%s|%d", portsSignature(g.ports), i/maxEndpointsPerSlice)))
		}
	}
	return out
}

// compareEndpoints orders normalized endpoints of one address: ready,
// serving and not terminating first, then by addresses and hostname.
func compareEndpoints(a, b discoveryv1.Endpoint) int {
	hasHostname := func(e discoveryv1.Endpoint) int {
		if e.Hostname != nil {
			return 1
		}
		return 0
	}
	rank := func(e discoveryv1.Endpoint) int {
		r := 0
		if !*e.Conditions.Ready {
			r += 4
		}
		if !*e.Conditions.Serving {
			r += 2
		}
		if *e.Conditions.Terminating {
			r++
		}
		return r
	}
	return cmp.Or(
		cmp.Compare(rank(a), rank(b)),
		slices.Compare(a.Addresses, b.Addresses),
		cmp.Compare(deref(a.Hostname), deref(b.Hostname)),
		cmp.Compare(hasHostname(a), hasHostname(b)),
	)
}

func normalPorts(ps []discoveryv1.EndpointPort) []discoveryv1.EndpointPort {
	out := make([]discoveryv1.EndpointPort, len(ps))
	for i, p := range ps {
		out[i] = discoveryv1.EndpointPort{Name: ptr(deref(p.Name)), Protocol: ptr(protocol(deref(p.Protocol))), Port: p.Port, AppProtocol: p.AppProtocol}
	}
	slices.SortFunc(out, func(a, b discoveryv1.EndpointPort) int { return strings.Compare(*a.Name, *b.Name) })
	return out
}

func portsSignature(ps []discoveryv1.EndpointPort) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "%s/%s/%d/%s,", *p.Name, *p.Protocol, deref(p.Port), deref(p.AppProtocol))
	}
	return b.String()
}

// newSlice names a slice by its source, address type and group (headless:
// port set and chunk; else empty, so a port change updates the slice in
// place).
func newSlice(k Key, name string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps []discoveryv1.Endpoint, group string) *discoveryv1.EndpointSlice {
	h := sha256.Sum256(fmt.Appendf(nil, "%s|%s|%s", k, at, group))
	meta := mirrorMeta(k, name+"-"+hex.EncodeToString(h[:])[:10])
	meta.Labels[discoveryv1.LabelServiceName] = name
	meta.Labels[discoveryv1.LabelManagedBy] = ManagedByMirror
	return &discoveryv1.EndpointSlice{ObjectMeta: meta, AddressType: at, Ports: ports, Endpoints: eps}
}

// sliceUpToDate compares what meshd sets on an EndpointSlice.
func sliceUpToDate(have, want *discoveryv1.EndpointSlice) bool {
	if have.AddressType != want.AddressType || !metaUpToDate(&have.ObjectMeta, &want.ObjectMeta) ||
		len(have.Ports) != len(want.Ports) || len(have.Endpoints) != len(want.Endpoints) {
		return false
	}
	for i, p := range have.Ports {
		w := want.Ports[i]
		if deref(p.Name) != deref(w.Name) || protocol(deref(p.Protocol)) != deref(w.Protocol) ||
			!equalPtr(p.Port, w.Port) || !equalPtr(p.AppProtocol, w.AppProtocol) {
			return false
		}
	}
	for i, e := range have.Endpoints {
		w := want.Endpoints[i]
		if !slices.Equal(e.Addresses, w.Addresses) || !equalPtr(e.Hostname, w.Hostname) ||
			!equalPtr(e.Conditions.Ready, w.Conditions.Ready) || !equalPtr(e.Conditions.Serving, w.Conditions.Serving) ||
			!equalPtr(e.Conditions.Terminating, w.Conditions.Terminating) || e.NodeName != nil || e.TargetRef != nil {
			return false
		}
	}
	return true
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
