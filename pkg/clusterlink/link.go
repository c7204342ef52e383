package clusterlink

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/k8s/liveness"
	"meshd.io/meshd/pkg/mesh"
)

// Cluster links: `meshctl link` gives each cluster read-only credentials for
// the other, stored as a labelled Secret; meshd watches those Secrets and
// keeps the remote cluster's location leaders as WireGuard peers by itself.
const (
	// LabelClusterLink marks a Secret holding a linked cluster's kubeconfig.
	LabelClusterLink = convert.AnnotationPrefix + "cluster-link"
	// Annotations on a link Secret describing the remote cluster.
	AnnotationRemoteCluster       = convert.AnnotationPrefix + "remote-cluster"
	AnnotationRemoteServiceCIDRs  = convert.AnnotationPrefix + "remote-service-cidrs"
	AnnotationRemoteGranularity   = convert.AnnotationPrefix + "remote-mesh-granularity"
	AnnotationRemoteMeshCIDRs     = convert.AnnotationPrefix + "remote-mesh-cidrs"
	AnnotationRemoteTopologyLabel = convert.AnnotationPrefix + "remote-topology-label"
	AnnotationRemotePort          = convert.AnnotationPrefix + "remote-port"
	// AnnotationRemoteAllowedCIDRs lists the ranges the remote cluster may
	// claim, agreed at link time (meshctl link); absent: not recorded.
	AnnotationRemoteAllowedCIDRs = convert.AnnotationPrefix + "remote-allowed-cidrs"
	// AnnotationLinkTokenExpires is when the link's token expires (RFC 3339),
	// as the remote API server granted it.
	AnnotationLinkTokenExpires = convert.AnnotationPrefix + "link-token-expires"
	// LinkSecretPrefix prefixes link Secrets: meshd-link-<remote cluster>.
	LinkSecretPrefix = "meshd-link-"
	// LinkKubeconfigKey is the Secret data key of the kubeconfig.
	LinkKubeconfigKey = "kubeconfig"
	// LinkReader names the read-only ServiceAccount, ClusterRole and binding
	// created in a cluster for the clusters linked to it.
	LinkReader = "meshd-link-reader"
)

// LinkSettings describe a cluster's mesh as another cluster needs to know it.
type LinkSettings struct {
	// Name is the cluster's name (DNS label), used in Secret and Peer names.
	Name          string
	ServiceCIDRs  []netip.Prefix
	Granularity   mesh.Granularity
	MeshCIDRs     []netip.Prefix
	TopologyLabel string
	Port          int
	// Allowed are the ranges the cluster may claim, agreed at link time
	// (pod, service, mesh and location CIDRs, node addresses); nil: not
	// recorded, only the overlap and protected-address rules apply.
	Allowed []netip.Prefix
}

func (s LinkSettings) annotations() map[string]string {
	a := map[string]string{
		AnnotationRemoteCluster:       s.Name,
		AnnotationRemoteServiceCIDRs:  joinPrefixes(s.ServiceCIDRs),
		AnnotationRemoteGranularity:   string(s.Granularity),
		AnnotationRemoteMeshCIDRs:     joinPrefixes(s.MeshCIDRs),
		AnnotationRemoteTopologyLabel: s.TopologyLabel,
		AnnotationRemotePort:          strconv.Itoa(s.Port),
	}
	if s.Allowed != nil {
		a[AnnotationRemoteAllowedCIDRs] = joinPrefixes(s.Allowed)
	}
	return a
}

// optionalPrefixes parses a comma-separated list of CIDRs that may be empty
// (nil, no error).
func optionalPrefixes(v string) ([]netip.Prefix, error) {
	ss := convert.SplitList(v)
	if len(ss) == 0 {
		return nil, nil
	}
	return convert.ParsePrefixes(ss)
}

func joinPrefixes(ps []netip.Prefix) string {
	ss := make([]string, len(ps))
	for i, p := range ps {
		ss[i] = p.String()
	}
	return strings.Join(ss, ",")
}

// LinkFromSecret reads a link Secret: the remote cluster's settings and the
// kubeconfig that reads it.
func LinkFromSecret(s *corev1.Secret) (LinkSettings, []byte, error) {
	a := s.Annotations
	ls := LinkSettings{
		Name:          a[AnnotationRemoteCluster],
		Granularity:   mesh.Granularity(a[AnnotationRemoteGranularity]),
		TopologyLabel: a[AnnotationRemoteTopologyLabel],
		Port:          mesh.DefaultPort,
	}
	var errs []error
	if ls.Name == "" {
		errs = append(errs, fmt.Errorf("annotation %s is missing", AnnotationRemoteCluster))
	}
	if ls.Granularity == "" {
		ls.Granularity = mesh.GranularityLocation
	}
	if ls.TopologyLabel == "" {
		ls.TopologyLabel = convert.DefaultTopologyLabel
	}
	var err error
	// Both may be empty: a cluster whose meshd has no --service-cidr links
	// without service routes, and the mesh CIDR defaults like meshd's.
	if ls.ServiceCIDRs, err = optionalPrefixes(a[AnnotationRemoteServiceCIDRs]); err != nil {
		errs = append(errs, fmt.Errorf("annotation %s: %w", AnnotationRemoteServiceCIDRs, err))
	}
	if ls.MeshCIDRs, err = optionalPrefixes(a[AnnotationRemoteMeshCIDRs]); err != nil {
		errs = append(errs, fmt.Errorf("annotation %s: %w", AnnotationRemoteMeshCIDRs, err))
	}
	if len(ls.MeshCIDRs) == 0 {
		ls.MeshCIDRs = []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}
	}
	if v, ok := a[AnnotationRemoteAllowedCIDRs]; ok {
		ls.Allowed = []netip.Prefix{} // recorded, and empty: nothing may be claimed
		if strings.TrimSpace(v) != "" {
			if ls.Allowed, err = convert.ParsePrefixes(convert.SplitList(v)); err != nil {
				errs = append(errs, fmt.Errorf("annotation %s: %w", AnnotationRemoteAllowedCIDRs, err))
			}
		}
	}
	if p := a[AnnotationRemotePort]; p != "" {
		if ls.Port, err = strconv.Atoi(p); err != nil || ls.Port < 1 || ls.Port > 65535 {
			errs = append(errs, fmt.Errorf("annotation %s: bad port %q", AnnotationRemotePort, p))
			ls.Port = mesh.DefaultPort
		}
	}
	kc := s.Data[LinkKubeconfigKey]
	if len(kc) == 0 {
		errs = append(errs, fmt.Errorf("data key %q is missing", LinkKubeconfigKey))
	}
	if err := errors.Join(errs...); err != nil {
		return ls, nil, fmt.Errorf("link Secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	return ls, kc, nil
}

// RemotePeers computes the Peers a linked cluster contributes (see
// mesh.RemotePeers, which holds the policy): one per location leader of the
// remote mesh. A range that overlaps a local range, covers a protected
// address of guard or lies outside the ranges agreed at link time is dropped
// and returned as a problem (a mesh.RangeRefusal), never routed.
func RemotePeers(ls LinkSettings, nodes []*corev1.Node, guard mesh.RemoteGuard) (peers []mesh.Peer, problems []error) {
	return RemotePeersLive(ls, nodes, guard, nil)
}

// RemoteJudge returns the liveness decision of a linked cluster's nodes,
// with k leader candidates per location (see
// liveness.Liveness.DecideCandidates); nil judges every node live.
type RemoteJudge func(nodes []mesh.Node, g mesh.Granularity, k int) liveness.Decision

// RemotePeersLive is RemotePeers with the linked cluster's leaders elected
// the way its own nodes elect them (judge: from its Leases and probe
// reports), so a dead remote leader is replaced; the service CIDRs go to the
// first live leader.
func RemotePeersLive(ls LinkSettings, nodes []*corev1.Node, guard mesh.RemoteGuard, judge RemoteJudge) (peers []mesh.Peer, problems []error) {
	mnodes := make([]mesh.Node, 0, len(nodes))
	for _, n := range nodes {
		mn, _ := convert.NodeFromObject(n, convert.ParseOptions{TopologyLabel: ls.TopologyLabel, Port: ls.Port})
		mnodes = append(mnodes, mn)
	}
	peers, refused, err := mesh.RemotePeers(mesh.RemoteLink{
		Cluster: ls.Name, Granularity: ls.Granularity, MeshCIDRs: ls.MeshCIDRs, Port: ls.Port,
		ServiceCIDRs: ls.ServiceCIDRs, Allowed: ls.Allowed,
		Liveness: remoteLocal(mnodes, ls.Granularity, leaderCandidates(nodes), judge),
	}, mnodes, guard)
	if err != nil {
		return nil, []error{err}
	}
	for _, r := range refused {
		problems = append(problems, r)
	}
	return peers, problems
}

// remoteLocal is the planner's view of a linked cluster's liveness, with k
// leader candidates per location.
func remoteLocal(nodes []mesh.Node, g mesh.Granularity, k int, judge RemoteJudge) mesh.Local {
	if judge == nil {
		return mesh.Local{}
	}
	d := judge(nodes, g, k)
	return mesh.Local{Live: d.Live, Settling: d.Settling, Candidates: d.Candidates}
}

// leaderCandidates is the linked cluster's --leader-candidates, as most of
// its nodes publish it (convert.AnnotationSettings; the default when none
// does).
func leaderCandidates(nodes []*corev1.Node) int {
	count := map[int]int{}
	best := mesh.DefaultLeaderCandidates
	for _, n := range nodes {
		if s, err := convert.ParseSettings(n.Annotations[convert.AnnotationSettings]); err == nil && s.LeaderCandidates > 0 {
			count[s.LeaderCandidates]++
			if c, b := count[s.LeaderCandidates], count[best]; c > b || c == b && s.LeaderCandidates < best {
				best = s.LeaderCandidates
			}
		}
	}
	return best
}

// RefusalEventReason is the Event reason for a linked cluster's refused
// ranges: RangeOverlap when every one overlaps a local range (the reason
// meshd always used), RangeRefused otherwise.
func RefusalEventReason(problems []error) string {
	for _, p := range problems {
		var r mesh.RangeRefusal
		if errors.As(p, &r) && r.Reason != mesh.RefusedOverlap {
			return "RangeRefused"
		}
	}
	return "RangeOverlap"
}

// CountRefusals counts RemotePeers' problems by refusal reason.
func CountRefusals(problems []error) map[mesh.RefusalReason]int {
	out := map[mesh.RefusalReason]int{}
	for _, p := range problems {
		var r mesh.RangeRefusal
		if errors.As(p, &r) {
			out[r.Reason]++
		}
	}
	return out
}

// GrantLink lets cluster `to` read cluster `from`: it creates (or updates) in
// `from` a ServiceAccount, a read-only ClusterRole (Nodes, Services, EndpointSlices, ServiceExports) and its binding,
// requests a token for it (TokenRequest API, bound to an anchor Secret; no
// kube-controller-manager needed), and creates in `to` the link Secret with a
// kubeconfig for that token and `from`'s settings. server is the API address
// `to`'s nodes use to reach `from` (default: from's own client address);
// toName names `to`: each reader cluster gets its own token, so revoking one
// link leaves the others alone.
//
// The link kubeconfig verifies `from`'s API server with the CA of from's
// client configuration; without one GrantLink refuses before changing
// anything (GrantLinkWithOptions with InsecureSkipTLSVerify overrides).
func GrantLink(ctx context.Context, from *connect.Clients, fromSettings LinkSettings, server string, to *connect.Clients, toName, namespace string) error {
	return GrantLinkWithOptions(ctx, from, fromSettings, to, toName, namespace, GrantOptions{Server: server})
}

// GrantOptions tune GrantLinkWithOptions.
type GrantOptions struct {
	// Server is the API address `to`'s nodes use to reach `from` (default:
	// from's own client address).
	Server string
	// InsecureSkipTLSVerify lets a link be made although `from`'s client
	// configuration has no CA: the link kubeconfig then does not verify
	// the API server's certificate (anyone on the path can impersonate it).
	InsecureSkipTLSVerify bool
}

// ErrNoCA is returned by GrantLink when the cluster to be read has no CA
// data and InsecureSkipTLSVerify is not set.
var ErrNoCA = errors.New("its kubeconfig has no CA data (certificate-authority-data or certificate-authority), so the link could not verify its API server; add the CA, or accept an unverified link with --insecure-skip-tls-verify")

// GrantLinkWithOptions is GrantLink with options.
func GrantLinkWithOptions(ctx context.Context, from *connect.Clients, fromSettings LinkSettings, to *connect.Clients, toName, namespace string, o GrantOptions) error {
	if err := errors.Join(validName(fromSettings.Name), validName(toName)); err != nil {
		return err
	}
	server := o.Server
	if server == "" {
		server = from.Config.Host
	}
	ca, err := linkCA(from, fromSettings.Name, o.InsecureSkipTLSVerify)
	if err != nil {
		return err
	}
	k := from.Kube
	if _, err := k.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("cluster %s: namespace %s (is meshd installed?): %w", fromSettings.Name, namespace, err)
	}
	labels := map[string]string{liveness.LabelManagedBy: liveness.ManagedBy}
	if err := ensureLinkReader(ctx, k, fromSettings.Name, namespace, labels); err != nil {
		return err
	}
	token, expires, err := requestLinkToken(ctx, k, namespace, LinkTokenAnchor(toName), labels)
	if err != nil {
		return fmt.Errorf("cluster %s: %w", fromSettings.Name, err)
	}
	return writeLinkSecret(ctx, to, namespace, fromSettings, server, ca, token, expires)
}

// linkCA is the CA the link kubeconfig verifies `from`'s API server with;
// none is an error (ErrNoCA) unless insecure.
func linkCA(from *connect.Clients, name string, insecure bool) ([]byte, error) {
	ca := from.Config.CAData
	if len(ca) == 0 && from.Config.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(from.Config.CAFile); err != nil {
			return nil, fmt.Errorf("cluster %s: reading its CA: %w", name, err)
		}
	}
	if len(ca) == 0 && !insecure {
		return nil, fmt.Errorf("cluster %s: %w", name, ErrNoCA)
	}
	return ca, nil
}

// ensureLinkReader creates (or updates) in a cluster the link reader's
// ServiceAccount, its read-only ClusterRole and the binding.
func ensureLinkReader(ctx context.Context, k kubernetes.Interface, cluster, namespace string, labels map[string]string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: LinkReader, Namespace: namespace, Labels: labels}}
	if _, err := k.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster %s: creating ServiceAccount %s/%s: %w", cluster, namespace, LinkReader, err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: LinkReader, Labels: labels},
		// Nodes for peering; Services, EndpointSlices and ServiceExports for
		// service mirroring (meshd mirror). Read only.
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes", "services"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"multicluster.x-k8s.io"}, Resources: []string{"serviceexports"}, Verbs: []string{"get", "list", "watch"}},
			// The cluster's ID (ClusterProperty cluster.clusterset.k8s.io, docs/mcs.md),
			// else its default: the kube-system namespace UID, which a
			// cluster without the ClusterProperty CRD uses unrecorded.
			{APIGroups: []string{"about.k8s.io"}, Resources: []string{"clusterproperties"}, Verbs: []string{"get"}},
			{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"kube-system"}, Verbs: []string{"get"}},
			// Heartbeat Leases: the linked cluster's leaders fail over (LinkLiveness).
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	if _, err := k.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = k.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("cluster %s: updating ClusterRole %s: %w", cluster, LinkReader, err)
		}
	} else if err != nil {
		return fmt.Errorf("cluster %s: creating ClusterRole %s: %w", cluster, LinkReader, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: LinkReader, Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: LinkReader},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: LinkReader, Namespace: namespace}},
	}
	if _, err := k.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster %s: creating ClusterRoleBinding %s: %w", cluster, LinkReader, err)
	}
	return nil
}

// writeLinkSecret creates (or updates) in `to` the link Secret: a
// kubeconfig for token and from's settings.
func writeLinkSecret(ctx context.Context, to *connect.Clients, namespace string, fromSettings LinkSettings, server string, ca []byte, token string, expires time.Time) error {
	kc, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{fromSettings.Name: {Server: server, CertificateAuthorityData: ca, InsecureSkipTLSVerify: len(ca) == 0}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{LinkReader: {Token: token}},
		Contexts:       map[string]*clientcmdapi.Context{fromSettings.Name: {Cluster: fromSettings.Name, AuthInfo: LinkReader}},
		CurrentContext: fromSettings.Name,
	})
	if err != nil {
		return fmt.Errorf("writing the kubeconfig for cluster %s: %w", fromSettings.Name, err)
	}
	link := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: LinkSecretPrefix + fromSettings.Name, Namespace: namespace,
			Labels:      map[string]string{LabelClusterLink: "true", liveness.LabelManagedBy: liveness.ManagedBy},
			Annotations: fromSettings.annotations(),
		},
		Data: map[string][]byte{LinkKubeconfigKey: kc},
	}
	if !expires.IsZero() {
		link.Annotations[AnnotationLinkTokenExpires] = expires.UTC().Format(time.RFC3339)
	}
	sc := to.Kube.CoreV1().Secrets(namespace)
	if _, err := sc.Create(ctx, link, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		if _, err := sc.Update(ctx, link, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating link Secret %s/%s: %w", namespace, link.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating link Secret %s/%s: %w", namespace, link.Name, err)
	}
	return nil
}

// LinkTokenLifetime is the validity requested for a link's token. The API
// server caps it at its --service-account-max-token-expiration when that is
// set; running `meshctl link` again renews the token.
const LinkTokenLifetime = 365 * 24 * time.Hour

// requestLinkToken returns a token of the reader ServiceAccount from the
// TokenRequest API (no kube-controller-manager needed), bound to the anchor
// Secret name (LinkTokenAnchor): deleting that Secret (RevokeLink)
// invalidates the token at once.
func requestLinkToken(ctx context.Context, k kubernetes.Interface, namespace, name string, labels map[string]string) (string, time.Time, error) {
	sc := k.CoreV1().Secrets(namespace)
	anchor, err := sc.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels,
			Annotations: map[string]string{convert.AnnotationPrefix + "purpose": "link tokens are bound to this Secret: deleting it revokes them"}},
		Type: corev1.SecretTypeOpaque,
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		anchor, err = sc.Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("creating the token anchor Secret %s/%s: %w", namespace, name, err)
	}
	secs := int64(LinkTokenLifetime / time.Second)
	tr, err := k.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, LinkReader, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &secs,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: anchor.Name, UID: anchor.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", namespace, LinkReader, err)
	}
	if tr.Status.Token == "" {
		return "", time.Time{}, fmt.Errorf("requesting a token for ServiceAccount %s/%s: empty token", namespace, LinkReader)
	}
	return tr.Status.Token, tr.Status.ExpirationTimestamp.Time, nil
}

// LinkTokenExpiry is when the link Secret's token expires: from
// AnnotationLinkTokenExpires, else from the exp claim (read, not verified)
// of the token of the kubeconfig's current context, else of its other users
// in name order. ok is false when none says, or says a time outside
// 2000-9999 (a forged or broken value: year 10000 and later cannot be
// written as RFC 3339, and would fail every JSON or YAML encoding of the
// expiry, such as meshctl status -o json for the whole cluster).
func LinkTokenExpiry(s *corev1.Secret) (time.Time, bool) {
	if s == nil {
		return time.Time{}, false
	}
	if v := s.Annotations[AnnotationLinkTokenExpires]; v != "" {
		if t, err := time.Parse(time.RFC3339, v); err == nil && saneExpiry(t) {
			return t, true
		}
	}
	cfg, err := clientcmd.Load(s.Data[LinkKubeconfigKey])
	if err != nil {
		return time.Time{}, false
	}
	var users []string
	if c := cfg.Contexts[cfg.CurrentContext]; c != nil && cfg.AuthInfos[c.AuthInfo] != nil {
		users = append(users, c.AuthInfo)
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.AuthInfos)) {
		if len(users) == 0 || name != users[0] {
			users = append(users, name)
		}
	}
	for _, name := range users {
		if a := cfg.AuthInfos[name]; a != nil {
			if t, ok := jwtExpiry(a.Token); ok {
				return t, true
			}
		}
	}
	return time.Time{}, false
}

// Token expiries outside this range are not believed (LinkTokenExpiry).
var (
	earliestExpiry = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	latestExpiry   = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

func saneExpiry(t time.Time) bool {
	return !t.Before(earliestExpiry) && !t.After(latestExpiry)
}

// jwtExpiry reads the exp claim of a JWT without verifying it: a NumericDate
// (seconds, fractions dropped) within 2000-9999.
func jwtExpiry(tok string) (time.Time, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp float64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil {
		return time.Time{}, false
	}
	// Compared as floats first: a huge exp must not overflow int64.
	if claims.Exp < float64(earliestExpiry.Unix()) || claims.Exp > float64(latestExpiry.Unix()) {
		return time.Time{}, false
	}
	return time.Unix(int64(claims.Exp), 0), true
}

// LinkTokenAnchor names the Secret the link token of reader cluster toName is
// bound to: deleting it revokes exactly that link's credentials.
func LinkTokenAnchor(toName string) string { return LinkReader + "-token-" + toName }

// RevokeLink removes what GrantLink made: the link Secret in `to`, and the
// token anchor Secret of `to` in `from` (the reader ServiceAccount and role
// stay for other links; deleting the anchor invalidates the token bound to it).
func RevokeLink(ctx context.Context, from *connect.Clients, fromName string, to *connect.Clients, toName, namespace string) error {
	var errs []error
	if err := to.Kube.CoreV1().Secrets(namespace).Delete(ctx, LinkSecretPrefix+fromName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting link Secret %s/%s%s: %w", namespace, LinkSecretPrefix, fromName, err))
	}
	if from != nil {
		if err := from.Kube.CoreV1().Secrets(namespace).Delete(ctx, LinkTokenAnchor(toName), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("cluster %s: deleting the reader token: %w", fromName, err))
		}
	}
	return errors.Join(errs...)
}

func validName(s string) error {
	if s == "" || len(s) > 40 {
		return fmt.Errorf("cluster name %q: want 1-40 characters", s)
	}
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' && i > 0 && i < len(s)-1) {
			return fmt.Errorf("cluster name %q: want lower-case letters, digits and inner dashes", s)
		}
	}
	return nil
}
