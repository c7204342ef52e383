package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/wg"
)

// rotationFakes is a two-location mesh whose node a1 keeps its key in a
// state directory, as meshd does.
func rotationFakes(t *testing.T) (*fakes, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	key, err := wg.LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakes(t, "a1",
		testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{}),
		testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", newKey(t)),
	)
	f.rec.setKey(key)
	f.rec.stateDir = dir
	return f, dir
}

func (f *fakes) annotate(t *testing.T, node string, ann map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if _, err := f.kube.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	f.refresh(t)
}

func (f *fakes) node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := f.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fakes) deviceKey(t *testing.T) wgtypes.Key {
	t.Helper()
	d, err := f.wgc.Device("meshd0")
	if err != nil {
		t.Fatal(err)
	}
	return d.PrivateKey
}

func (f *fakes) step(t *testing.T) {
	t.Helper()
	if err := f.rec.reconcile(context.Background()); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	f.refresh(t)
}

func keyFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// TestKeyRotation: meshd.io/rotate-key makes the node store and publish a
// next key (device unchanged), then, once its Node shows it, switch the
// device, publish the new public key with the request recorded, and commit
// the key file; the old key is in no annotation and no file. Nothing is
// written once it settled.
func TestKeyRotation(t *testing.T) {
	f, dir := rotationFakes(t)
	old := f.rec.key
	f.step(t)
	f.annotate(t, "a1", map[string]any{convert.AnnotationRotateKey: "r1"})

	f.step(t) // prepare
	next, ok, err := wg.LoadNextKey(dir)
	if err != nil || !ok || next == old {
		t.Fatalf("no next key stored (%v)", err)
	}
	me := f.node(t, "a1")
	if me.Annotations[convert.AnnotationNextPublicKey] != next.PublicKey().String() || me.Annotations[convert.AnnotationPublicKey] != old.PublicKey().String() {
		t.Fatalf("prepare published %v", me.Annotations)
	}
	if f.deviceKey(t) != old {
		t.Fatal("the device switched before the next key was published")
	}

	f.step(t) // switch
	if f.deviceKey(t) != next {
		t.Fatal("the device did not switch to the next key")
	}
	me = f.node(t, "a1")
	if me.Annotations[convert.AnnotationPublicKey] != next.PublicKey().String() || me.Annotations[convert.AnnotationRotatedKey] != "r1" {
		t.Fatalf("switch published %v", me.Annotations)
	}
	if _, ok := me.Annotations[convert.AnnotationNextPublicKey]; ok {
		t.Fatalf("next public key still published: %v", me.Annotations)
	}
	for k, v := range me.Annotations {
		if strings.Contains(v, old.PublicKey().String()) || strings.Contains(v, next.String()) || strings.Contains(v, old.String()) {
			t.Fatalf("annotation %s holds an old or a private key", k)
		}
	}
	if keyFile(t, dir, "private-key") != next.String() || keyFile(t, dir, "private-key.next") != "" {
		t.Fatal("key files not committed")
	}
	if got := testutil.ToFloat64(f.rec.metrics.keyRotations); got != 1 {
		t.Fatalf("meshd_key_rotations_total = %v", got)
	}
	settled := f.counters()
	f.step(t)
	f.step(t)
	if got := f.counters(); got != settled {
		t.Fatalf("a settled rotation keeps writing: %+v then %+v", settled, got)
	}
	// The same request again does nothing; a new one rotates again.
	f.annotate(t, "a1", map[string]any{convert.AnnotationRotateKey: "r2"})
	f.step(t)
	f.step(t)
	if f.deviceKey(t) == next || f.node(t, "a1").Annotations[convert.AnnotationRotatedKey] != "r2" {
		t.Fatal("a second request did not rotate again")
	}
}

// TestKeyRotationResumesAfterRestart: meshd restarted after the prepare
// continues with the stored next key; restarted between the publish and the
// commit it commits (the Node already shows the new key).
func TestKeyRotationResumesAfterRestart(t *testing.T) {
	t.Run("after prepare", func(t *testing.T) {
		f, dir := rotationFakes(t)
		f.step(t)
		f.annotate(t, "a1", map[string]any{convert.AnnotationRotateKey: "r1"})
		f.step(t)
		next, _, _ := wg.LoadNextKey(dir)
		// A new process: keys from the files, as newDaemon loads them.
		cur, err := wg.LoadOrCreateKey(dir)
		if err != nil {
			t.Fatal(err)
		}
		n, ok, err := wg.LoadNextKey(dir)
		if err != nil || !ok || n != next {
			t.Fatalf("next key not found after the restart (%v)", err)
		}
		f.rec = restarted(f, cur, n)
		f.step(t)
		if f.deviceKey(t) != next || keyFile(t, dir, "private-key") != next.String() {
			t.Fatal("the restarted node did not complete the rotation with the stored next key")
		}
	})
	t.Run("after publish", func(t *testing.T) {
		f, dir := rotationFakes(t)
		old := f.rec.key
		f.step(t)
		next, err := wg.LoadOrCreateNextKey(dir)
		if err != nil {
			t.Fatal(err)
		}
		// Stopped right after publishing the switch: the Node shows the
		// new key, the files still hold both.
		f.annotate(t, "a1", map[string]any{convert.AnnotationPublicKey: next.PublicKey().String(), convert.AnnotationRotateKey: "r1", convert.AnnotationRotatedKey: "r1"})
		f.rec = restarted(f, old, next)
		f.step(t)
		if f.deviceKey(t) != next || keyFile(t, dir, "private-key") != next.String() || keyFile(t, dir, "private-key.next") != "" {
			t.Fatal("the restarted node did not commit the published key")
		}
		if f.node(t, "a1").Annotations[convert.AnnotationPublicKey] != next.PublicKey().String() {
			t.Fatal("the restarted node published its old key again")
		}
	})
}

// restarted is f's reconciler as a new process builds it.
func restarted(f *fakes, key, next wgtypes.Key) *reconciler {
	o := f.rec
	src := o.sources
	src.freeze = nil
	ex := o.executors
	ex.key = key
	return newReconciler(reconcilerParts{
		log: o.log, opts: o.opts, node: o.node, port: o.port, topology: o.topology,
		sources: src, executors: ex, events: o.events, kube: o.kube, metrics: o.metrics,
		stateDir: o.stateDir, nextKey: next,
	})
}

// TestKeyRotationPublishFailureKeepsOldKey: when the switch cannot be
// published, the device goes back to the old key (the peers know no other)
// and the next key stays stored; the switch succeeds once the API does.
func TestKeyRotationPublishFailureKeepsOldKey(t *testing.T) {
	f, dir := rotationFakes(t)
	old := f.rec.key
	f.step(t)
	f.annotate(t, "a1", map[string]any{convert.AnnotationRotateKey: "r1"})
	f.step(t)
	next, _, _ := wg.LoadNextKey(dir)
	fail := true
	f.kube.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail {
			return true, nil, errors.New("API server unavailable")
		}
		return false, nil, nil
	})
	if err := f.rec.reconcile(context.Background()); err == nil {
		t.Fatal("a failed publish was not reported")
	}
	if f.deviceKey(t) != old || f.rec.key != old {
		t.Fatal("the device kept the unpublished key")
	}
	if keyFile(t, dir, "private-key") != old.String() || keyFile(t, dir, "private-key.next") != next.String() {
		t.Fatal("key files changed by a failed switch")
	}
	fail = false
	f.step(t)
	if f.deviceKey(t) != next || f.node(t, "a1").Annotations[convert.AnnotationPublicKey] != next.PublicKey().String() {
		t.Fatal("the switch did not complete once the API was back")
	}
}

// TestPeerFollowsRotatedKey: on another node, the rotated node's new key
// replaces the old peer (same allowed IPs, endpoint), the Node update skips
// the coalescer, and the old key leaves the discovered endpoints this node
// publishes at once.
func TestPeerFollowsRotatedKey(t *testing.T) {
	oldKey, newK := newKey(t), newKey(t)
	b1 := testNode("b1", "b", "198.51.100.21", "10.42.3.0/24", oldKey)
	a1 := testNode("a1", "a", "198.51.100.11", "10.42.1.0/24", wgtypes.Key{})
	// What a1 published before (a restart seeds its discovered endpoints).
	a1.Annotations[convert.AnnotationDiscoveredEndpoints] = `{"` + oldKey.PublicKey().String() + `":"198.51.100.21:51820"}`
	f := newFakes(t, "a1", a1, b1)
	f.step(t)
	if v := f.node(t, "a1").Annotations[convert.AnnotationDiscoveredEndpoints]; !strings.Contains(v, oldKey.PublicKey().String()) {
		t.Fatalf("discovered endpoints before the rotation: %q", v)
	}
	dev, _ := f.wgc.Device("meshd0")
	if len(dev.Peers) != 1 || dev.Peers[0].PublicKey != oldKey.PublicKey() {
		t.Fatalf("peers before: %+v", dev.Peers)
	}
	before := dev.Peers[0]

	oldObj := f.node(t, "b1")
	f.annotate(t, "b1", map[string]any{convert.AnnotationPublicKey: newK.PublicKey().String()})
	filter := nodeFilter{self: "a1", parse: convert.ParseOptions{TopologyLabel: "topology.kubernetes.io/region", Port: 51820}}
	if cur := f.node(t, "b1"); !filter.changed(oldObj, cur) || !filter.keyChanged(oldObj, cur) {
		t.Fatal("a changed public key is not a fast-path update")
	}
	f.step(t)
	dev, _ = f.wgc.Device("meshd0")
	if len(dev.Peers) != 1 || dev.Peers[0].PublicKey != newK.PublicKey() {
		t.Fatalf("peers after: %+v", dev.Peers)
	}
	if got := normalizeNets(dev.Peers[0].AllowedIPs); got != normalizeNets(before.AllowedIPs) {
		t.Fatalf("allowed IPs %s, were %s", got, normalizeNets(before.AllowedIPs))
	}
	if v := f.node(t, "a1").Annotations[convert.AnnotationDiscoveredEndpoints]; strings.Contains(v, oldKey.PublicKey().String()) {
		t.Fatalf("the rotated-away key is still in discovered endpoints: %s", v)
	}
}

func normalizeNets(ns []net.IPNet) string {
	var ss []string
	for _, n := range ns {
		ss = append(ss, n.String())
	}
	slices.Sort(ss)
	return strings.Join(ss, ",")
}

// TestPublicKeyReadDuringRotation: the debug endpoint reads the public key
// (reconciler.publicKey) from its own goroutine while a rotation switches
// the key; it sees the key the device uses once the switch is done, and
// the race detector sees no unsynchronised read.
func TestPublicKeyReadDuringRotation(t *testing.T) {
	f, _ := rotationFakes(t)
	old := f.rec.key
	if f.rec.publicKey() != old.PublicKey() {
		t.Fatal("publicKey is not the key's before any rotation")
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				_ = f.rec.publicKey()
			}
		}
	}()
	f.step(t)
	f.annotate(t, "a1", map[string]any{convert.AnnotationRotateKey: "r1"})
	f.step(t) // prepare
	f.step(t) // switch
	close(stop)
	<-done
	if dev := f.deviceKey(t); dev == old || f.rec.publicKey() != dev.PublicKey() {
		t.Fatalf("publicKey %s after the switch, device key's %s (old %s)", f.rec.publicKey(), dev.PublicKey(), old.PublicKey())
	}
}
