//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/client/clientset/versioned"
)

// checkPeerStatusTrust: under the node-self admission policy, meshd on a
// and b (leaders of their own locations, with tokens bound to Pods on their
// nodes) write their own entries of Peer peer's status; a's token may change
// its own entry, but not b's, may not add one in b's name, and may not
// change the Peer's spec (RBAC grants peers/status only).
func checkPeerStatusTrust(s *scenario, kubeconfigA string, a, b *testbed.Node, peer string) {
	t := s.t
	t.Helper()
	ctx := s.ctx
	s.eventually(60*time.Second, 500*time.Millisecond, "both leaders' entries in the status of Peer "+peer, func() error {
		p, err := tb.Dynamic.Resource(testbed.PeerGVR).Get(ctx, peer, metav1.GetOptions{})
		if err != nil {
			return err
		}
		leaders, _, _ := unstructured.NestedSlice(p.Object, "status", "leaders")
		nodes := map[string]bool{}
		for _, e := range leaders {
			if m, ok := e.(map[string]any); ok && m["applied"] == true {
				nodes[fmt.Sprint(m["node"])] = true
			}
		}
		if !nodes[a.Name] || !nodes[b.Name] {
			return fmt.Errorf("status.leaders = %v, want applied entries of %s and %s", leaders, a.Name, b.Name)
		}
		return nil
	})
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigA)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dial = testbed.NetnsDialer("/run/netns/" + tb.CPNS)
	client, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	peers := client.MeshdV1alpha1().Peers()
	// Nodes may list and watch Peers, not get them: read as the admin.
	admin, err := versioned.NewForConfig(tb.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	// update changes the Peer's status as a's token (retrying conflicts
	// with meshd's own writes) and returns the HTTP status.
	update := func(change func(p *v1alpha1.Peer)) (int, error) {
		for i := 0; ; i++ {
			p, err := admin.MeshdV1alpha1().Peers().Get(ctx, peer, metav1.GetOptions{})
			if err != nil {
				return statusOf(err), err
			}
			change(p)
			_, err = peers.UpdateStatus(ctx, p, metav1.UpdateOptions{})
			if code := statusOf(err); code == 409 && i < 10 {
				continue
			}
			return statusOf(err), err
		}
	}
	entry := func(p *v1alpha1.Peer, node string) *v1alpha1.PeerLeaderStatus {
		for i := range p.Status.Leaders {
			if p.Status.Leaders[i].Node == node {
				return &p.Status.Leaders[i]
			}
		}
		return &v1alpha1.PeerLeaderStatus{}
	}
	const byPolicy = "may add or change only its own entry"
	checks := []struct {
		what string
		do   func() (int, error)
		want int
		why  string // in the error of a refusal
	}{
		{a.Name + " marks " + b.Name + "'s entry not applied", func() (int, error) {
			return update(func(p *v1alpha1.Peer) { entry(p, b.Name).Applied = false })
		}, 403, byPolicy},
		{a.Name + " adds an entry in " + b.Name + "'s name", func() (int, error) {
			return update(func(p *v1alpha1.Peer) {
				p.Status.Leaders = append(p.Status.Leaders, v1alpha1.PeerLeaderStatus{Location: "forged", Node: b.Name, Accepted: true})
			})
		}, 403, byPolicy},
		{a.Name + " changes the Peer's spec", func() (int, error) {
			p, err := admin.MeshdV1alpha1().Peers().Get(ctx, peer, metav1.GetOptions{})
			if err != nil {
				return statusOf(err), err
			}
			p.Spec.AllowedIPs = append(p.Spec.AllowedIPs, "10.99.0.0/16")
			_, err = peers.Update(ctx, p, metav1.UpdateOptions{})
			return statusOf(err), err
		}, 403, `cannot update resource "peers"`},
		{a.Name + " rewrites its own entry's message", func() (int, error) {
			return update(func(p *v1alpha1.Peer) { entry(p, a.Name).Message = "trust e2e" })
		}, 200, ""},
	}
	for _, c := range checks {
		code, err := c.do()
		switch {
		case code != c.want:
			t.Errorf("%s: HTTP %d, want %d (%v)", c.what, code, c.want, err)
		case c.why != "" && (err == nil || !strings.Contains(err.Error(), c.why)):
			t.Errorf("%s: refused for another reason than %q: %v", c.what, c.why, err)
		default:
			t.Logf("%s: HTTP %d (%v)", c.what, code, err)
		}
	}
}
