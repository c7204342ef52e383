package main

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/clusterlink"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/connect"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// linkedCluster is a cluster linked with `meshctl link`, as meshd on this
// cluster's leaders sees it: read through the link Secret's credentials.
type linkedCluster struct {
	Secret   string
	Settings clusterlink.LinkSettings
	Server   string
	// Peers are the remote location leaders as this cluster's meshd peers
	// them (what clusterlink.RemotePeers gives meshd).
	Peers []mesh.Peer
	// Problems are ranges meshd does not route (overlaps).
	Problems []string
	// Err: the Secret is unusable or the cluster did not answer.
	Err error
	// TokenExpires is when the link's token expires (zero: unknown).
	TokenExpires time.Time
}

// remoteClientsFromKubeconfig builds clients from a link Secret's kubeconfig.
func remoteClientsFromKubeconfig(kc []byte) (*connect.Clients, error) {
	cfg, err := clusterlink.RESTConfig(kc)
	if err != nil {
		return nil, fmt.Errorf("parsing its kubeconfig: %w", err)
	}
	cfg.UserAgent = "meshctl"
	return connect.NewClientsForConfig(cfg)
}

// linkedClusters reads the link Secrets in the lease namespace and, through
// each, the linked cluster's Nodes. Not being allowed to read Secrets is a
// note, not an error: status then shows this cluster alone.
func (e *env) linkedClusters(ctx context.Context, m *model) ([]linkedCluster, []string) {
	c, err := e.newClients(e.s.kubeconfig, e.s.context)
	if err != nil {
		return nil, []string{fmt.Sprintf("linked clusters not shown: %v", err)}
	}
	sl, err := c.Kube.CoreV1().Secrets(m.Set.leaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: clusterlink.LabelClusterLink + "=true"})
	switch {
	case apierrors.IsForbidden(err):
		return nil, []string{fmt.Sprintf("linked clusters not shown: not allowed to list Secrets in namespace %s", m.Set.leaseNamespace)}
	case err != nil:
		return nil, []string{fmt.Sprintf("linked clusters not shown: listing link Secrets in namespace %s: %s", m.Set.leaseNamespace, shortError(err))}
	}
	local := mesh.LocalGuard(m.Opts, m.Input.Nodes, apiServerAddrs(ctx, c)...) // meshctl knows no service CIDR
	newRemote := e.remoteClients
	if newRemote == nil {
		newRemote = remoteClientsFromKubeconfig
	}
	var out []linkedCluster
	for i := range sl.Items {
		s := &sl.Items[i]
		lc := linkedCluster{Secret: s.Name}
		lc.TokenExpires, _ = clusterlink.LinkTokenExpiry(s)
		settings, kc, err := clusterlink.LinkFromSecret(s)
		lc.Settings = settings
		if err != nil {
			lc.Err = err
			out = append(out, lc)
			continue
		}
		lc.Peers, lc.Server, lc.Problems, lc.Err = readLinked(ctx, settings, kc, local, newRemote)
		out = append(out, lc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Settings.Name < out[j].Settings.Name })
	return out, nil
}

func readLinked(ctx context.Context, ls clusterlink.LinkSettings, kc []byte, local mesh.RemoteGuard, newRemote func([]byte) (*connect.Clients, error)) (peers []mesh.Peer, server string, problems []string, err error) {
	rc, err := newRemote(kc)
	if err != nil {
		return nil, "", nil, fmt.Errorf("cluster %s: %w", ls.Name, err)
	}
	if rc.Config != nil {
		server = rc.Config.Host
	}
	nl, err := rc.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, server, nil, fmt.Errorf("cluster %s: listing its Nodes: %s", ls.Name, shortError(err))
	}
	nodes := make([]*corev1.Node, len(nl.Items))
	for i := range nl.Items {
		nodes[i] = &nl.Items[i]
	}
	peers, errs := clusterlink.RemotePeers(ls, nodes, local)
	for _, e := range errs {
		problems = append(problems, e.Error())
	}
	return peers, server, problems, nil
}

// clusterLinkState is a ClusterLink as the link controller (meshd link)
// last wrote it: what this cluster's nodes peer with.
type clusterLinkState struct {
	Name      string
	Leaders   []string
	Synced    metav1.ConditionStatus
	Reachable metav1.ConditionStatus
	// Message is the first message of a condition that is not True.
	Message string
}

// clusterLinks lists the ClusterLinks the link controller keeps. Without
// the CRD (an install from before the controller, or one without cluster
// links) there are none; not being allowed to list them is a note.
func (e *env) clusterLinks(ctx context.Context) ([]clusterLinkState, []string) {
	c, err := e.newClients(e.s.kubeconfig, e.s.context)
	if err != nil || c.Meshd == nil {
		return nil, nil // linkedClusters notes the client error
	}
	l, err := c.Meshd.MeshdV1alpha1().ClusterLinks().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case apierrors.IsForbidden(err):
		return nil, []string{"cluster links not shown: not allowed to list ClusterLinks"}
	case err != nil:
		return nil, []string{"cluster links not shown: listing ClusterLinks: " + shortError(err)}
	}
	out := make([]clusterLinkState, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, clusterLinkStateOf(&l.Items[i]))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func clusterLinkStateOf(cl *v1alpha1.ClusterLink) clusterLinkState {
	st := clusterLinkState{Name: cl.Name, Leaders: []string{}, Synced: metav1.ConditionUnknown, Reachable: metav1.ConditionUnknown}
	for _, l := range cl.Status.Leaders {
		st.Leaders = append(st.Leaders, l.Name)
	}
	for _, t := range []string{clusterlink.ConditionSynced, clusterlink.ConditionReachable} {
		c := meta.FindStatusCondition(cl.Status.Conditions, t)
		if c == nil {
			continue
		}
		if t == clusterlink.ConditionSynced {
			st.Synced = c.Status
		} else {
			st.Reachable = c.Status
		}
		if c.Status != metav1.ConditionTrue && st.Message == "" {
			st.Message = c.Message
		}
	}
	return st
}

// apiServerAddrs are the API server's addresses as the nodes protect them:
// the one meshctl dials, when an IP, and the endpoints of the EndpointSlice
// default/kubernetes (read live; not being allowed to read it leaves the
// first).
func apiServerAddrs(ctx context.Context, c *connect.Clients) []netip.Addr {
	es, err := c.Kube.DiscoveryV1().EndpointSlices(convert.APIServerEndpointSliceNamespace).Get(ctx, convert.APIServerEndpointSliceName, metav1.GetOptions{})
	if err != nil {
		es = nil
	}
	return convert.APIServerEndpoints([]*discoveryv1.EndpointSlice{es}, convert.APIServerAddrs(c.Config)...)
}
