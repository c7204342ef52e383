//go:build e2e

package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Well-known label and annotation keys.
const (
	LabelRegion          = "topology.kubernetes.io/region"
	AnnotationPublicKey  = "meshd.io/public-key"
	AnnotationEndpoint   = "meshd.io/endpoint"
	AnnotationInternalIP = "meshd.io/internal-ip"
	AnnotationWGIP       = "meshd.io/wireguard-ip"
	// AnnotationDiscovered is meshd.io/discovered-endpoints: the endpoints
	// a node learned from handshakes, by peer public key.
	AnnotationDiscovered = "meshd.io/discovered-endpoints"
	// LabelLeaseCandidate marks the heartbeat Lease of a leader candidate
	// (meshd's liveness.LabelCandidate).
	LabelLeaseCandidate = "meshd.io/candidate"
)

// PeerGVR is the Peer resource.
var PeerGVR = schema.GroupVersionResource{Group: "meshd.io", Version: "v1alpha1", Resource: "peers"}

// RegisterNode creates n's Node object: labels region=<location>,
// kubernetes.io/hostname, spec.podCIDR(s), then (status subresource)
// InternalIP address(es) and a Ready condition.
func (tb *Testbed) RegisterNode(ctx context.Context, n *Node) error {
	labels := map[string]string{
		LabelRegion:              n.Location.Name,
		"kubernetes.io/hostname": n.Name,
		"kubernetes.io/os":       "linux",
	}
	for k, v := range n.Opts.Labels {
		labels[k] = v
	}
	cidrs := []string{n.PodCIDR.String()}
	if n.PodCIDR6.IsValid() {
		cidrs = append(cidrs, n.PodCIDR6.String())
	}
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels, Annotations: n.Opts.Annotations},
		Spec:       corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs},
	}
	created, err := n.kube().CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Node %s: %w", n.Name, err)
	}
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP.String()}}
	if n.Opts.DualStack {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.IP6.String()})
	}
	addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
	now := metav1.Now()
	created.Status = corev1.NodeStatus{
		Addresses: addrs,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated by the meshd e2e testbed", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
	}
	if _, err := n.kube().CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting status of Node %s: %w", n.Name, err)
	}
	return nil
}

// Reset returns the testbed to "control plane only" for the next scenario:
// it stops every non-control-plane process, deletes the namespaces of
// nodes, pods, external hosts and NAT boxes, the location bridges, and all
// Nodes, meshd.io objects and leases in the lease namespace.
func (tb *Testbed) Reset(ctx context.Context) error {
	tb.mu.Lock()
	procs := tb.procs
	tb.procs = nil
	var nss []string
	for _, n := range tb.nodes {
		for _, p := range n.pods {
			nss = append(nss, p.NS)
		}
		nss = append(nss, n.NS)
	}
	for _, e := range tb.externals {
		nss = append(nss, e.NS)
	}
	var bridges []string
	for _, l := range tb.locations {
		if l.NAT {
			nss = append(nss, l.GatewayNS)
		} else {
			bridges = append(bridges, l.Bridge)
		}
	}
	for _, c := range tb.clusters { // their processes are in procs
		nss = append(nss, c.NS)
	}
	tb.clusters = nil
	tb.nodes = map[string]*Node{}
	tb.externals = map[string]*External{}
	tb.fakeResponder = netip.Addr{} // its host goes with the externals
	tb.locations = map[string]*Location{}
	tb.nextExt = 0
	tb.mu.Unlock()

	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func(p *Proc) { defer wg.Done(); p.Stop(5 * time.Second) }(p)
	}
	wg.Wait()
	var firstErr error
	keep := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, ns := range nss {
		// Anything else still running in there (e.g. started by hand).
		out, _ := run(ctx, "ip", "netns", "pids", ns)
		if len(out) > 0 {
			_, _ = run(ctx, "sh", "-c", "ip netns pids "+ns+" | xargs -r kill -9")
			time.Sleep(100 * time.Millisecond)
		}
		_, err := run(ctx, "ip", "netns", "del", ns)
		keep(err)
	}
	for _, br := range bridges {
		_, err := run(ctx, "ip", "-n", tb.RouterNS, "link", "del", br)
		keep(err)
	}
	keep(os.RemoveAll(filepath.Join(tb.Dir, "nodes")))
	keep(os.RemoveAll(filepath.Join(tb.Dir, "externals")))
	keep(os.RemoveAll(filepath.Join(tb.Dir, "clusters")))
	keep(tb.DeleteAllObjects(ctx))
	return firstErr
}

// DeleteAllObjects deletes all Nodes, all objects of meshd.io CRDs, and all
// leases in the lease namespace.
func (tb *Testbed) DeleteAllObjects(ctx context.Context) error {
	if err := tb.Kube.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	if err := tb.Kube.CoordinationV1().Leases(LeaseNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	cs, err := apiextensions.NewForConfig(tb.RESTConfig)
	if err != nil {
		return err
	}
	crds, err := cs.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, crd := range crds.Items {
		if crd.Spec.Group != "meshd.io" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Storage {
				continue
			}
			gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural}
			if err := tb.Dynamic.Resource(gvr).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting %s: %w", gvr, err)
			}
		}
	}
	return nil
}

// DeleteNode deletes the Node object (the namespace stays).
func (tb *Testbed) DeleteNode(ctx context.Context, name string) error {
	return tb.Kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
}

// NodeObject fetches the Node object.
func (tb *Testbed) NodeObject(ctx context.Context, name string) (*corev1.Node, error) {
	return tb.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}
