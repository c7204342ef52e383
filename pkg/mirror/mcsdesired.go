package mirror

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"meshd.io/meshd/pkg/k8s/liveness"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// MCS API names meshd follows (KEP-1645 and sigs.k8s.io/mcs-api).
const (
	// AnnotationDerivedService names, on a ServiceImport, the local Service
	// that carries its ClusterSetIP (the mcs-api reference controller's and
	// Cilium's convention; Gateway API implementations read it).
	AnnotationDerivedService = "multicluster.kubernetes.io/derived-service"
	// LabelServiceName and LabelSourceCluster label the imported
	// EndpointSlices (mcsv1beta1.LabelServiceName, LabelSourceCluster).
	LabelServiceName   = mcsv1beta1.LabelServiceName
	LabelSourceCluster = mcsv1beta1.LabelSourceCluster
)

// derivedServiceName is the name of the Service carrying the ClusterSetIP of
// the ServiceImport nn: "derived-" and 10 characters of a hash of
// namespace/name, as the mcs-api reference controller names it, so tools
// that guess the name agree.
func derivedServiceName(nn types.NamespacedName) string {
	h := sha256.Sum256([]byte(nn.String()))
	return "derived-" + strings.ToLower(base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:]))[:10]
}

// constituent is one cluster's export of a Service.
type constituent struct {
	cluster  string
	created  time.Time // the ServiceExport's creation
	svc      *corev1.Service
	slices   []*discoveryv1.EndpointSlice
	notReady bool // the data plane does not reach the cluster: every endpoint not ready
	// deadNode: the cluster's liveness data says the node is dead (its
	// endpoints are stale).
	deadNode func(node string) bool
	// labels and annotations are the export's exportedLabels and
	// exportedAnnotations.
	labels, annotations map[string]string
}

func importType(s *corev1.Service) mcsv1beta1.ServiceImportType {
	if isHeadless(s) {
		return mcsv1beta1.Headless
	}
	return mcsv1beta1.ClusterSetIP
}

// merged is the ServiceImport the constituents make, and each cluster's
// conflicts with it.
type merged struct {
	spec mcsv1beta1.ServiceImportSpec
	// labels and annotations of the ServiceImport: the oldest export's
	// exportedLabels and exportedAnnotations.
	labels, annotations map[string]string
	winner              string
	conflicts           map[string][]string // cluster → reasons
	messages            map[string][]string
}

// mergeExports merges the constituents, oldest export first (ties by
// cluster ID): the oldest export's type, session affinity, internal traffic
// policy and traffic distribution win; ports are the union by name, the
// oldest definition of a name winning, and a port that would make the union
// an invalid Service (its number and protocol already there under another
// name, or an unnamed port among several) is left out as a port conflict;
// IP families are the union. A
// constituent that disagrees gets a conflict reason (upstream's reasons).
func mergeExports(cs []constituent) merged {
	slices.SortStableFunc(cs, func(a, b constituent) int {
		return cmp.Or(a.created.Compare(b.created), cmp.Compare(a.cluster, b.cluster))
	})
	m := merged{conflicts: map[string][]string{}, messages: map[string][]string{}}
	if len(cs) == 0 {
		return m
	}
	w := cs[0]
	m.winner = w.cluster
	m.spec.Type = importType(w.svc)
	m.spec.SessionAffinity = cmp.Or(w.svc.Spec.SessionAffinity, corev1.ServiceAffinityNone)
	if m.spec.SessionAffinity == corev1.ServiceAffinityClientIP && w.svc.Spec.SessionAffinityConfig != nil {
		m.spec.SessionAffinityConfig = w.svc.Spec.SessionAffinityConfig.DeepCopy()
	}
	m.spec.InternalTrafficPolicy = w.svc.Spec.InternalTrafficPolicy
	m.spec.TrafficDistribution = w.svc.Spec.TrafficDistribution
	m.labels, m.annotations = w.labels, w.annotations
	byName := map[string]mcsv1beta1.ServicePort{}
	families := map[corev1.IPFamily]bool{}
	for i, c := range cs {
		add := func(reason, format string, args ...any) {
			m.conflicts[c.cluster] = append(m.conflicts[c.cluster], reason)
			m.messages[c.cluster] = append(m.messages[c.cluster], fmt.Sprintf(format, args...))
		}
		if i > 0 {
			if t := importType(c.svc); t != m.spec.Type {
				add(string(mcsv1beta1.ServiceExportReasonTypeConflict), "type %s, using %s", t, m.spec.Type)
			}
			if a := cmp.Or(c.svc.Spec.SessionAffinity, corev1.ServiceAffinityNone); a != m.spec.SessionAffinity {
				add(string(mcsv1beta1.ServiceExportReasonSessionAffinityConflict), "session affinity %s, using %s", a, m.spec.SessionAffinity)
			} else if a == corev1.ServiceAffinityClientIP && !equality.Semantic.DeepEqual(c.svc.Spec.SessionAffinityConfig, m.spec.SessionAffinityConfig) {
				add(string(mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict), "another session affinity config")
			}
			if !equalPtr(orDefault(c.svc.Spec.InternalTrafficPolicy), orDefault(m.spec.InternalTrafficPolicy)) {
				add(string(mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict), "internal traffic policy %s, using %s",
					deref(orDefault(c.svc.Spec.InternalTrafficPolicy)), deref(orDefault(m.spec.InternalTrafficPolicy)))
			}
			if !maps.Equal(c.labels, m.labels) {
				add(string(mcsv1beta1.ServiceExportReasonLabelsConflict), "exported labels %v, using %v", c.labels, m.labels)
			}
			if !maps.Equal(c.annotations, m.annotations) {
				add(string(mcsv1beta1.ServiceExportReasonAnnotationsConflict), "exported annotations %v, using %v", c.annotations, m.annotations)
			}
			if !equalPtr(c.svc.Spec.TrafficDistribution, m.spec.TrafficDistribution) {
				add(string(mcsv1beta1.ServiceExportReasonTrafficDistributionConflict), "traffic distribution %q, using %q",
					deref(c.svc.Spec.TrafficDistribution), deref(m.spec.TrafficDistribution))
			}
		}
		portConflict := false
		conflict := func(format string, args ...any) {
			if !portConflict {
				add(string(mcsv1beta1.ServiceExportReasonPortConflict), format, args...)
			}
			portConflict = true
		}
		for _, p := range c.svc.Spec.Ports {
			sp := mcsv1beta1.ServicePort{Name: p.Name, Protocol: protocol(p.Protocol), AppProtocol: p.AppProtocol, Port: p.Port}
			have, ok := byName[p.Name]
			switch {
			case ok && (have.Port != sp.Port || have.Protocol != sp.Protocol || !equalPtr(have.AppProtocol, sp.AppProtocol)):
				conflict("port %q is %d/%s, using %d/%s", p.Name, sp.Port, sp.Protocol, have.Port, have.Protocol)
			case ok:
			default:
				// The union must stay a valid Service: one port number per
				// protocol, and every port named when there are several.
				if other := samePort(m.spec.Ports, sp); other != nil {
					conflict("port %d/%s is named %q, using %q", sp.Port, sp.Protocol, sp.Name, other.Name)
					continue
				}
				if len(m.spec.Ports) > 0 && (sp.Name == "" || slices.ContainsFunc(m.spec.Ports, func(x mcsv1beta1.ServicePort) bool { return x.Name == "" })) {
					conflict("port %q %d/%s cannot join the ports %s: several ports must all be named", sp.Name, sp.Port, sp.Protocol, portList(m.spec.Ports))
					continue
				}
				byName[p.Name] = sp
				m.spec.Ports = append(m.spec.Ports, sp)
			}
		}
		for _, f := range serviceFamilies(c.svc) {
			families[f] = true
		}
	}
	// Families: the oldest export's order, then the other one.
	for _, f := range append(serviceFamilies(w.svc), corev1.IPv4Protocol, corev1.IPv6Protocol) {
		if families[f] && !slices.Contains(m.spec.IPFamilies, f) {
			m.spec.IPFamilies = append(m.spec.IPFamilies, f)
		}
	}
	slices.SortStableFunc(m.spec.Ports, func(a, b mcsv1beta1.ServicePort) int { return strings.Compare(a.Name, b.Name) })
	return m
}

// samePort is the port of ports with p's number and protocol, nil if none.
func samePort(ports []mcsv1beta1.ServicePort, p mcsv1beta1.ServicePort) *mcsv1beta1.ServicePort {
	for i := range ports {
		if ports[i].Port == p.Port && ports[i].Protocol == p.Protocol {
			return &ports[i]
		}
	}
	return nil
}

// portList is ports for a message: "http" 80/TCP, ...
func portList(ports []mcsv1beta1.ServicePort) string {
	out := make([]string, 0, len(ports))
	for _, p := range ports {
		out = append(out, fmt.Sprintf("%q %d/%s", p.Name, p.Port, p.Protocol))
	}
	return strings.Join(out, ", ")
}

func orDefault(p *corev1.ServiceInternalTrafficPolicy) *corev1.ServiceInternalTrafficPolicy {
	if p == nil {
		return ptr(corev1.ServiceInternalTrafficPolicyCluster)
	}
	return p
}

func serviceFamilies(s *corev1.Service) []corev1.IPFamily {
	if len(s.Spec.IPFamilies) > 0 {
		return s.Spec.IPFamilies
	}
	var out []corev1.IPFamily
	for _, ip := range s.Spec.ClusterIPs {
		if at, ok := addressType(ip); ok {
			if f := familyOf(at); !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	if len(out) == 0 {
		out = []corev1.IPFamily{corev1.IPv4Protocol}
	}
	return out
}

func mcsMeta(nn types.NamespacedName, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: name, Namespace: nn.Namespace,
		Labels: map[string]string{liveness.LabelManagedBy: liveness.ManagedBy, LabelServiceName: nn.Name},
	}
}

// desiredDerivedService is the selector-less ClusterIP Service whose
// cluster IP is the ServiceImport's ClusterSetIP; kube-proxy programs it
// from the imported EndpointSlices.
func desiredDerivedService(nn types.NamespacedName, spec *mcsv1beta1.ServiceImportSpec) *corev1.Service {
	s := &corev1.Service{ObjectMeta: mcsMeta(nn, derivedServiceName(nn))}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.SessionAffinity = spec.SessionAffinity
	s.Spec.SessionAffinityConfig = spec.SessionAffinityConfig
	s.Spec.InternalTrafficPolicy = spec.InternalTrafficPolicy
	s.Spec.TrafficDistribution = spec.TrafficDistribution
	// Two families: PreferDualStack without naming them, so that a cluster
	// with one family gives the Service that one (naming a family the
	// cluster lacks is refused: "not configured on this cluster").
	policy := corev1.IPFamilyPolicySingleStack
	if len(spec.IPFamilies) > 1 {
		policy = corev1.IPFamilyPolicyPreferDualStack
	} else {
		s.Spec.IPFamilies = spec.IPFamilies
	}
	s.Spec.IPFamilyPolicy = &policy
	for _, p := range spec.Ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Protocol: p.Protocol, AppProtocol: p.AppProtocol, Port: p.Port, TargetPort: intstr.FromInt32(p.Port),
		})
	}
	return s
}

// growsDualStack reports whether the derived Service have must turn
// dual-stack: it is single-stack and the import has two families. The
// update sets ipFamilyPolicy PreferDualStack only; the API server adds the
// second family where the cluster has one (the primary cannot change) and
// keeps one where it has not, so one update, never one per sync. A derived
// Service that turns single-stack again keeps its second cluster IP, which
// the ServiceImport leaves out.
func growsDualStack(have *corev1.Service, want []corev1.IPFamily) bool {
	return len(want) > 1 && (have.Spec.IPFamilyPolicy == nil || *have.Spec.IPFamilyPolicy == corev1.IPFamilyPolicySingleStack)
}

func familyOf(at discoveryv1.AddressType) corev1.IPFamily {
	if at == discoveryv1.AddressTypeIPv6 {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// derivedUpToDate compares what meshd sets on the derived Service (of the
// IP families: applyDerived checks growsDualStack).
func derivedUpToDate(have, want *corev1.Service) bool {
	if have.Spec.Selector != nil || have.Spec.Type != want.Spec.Type || isHeadless(have) ||
		have.Spec.SessionAffinity != cmp.Or(want.Spec.SessionAffinity, corev1.ServiceAffinityNone) ||
		(want.Spec.SessionAffinity == corev1.ServiceAffinityClientIP && !equality.Semantic.DeepEqual(have.Spec.SessionAffinityConfig, want.Spec.SessionAffinityConfig)) ||
		!equalPtr(orDefault(have.Spec.InternalTrafficPolicy), orDefault(want.Spec.InternalTrafficPolicy)) ||
		!equalPtr(have.Spec.TrafficDistribution, want.Spec.TrafficDistribution) ||
		len(have.Spec.Ports) != len(want.Spec.Ports) || !metaUpToDate(&have.ObjectMeta, &want.ObjectMeta) {
		return false
	}
	for i, p := range have.Spec.Ports {
		w := want.Spec.Ports[i]
		if p.Name != w.Name || protocol(p.Protocol) != w.Protocol || p.Port != w.Port || p.TargetPort != w.TargetPort || !equalPtr(p.AppProtocol, w.AppProtocol) {
			return false
		}
	}
	return true
}

// mcsSliceName is the deterministic name of the local copy of source slice
// src of cluster for the import nn.
func mcsSliceName(nn types.NamespacedName, cluster, src string) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s|%s|%s", nn, cluster, src))
	prefix := nn.Name
	if len(prefix) > 40 {
		prefix = prefix[:40]
	}
	return strings.TrimSuffix(prefix, "-") + "-" + hex.EncodeToString(h[:])[:12]
}

// desiredImportSlices are the local EndpointSlices of the import nn: one
// copy per source slice of every constituent, labelled with the service
// name and source cluster (and, for a ClusterSetIP import, the derived
// Service's name so kube-proxy uses them). Node names are kept only for the
// local cluster's endpoints (internalTrafficPolicy Local); pod references
// are dropped.
func desiredImportSlices(nn types.NamespacedName, localCluster, derived string, cs []constituent) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, c := range cs {
		for _, src := range c.slices {
			if src.AddressType != discoveryv1.AddressTypeIPv4 && src.AddressType != discoveryv1.AddressTypeIPv6 {
				continue
			}
			meta := mcsMeta(nn, mcsSliceName(nn, c.cluster, src.Name))
			meta.Labels[LabelSourceCluster] = c.cluster
			meta.Labels[discoveryv1.LabelManagedBy] = ManagedByMirror
			if derived != "" {
				meta.Labels[discoveryv1.LabelServiceName] = derived
			}
			sl := &discoveryv1.EndpointSlice{ObjectMeta: meta, AddressType: src.AddressType, Ports: normalPorts(src.Ports)}
			for _, ep := range src.Endpoints {
				if len(ep.Addresses) == 0 {
					continue
				}
				r := ep.Conditions.Ready == nil || *ep.Conditions.Ready
				s := r
				if ep.Conditions.Serving != nil {
					s = *ep.Conditions.Serving
				}
				if c.notReady || (c.deadNode != nil && ep.NodeName != nil && c.deadNode(*ep.NodeName)) {
					r, s = false, false
				}
				e := discoveryv1.Endpoint{
					Addresses:  slices.Clone(ep.Addresses),
					Hostname:   ep.Hostname,
					Zone:       ep.Zone,
					Conditions: discoveryv1.EndpointConditions{Ready: ptr(r), Serving: ptr(s), Terminating: ptr(ep.Conditions.Terminating != nil && *ep.Conditions.Terminating)},
				}
				if c.cluster == localCluster {
					e.NodeName = ep.NodeName
				}
				sl.Endpoints = append(sl.Endpoints, e)
			}
			slices.SortFunc(sl.Endpoints, func(a, b discoveryv1.Endpoint) int { return slices.Compare(a.Addresses, b.Addresses) })
			out = append(out, sl)
		}
	}
	return out
}

// importSliceUpToDate compares what meshd sets on an imported slice.
func importSliceUpToDate(have, want *discoveryv1.EndpointSlice) bool {
	if have.AddressType != want.AddressType || !metaUpToDate(&have.ObjectMeta, &want.ObjectMeta) ||
		have.Labels[discoveryv1.LabelServiceName] != want.Labels[discoveryv1.LabelServiceName] ||
		portsSignature(normalPorts(have.Ports)) != portsSignature(want.Ports) || len(have.Endpoints) != len(want.Endpoints) {
		return false
	}
	for i, e := range have.Endpoints {
		w := want.Endpoints[i]
		if !slices.Equal(e.Addresses, w.Addresses) || !equalPtr(e.Hostname, w.Hostname) || !equalPtr(e.Zone, w.Zone) ||
			!equalPtr(e.NodeName, w.NodeName) || !equality.Semantic.DeepEqual(e.Conditions, w.Conditions) {
			return false
		}
	}
	return true
}
