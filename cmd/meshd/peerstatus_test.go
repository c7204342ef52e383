package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

type reports struct{ got []convert.PeerReport }

func (r *reports) Report(p convert.PeerReport) { r.got = append(r.got, p) }

// TestReportPeers: the leader reports a usable Peer as applied (it is on
// the interface) and a Peer whose preshared-key Secret is missing as not
// accepted, with the problem; a non-leader reports no findings.
func TestReportPeers(t *testing.T) {
	good := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "good"}, Spec: v1alpha1.PeerSpec{
		PublicKey: newKey(t).PublicKey().String(), AllowedIPs: []string{"10.5.0.1/32"}}}
	bad := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: v1alpha1.PeerSpec{
		PublicKey: newKey(t).PublicKey().String(), AllowedIPs: []string{"10.5.0.2/32"},
		PresharedKeySecretRef: &v1alpha1.SecretKeyRef{Namespace: "meshd-peers", Name: "missing", Key: "psk"}}}
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("a2", "a", "198.51.100.12", "10.42.2.0/24", newKey(t)),
	)
	f.rec.peerLister = sliceLister{good, bad}
	rep := &reports{}
	f.rec.peerStatus = rep
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(rep.got) != 1 {
		t.Fatalf("%d reports, want 1", len(rep.got))
	}
	r := rep.got[0]
	if r.Node != "a1" || r.Location != "a" || !r.Leader {
		t.Fatalf("report %+v: want leader a1 of location a", r)
	}
	if g := r.Peers["good"]; !g.Accepted || !g.Applied || g.Message != "" {
		t.Errorf("good = %+v, want accepted and applied", g)
	}
	if b := r.Peers["bad"]; b.Accepted || b.Applied || b.Message == "" {
		t.Errorf("bad = %+v, want not accepted with a message", b)
	}

	// a2 (not the leader, a1 sorts first) reports nothing about Peers.
	f2 := newFakes(t, "a2",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", newKey(t)),
		testNode("a2", "a", "198.51.100.12", "10.42.2.0/24", wgtypes.Key{}),
	)
	f2.rec.peerLister = sliceLister{good}
	rep2 := &reports{}
	f2.rec.peerStatus = rep2
	if err := f2.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(rep2.got) != 1 || rep2.got[0].Leader || rep2.got[0].Peers != nil {
		t.Fatalf("non-leader report = %+v", rep2.got)
	}
}

func TestStatusOnly(t *testing.T) {
	a := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 2, ResourceVersion: "5"}, Spec: v1alpha1.PeerSpec{PublicKey: "k"}}
	b := a.DeepCopy()
	b.ResourceVersion = "6"
	b.Status.Leaders = []v1alpha1.PeerLeaderStatus{{Location: "a", Node: "n1"}}
	if !statusOnly(a, b) {
		t.Error("a status write must not trigger a reconcile")
	}
	c := b.DeepCopy()
	c.Generation = 3
	c.Spec.AllowedIPs = []string{"10.5.0.1/32"}
	if statusOnly(b, c) {
		t.Error("a spec change must trigger a reconcile")
	}
}

// TestReportsPeersBounded: with more locations than convert.MaxPeerStatusLeaders
// (a full mesh of many nodes) only the first ones by name report on Peers.
func TestReportsPeersBounded(t *testing.T) {
	plan := &mesh.Plan{Leaders: map[string]string{}}
	for i := range 40 {
		plan.Leaders[fmt.Sprintf("n%02d", i)] = fmt.Sprintf("n%02d", i)
	}
	for loc, want := range map[string]bool{"n00": true, "n31": true, "n32": false, "n39": false} {
		plan.Location = loc
		if got := reportsPeers(plan); got != want {
			t.Errorf("location %s reports: %v, want %v", loc, got, want)
		}
	}
	plan.Leaders = map[string]string{"z": "z"}
	plan.Location = "z"
	if !reportsPeers(plan) {
		t.Error("with few locations every leader reports")
	}
}

// TestReportPeersOverlapKeepsTheOlder: a new Peer whose allowed IPs cover
// an existing Peer's cannot take them, whatever its name: the one created
// first keeps them (on every node alike: creationTimestamp comes from the
// API server), and the newcomer's status says what was dropped of it.
func TestReportPeersOverlapKeepsTheOlder(t *testing.T) {
	old := metav1.NewTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	laptop := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "laptop", CreationTimestamp: old}, Spec: v1alpha1.PeerSpec{
		PublicKey: newKey(t).PublicKey().String(), AllowedIPs: []string{"10.5.0.1/32"}}}
	office := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: "aaa-office", CreationTimestamp: metav1.NewTime(old.Add(24 * time.Hour))}, Spec: v1alpha1.PeerSpec{
		PublicKey: newKey(t).PublicKey().String(), AllowedIPs: []string{"10.5.0.0/16", "10.6.0.0/16"}}}
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
	)
	f.rec.peerLister = sliceLister{office, laptop}
	rep := &reports{}
	f.rec.peerStatus = rep
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	d, err := f.wgc.Device("meshd0")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]string{}
	for _, p := range d.Peers {
		for _, o := range []*v1alpha1.Peer{laptop, office} {
			if p.PublicKey.String() == o.Spec.PublicKey {
				allowed[o.Name] = fmt.Sprint(p.AllowedIPs)
			}
		}
	}
	if allowed["laptop"] != "[{10.5.0.1 ffffffff}]" || allowed["aaa-office"] != "[{10.6.0.0 ffff0000}]" {
		t.Errorf("WireGuard allowed IPs %v: want laptop (created first) to keep 10.5.0.1/32 and aaa-office only 10.6.0.0/16", allowed)
	}
	r := rep.got[len(rep.got)-1]
	if l := r.Peers["laptop"]; !l.Applied || l.Message != "" {
		t.Errorf("laptop = %+v, want applied without a problem", l)
	}
	if o := r.Peers["aaa-office"]; !o.Applied || !strings.Contains(o.Message, "allowed IP 10.5.0.0/16 of peer aaa-office overlaps 10.5.0.1/32 of peer laptop") {
		t.Errorf("aaa-office = %+v, want applied, its status saying 10.5.0.0/16 was dropped for laptop", o)
	}
}
