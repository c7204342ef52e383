package clusterlink

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// ConditionSynced is the ClusterLink condition that says whether its
// leaders come from a complete list of the linked cluster's Nodes.
const ConditionSynced = "Synced"

// ConditionReachable is the ClusterLink condition that says whether the
// linked cluster's API server answers the link controller.
const ConditionReachable = "Reachable"

// Remote is a linked cluster as a meshd node sees it, read from its
// ClusterLink: no credentials, only what the link controller wrote.
type Remote struct {
	// Object is the ClusterLink (Events about the link go to it).
	Object *v1alpha1.ClusterLink
	// Link holds the cluster's name and the ranges agreed at link time.
	Link mesh.RemoteLink
	// Leaders are the linked cluster's location leaders, unchecked (see
	// Peers); nil when the controller has not observed them yet.
	Leaders []mesh.Peer
	// Observed is false until the controller wrote the leaders once: the
	// node then keeps the linked cluster's last known peers.
	Observed bool
	// Unreachable: the controller cannot reach the linked cluster now; the
	// leaders are its last known ones.
	Unreachable bool
	// TokenExpires is when the link's token expires (zero: unknown).
	TokenExpires time.Time
	// Err says why the link cannot be used (its Secret is unusable, or the
	// ClusterLink is malformed); the last known peers are kept.
	Err error
}

// RemoteFromObject reads a ClusterLink.
func RemoteFromObject(cl *v1alpha1.ClusterLink) Remote {
	r := Remote{Object: cl, Link: mesh.RemoteLink{Cluster: cl.Name}}
	var errs []error
	if cl.Spec.Problem != "" {
		errs = append(errs, errors.New(cl.Spec.Problem))
	}
	if cl.Spec.AllowedCIDRsRecorded {
		r.Link.Allowed = []netip.Prefix{}
		for _, s := range cl.Spec.AllowedCIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("spec.allowedCIDRs: %q is not a CIDR", s))
				continue
			}
			r.Link.Allowed = append(r.Link.Allowed, p.Masked())
		}
	}
	for _, c := range cl.Spec.MeshCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			errs = append(errs, fmt.Errorf("spec.meshCIDRs: %q is not a CIDR", c))
			continue
		}
		r.Link.MeshCIDRs = append(r.Link.MeshCIDRs, p.Masked())
	}
	if cl.Spec.TokenExpires != nil {
		r.TokenExpires = cl.Spec.TokenExpires.Time
	}
	for _, c := range cl.Status.Conditions {
		switch {
		case c.Type == ConditionSynced && c.Status == metav1.ConditionTrue:
			r.Observed = true
		case c.Type == ConditionReachable && c.Status == metav1.ConditionFalse:
			r.Unreachable = true
		}
	}
	for _, l := range cl.Status.Leaders {
		p, err := leaderPeer(l)
		if err != nil {
			errs = append(errs, fmt.Errorf("status.leaders %s: %w", l.Name, err))
			continue
		}
		r.Leaders = append(r.Leaders, p)
	}
	if err := errors.Join(errs...); err != nil {
		r.Err = fmt.Errorf("ClusterLink %s: %w", cl.Name, err)
	}
	return r
}

func leaderPeer(l v1alpha1.ClusterLinkLeader) (mesh.Peer, error) {
	key, err := wgtypes.ParseKey(l.PublicKey)
	if err != nil {
		return mesh.Peer{}, fmt.Errorf("public key: %w", err)
	}
	if l.PersistentKeepalive < 0 || l.PersistentKeepalive > 65535 {
		return mesh.Peer{}, fmt.Errorf("persistent keepalive %d: want 0-65535 seconds", l.PersistentKeepalive)
	}
	p := mesh.Peer{Name: l.Name, PublicKey: key, PersistentKeepalive: time.Duration(l.PersistentKeepalive) * time.Second}
	if l.Endpoint != "" {
		if p.Endpoint, err = parseEndpoint(l.Endpoint); err != nil {
			return mesh.Peer{}, err
		}
	}
	for _, s := range l.AllowedIPs {
		a, err := netip.ParsePrefix(s)
		if err != nil {
			return mesh.Peer{}, fmt.Errorf("allowed IP %q is not a CIDR", s)
		}
		p.AllowedIPs = append(p.AllowedIPs, a.Masked())
	}
	return p, nil
}

// parseEndpoint reads what endpointString wrote: ip:port, [ipv6]:port or
// host:port.
func parseEndpoint(s string) (mesh.Endpoint, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Port() != 0 {
		// A zone (fe80::1%eth0) names a link of the writer's, and an
		// address with one matches no allowed IP, so a range covering
		// it would not be refused: never an endpoint here.
		if ap.Addr().Zone() != "" {
			return mesh.Endpoint{}, fmt.Errorf("endpoint %q: an address with a zone", s)
		}
		return mesh.Endpoint{Addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
	}
	i := strings.LastIndexByte(s, ':')
	if i <= 0 {
		return mesh.Endpoint{}, fmt.Errorf("endpoint %q: want ip:port or host:port", s)
	}
	port, err := strconv.ParseUint(s[i+1:], 10, 16)
	if err != nil || port == 0 {
		return mesh.Endpoint{}, fmt.Errorf("endpoint %q: bad port", s)
	}
	return mesh.Endpoint{Host: s[:i], Addr: netip.AddrPortFrom(netip.Addr{}, uint16(port))}, nil
}

func endpointString(e mesh.Endpoint) string {
	switch {
	case e.Host != "":
		return e.Host + ":" + strconv.Itoa(int(e.Addr.Port()))
	case e.Addr.IsValid():
		return e.Addr.String()
	}
	return ""
}

// Peers applies this cluster's trust policy (mesh.FilterRemote: the ranges
// agreed at link time, the local ranges and the protected addresses of
// guard) to the linked cluster's leaders: the peers to configure, and every
// refused range as a problem (a mesh.RangeRefusal).
func (r Remote) Peers(guard mesh.RemoteGuard) (peers []mesh.Peer, problems []error) {
	peers, refused := mesh.FilterRemote(r.Link, r.Leaders, guard)
	for _, x := range refused {
		problems = append(problems, x)
	}
	return peers, problems
}

// Spec is the ClusterLink spec of a link Secret: its settings, or the
// reason it cannot be used.
func Spec(s *corev1.Secret) v1alpha1.ClusterLinkSpec {
	ls, _, err := LinkFromSecret(s)
	spec := v1alpha1.ClusterLinkSpec{SecretName: s.Name}
	if err != nil {
		spec.Problem = err.Error()
		return spec
	}
	spec.Granularity = string(ls.Granularity)
	spec.MeshCIDRs = prefixStrings(ls.MeshCIDRs)
	spec.ServiceCIDRs = prefixStrings(ls.ServiceCIDRs)
	spec.Port = int32(ls.Port) // 1-65535, checked by LinkFromSecret
	if ls.Allowed != nil {
		spec.AllowedCIDRsRecorded = true
		spec.AllowedCIDRs = prefixStrings(ls.Allowed)
	}
	if t, ok := LinkTokenExpiry(s); ok {
		mt := metav1.NewTime(t.UTC().Truncate(time.Second))
		spec.TokenExpires = &mt
	}
	return spec
}

func prefixStrings(ps []netip.Prefix) []string {
	if len(ps) == 0 {
		return nil
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// Leaders elects a linked cluster's location leaders from its Nodes, the
// way its own nodes elect them (judge: from its Leases and probe reports;
// nil counts every node live). live says which leaders the judge counts
// live.
func Leaders(ls LinkSettings, nodes []*corev1.Node, judge RemoteJudge) (leaders []mesh.Peer, live map[string]bool, err error) {
	mnodes := make([]mesh.Node, 0, len(nodes))
	for _, n := range nodes {
		mn, _ := convert.NodeFromObject(n, convert.ParseOptions{TopologyLabel: ls.TopologyLabel, Port: ls.Port})
		mnodes = append(mnodes, mn)
	}
	l := remoteLocal(mnodes, ls.Granularity, leaderCandidates(nodes), judge)
	leaders, err = mesh.RemoteLeaders(mesh.RemoteLink{
		Cluster: ls.Name, Granularity: ls.Granularity, MeshCIDRs: ls.MeshCIDRs, Port: ls.Port,
		ServiceCIDRs: ls.ServiceCIDRs, Liveness: l,
	}, mnodes)
	return leaders, l.Live, err
}

// LeaderStatus is the ClusterLink status form of leaders (sorted by name).
func LeaderStatus(leaders []mesh.Peer, live map[string]bool) []v1alpha1.ClusterLinkLeader {
	out := make([]v1alpha1.ClusterLinkLeader, 0, len(leaders))
	for _, p := range leaders {
		out = append(out, v1alpha1.ClusterLinkLeader{
			Name: p.Name, PublicKey: p.PublicKey.String(), Endpoint: endpointString(p.Endpoint),
			AllowedIPs: prefixStrings(p.AllowedIPs), PersistentKeepalive: int32(p.PersistentKeepalive / time.Second),
			Live: live == nil || live[p.Name],
		})
	}
	slices.SortFunc(out, func(a, b v1alpha1.ClusterLinkLeader) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Source is what a meshd node knows of the linked clusters: the
// ClusterLinks in an informer's cache. It reads no Secret and reaches no
// linked cluster.
type Source struct {
	Store  cache.Store
	Synced func() bool
}

// Listed reports whether the ClusterLinks were listed once: before, an
// empty Snapshot means "not known yet", not "no linked cluster".
func (s Source) Listed() bool { return s.Synced() }

// Snapshot returns the linked clusters, sorted by name.
func (s Source) Snapshot() []Remote {
	var out []Remote
	for _, o := range s.Store.List() {
		if cl, ok := o.(*v1alpha1.ClusterLink); ok {
			out = append(out, RemoteFromObject(cl))
		}
	}
	slices.SortFunc(out, func(a, b Remote) int { return strings.Compare(a.Link.Cluster, b.Link.Cluster) })
	return out
}
