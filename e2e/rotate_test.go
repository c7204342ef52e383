//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"meshd.io/meshd/e2e/testbed"
	"meshd.io/meshd/pkg/k8s/convert"
)

var rotationLog = regexp.MustCompile(`time=(\S+) level=INFO msg="key rotation: (?:next key stored|done)`)

// TestKeyRotation (issue 13): `meshctl rotate-key a1` on the leader of
// location a while pods ping across it at 10 pps in both directions
// (pod(b1) <-> pod(a2): every packet crosses a1's WireGuard) and from it
// (pod(a1) -> pod(b1)). At most 1 ping is lost per path; afterwards the old
// public key is in no Node annotation and no node's WireGuard peers, a1's
// private key file changed and no next key file is left.
func TestKeyRotation(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	s.location("b", false)
	a1 := s.node(testbed.NodeOptions{Name: "a1", Location: "a", Annotations: map[string]string{convert.AnnotationLeader: "true"}})
	a2 := s.node(testbed.NodeOptions{Name: "a2", Location: "a"})
	b1 := s.node(testbed.NodeOptions{Name: "b1", Location: "b"})
	nodes := []*testbed.Node{a1, a2, b1}
	s.startMeshd(nodes)
	s.pingEventually(pod(b1), pod(a2).IP, 60*time.Second)
	s.pingEventually(pod(a2), pod(b1).IP, 60*time.Second)
	s.pingEventually(pod(a1), pod(b1).IP, 60*time.Second)

	keyPath := filepath.Join(a1.Dir, "state", "private-key")
	oldFile, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	oldKey := s.pubKey(a1)
	s.eventually(30*time.Second, 250*time.Millisecond, "b1 peers with a1's key", func() error {
		d, err := b1.WG(ctx, "meshd0")
		if err != nil || d.Peer(oldKey) == nil {
			return fmt.Errorf("b1 has no peer %s (%v)", oldKey, err)
		}
		return nil
	})

	const seconds = 20
	pings := map[string]*pingRun{
		"b1-a2": s.startPing("ping-b1-a2", pod(b1), pod(a2), seconds),
		"a2-b1": s.startPing("ping-a2-b1", pod(a2), pod(b1), seconds),
		"a1-b1": s.startPing("ping-a1-b1", pod(a1), pod(b1), seconds),
	}
	bin := meshctl(t)
	time.Sleep(4 * time.Second)
	start := time.Now()
	// meshctl runs where the API server is reachable: inside node b1.
	out, err := b1.Exec(ctx, bin, "--kubeconfig", tb.Kubeconfig, "rotate-key", "a1", "--timeout", "60s")
	if err != nil {
		t.Fatalf("meshctl rotate-key a1: %v\n%s", err, out)
	}
	t.Logf("meshctl rotate-key a1 (%s, icmp_seq ~%d): %s", time.Since(start).Round(time.Millisecond), 40+time.Since(start)/(100*time.Millisecond), strings.TrimSpace(out))
	if b, err := os.ReadFile(a1.MeshdLog()); err == nil {
		// meshd's own view: next key stored -> switch published and committed.
		m := rotationLog.FindAllStringSubmatch(string(b), -1)
		if len(m) == 2 {
			t0, _ := time.Parse(time.RFC3339Nano, m[0][1])
			t1, _ := time.Parse(time.RFC3339Nano, m[1][1])
			obj, err := tb.NodeObject(ctx, "a1")
			if err != nil {
				t.Fatal(err)
			}
			// meshctl writes the time of its request as the request.
			req, _ := time.Parse(time.RFC3339Nano, obj.Annotations[convert.AnnotationRotateKey])
			t.Logf("a1: next key stored %s after meshctl's request, rotation done %s later", t0.Sub(req), t1.Sub(t0))
		}
	}
	newKey := s.annotation(a1, testbed.AnnotationPublicKey)
	if newKey == oldKey {
		t.Fatal("a1's public key did not change")
	}

	for name, p := range pings {
		sent, lost, outage := s.pingResult(p)
		t.Logf("path %s: %d of %d pings lost at 10 pps (longest gap %s; %s)", name, lost, sent, outage, strings.TrimSpace(testbed.Tail(p.p.LogPath, 1)))
		if lost > 1 {
			t.Errorf("path %s lost %d pings across the key rotation (want <= 1)", name, lost)
		}
	}

	// The old key is gone everywhere.
	s.eventually(30*time.Second, 500*time.Millisecond, "the old key is gone from every Node and every WireGuard device", func() error {
		list, err := tb.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range list.Items {
			for k, v := range n.Annotations {
				if strings.Contains(v, oldKey) {
					return fmt.Errorf("node %s annotation %s still holds the old key: %s", n.Name, k, v)
				}
			}
		}
		for _, n := range nodes {
			d, err := n.WG(ctx, "meshd0")
			if err != nil {
				return fmt.Errorf("%s: %v", n.Name, err)
			}
			if d.Peer(oldKey) != nil || d.PublicKey == oldKey {
				return fmt.Errorf("%s's WireGuard still has the old key", n.Name)
			}
		}
		return nil
	})
	if d, err := a1.WG(ctx, "meshd0"); err != nil || d.PublicKey != newKey {
		t.Errorf("a1's device key is not the published one (%v)", err)
	}
	if d, err := b1.WG(ctx, "meshd0"); err != nil || d.Peer(newKey) == nil {
		t.Errorf("b1 does not peer with a1's new key (%v)", err)
	}
	newFile, err := os.ReadFile(keyPath)
	if err != nil || string(newFile) == string(oldFile) {
		t.Errorf("a1's private key file did not change (%v)", err)
	}
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("a1's private key file: %v %v", fi, err)
	}
	if _, err := os.Stat(keyPath + ".next"); !os.IsNotExist(err) {
		t.Errorf("a1's next key file is left behind (%v)", err)
	}
	obj, err := tb.NodeObject(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if obj.Annotations[convert.AnnotationRotatedKey] == "" || obj.Annotations[convert.AnnotationRotatedKey] != obj.Annotations[convert.AnnotationRotateKey] {
		t.Errorf("a1 does not record the request as done: %v", obj.Annotations)
	}
	// Neither the old private key nor the new one (read from the key file)
	// is in any log, Event, annotation, metric or meshctl's output.
	s.assertNoKeyLeaked([]string{string(oldFile)}, out)
}

// TestPresharedKeyRotation (issue 13): the preshared key Secret of an
// outside Peer changes while the Peer and a pod ping each other at 10 pps:
// the leader's preshared key for the Peer changes within a few seconds,
// through the Secret watch, the peer entry is updated in place (its
// transfer counters keep growing), and at most 1 ping is lost each way.
// Then the Peer handshakes afresh with the new key.
func TestPresharedKeyRotation(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	a1 := s.node(testbed.NodeOptions{Name: "a1", Location: "a", Annotations: map[string]string{convert.AnnotationLeader: "true"}})
	a2 := s.node(testbed.NodeOptions{Name: "a2", Location: "a"})
	laptop, err := tb.AddExternal(ctx, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	s.startMeshd([]*testbed.Node{a1, a2})

	lap := s.addPSKLaptop(laptop, "rotate-laptop-psk")
	psk, keyFile, pskFile, laptopKey := lap.psk, lap.keyFile, lap.pskFile, lap.key
	secrets := tb.Kube.CoreV1().Secrets(testbed.PeerSecretNamespace)
	s.eventually(30*time.Second, 250*time.Millisecond, "a1 configures the Peer with the Secret's preshared key", func() error {
		d, err := a1.WG(ctx, "meshd0")
		if err != nil {
			return err
		}
		if p := d.Peer(laptopKey); p == nil || p.PresharedKey != psk {
			return fmt.Errorf("no Peer with the preshared key on a1")
		}
		return nil
	})
	leaderKey := s.pubKey(a1)
	peerArgs := func(pskPath string) []string {
		return []string{"peer", leaderKey, "preshared-key", pskPath, "endpoint", s.annotation(a1, testbed.AnnotationEndpoint),
			"allowed-ips", strings.Join([]string{testbed.MeshCIDR, a1.PodCIDR.String(), a2.PodCIDR.String()}, ","), "persistent-keepalive", "10"}
	}
	cmds := [][]string{
		append([]string{"wg", "set", "wg0", "private-key", keyFile, "listen-port", fmt.Sprint(laptopPort)}, peerArgs(pskFile)...),
		{"ip", "addr", "add", laptopIP + "/32", "dev", "wg0"},
		{"ip", "link", "set", "wg0", "up"},
	}
	for _, c := range []string{testbed.MeshCIDR, a1.PodCIDR.String(), a2.PodCIDR.String()} {
		cmds = append(cmds, []string{"ip", "route", "add", c, "dev", "wg0", "src", laptopIP})
	}
	for _, c := range cmds {
		if out, err := laptop.Exec(ctx, c...); err != nil {
			t.Fatalf("laptop: %v %s", err, out)
		}
	}
	s.eventually(30*time.Second, 500*time.Millisecond, "laptop pings a2's pod", func() error {
		out, err := laptop.Exec(ctx, "ping", "-n", "-q", "-c", "1", "-W", "1", pod(a2).IP.String())
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})

	window := 12 * time.Second
	pings := []*pinger{
		s.startPingVia("laptop-a2", laptop.Start, pod(a2).IP.String(), window),
		s.startPingVia("a2-laptop", pod(a2).Start, laptopIP, window),
	}
	time.Sleep(3 * time.Second)
	d, err := a1.WG(ctx, "meshd0")
	if err != nil || d.Peer(laptopKey) == nil {
		t.Fatalf("a1: %v", err)
	}
	before := *d.Peer(laptopKey)

	psk2 := randomKey()
	sec, err := secrets.Get(ctx, "rotate-laptop-psk", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data["psk"] = []byte(psk2)
	changed := time.Now()
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var after testbed.WGPeer
	s.eventually(5*time.Second, 20*time.Millisecond, "the new preshared key on a1", func() error {
		d, err := a1.WG(ctx, "meshd0")
		if err != nil {
			return err
		}
		p := d.Peer(laptopKey)
		if p == nil {
			return fmt.Errorf("the Peer is gone from a1")
		}
		if p.PresharedKey != psk2 {
			return fmt.Errorf("old preshared key")
		}
		after = *p
		return nil
	})
	t.Logf("the new preshared key applied on a1 %s after the Secret update", time.Since(changed).Round(time.Millisecond))
	// Updated in place: a re-created peer would start its counters at 0.
	if after.RX < before.RX || after.TX < before.TX {
		t.Errorf("the Peer was re-created on a1: transfer went from rx %d tx %d to rx %d tx %d", before.RX, before.TX, after.RX, after.TX)
	}
	// The operator changes the laptop's side too.
	if out, err := laptop.Exec(ctx, "sh", "-c", "echo "+psk2+" > "+pskFile+" && wg set wg0 peer "+leaderKey+" preshared-key "+pskFile); err != nil {
		t.Fatalf("laptop: %v %s", err, out)
	}
	for _, pg := range pings {
		sent, lost := s.result(pg, window+30*time.Second)
		t.Logf("path %s: %d of %d pings lost at 10 pps", pg.name, lost, sent)
		if lost > 1 {
			t.Errorf("path %s lost %d pings across the preshared key change (want <= 1)", pg.name, lost)
		}
	}
	// A fresh handshake works with the new key: the laptop forgets the
	// leader's session and peers again.
	if out, err := laptop.Exec(ctx, "wg", "set", "wg0", "peer", leaderKey, "remove"); err != nil {
		t.Fatalf("laptop: %v %s", err, out)
	}
	since := time.Now().Add(-time.Second)
	if out, err := laptop.Exec(ctx, append([]string{"wg", "set", "wg0"}, peerArgs(pskFile)...)...); err != nil {
		t.Fatalf("laptop: %v %s", err, out)
	}
	s.eventually(20*time.Second, 250*time.Millisecond, "laptop pings a2's pod after a fresh handshake with the new preshared key", func() error {
		out, err := laptop.Exec(ctx, "ping", "-n", "-q", "-c", "1", "-W", "1", pod(a2).IP.String())
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		d, err := laptop.WG(ctx, "wg0")
		if err != nil {
			return err
		}
		if p := d.Peer(leaderKey); p == nil || !p.LatestHandshake.After(since) {
			return fmt.Errorf("no fresh handshake")
		}
		return nil
	})
	s.assertNoKeyLeaked([]string{psk, psk2})
}

// TestKeyRotationResumesAfterRestart (issue 13): meshd on n1 (its WireGuard
// device in a process of its own, so the restart alone loses nothing) stops
// in the middle of a rotation, after the prepare: the next key is stored in
// its state directory and published as meshd.io/next-public-key (written
// here as meshd writes them). Started again, it completes the rotation with
// that very key: published, on the device, committed to the key file, the
// old key gone from n2's WireGuard; at most 1 ping lost each way.
func TestKeyRotationResumesAfterRestart(t *testing.T) {
	s := newScenario(t, true)
	ctx := s.ctx
	s.location("a", false)
	s.location("b", false)
	n1 := s.node(testbed.NodeOptions{Name: "n1", Location: "a"})
	n2 := s.node(testbed.NodeOptions{Name: "n2", Location: "b"})
	if _, err := n1.StartDevice(ctx, "meshd0"); err != nil {
		t.Fatal(err)
	}
	args := []string{"--mesh-granularity", "full", "--wireguard", "auto"}
	s.startMeshd([]*testbed.Node{n1, n2}, args...)
	s.pingEventually(pod(n2), pod(n1).IP, 60*time.Second)
	s.pingEventually(pod(n1), pod(n2).IP, 10*time.Second)
	oldKey := s.pubKey(n1)
	oldFile, err := os.ReadFile(filepath.Join(n1.Dir, "state", "private-key"))
	if err != nil {
		t.Fatal(err)
	}

	pingStart := time.Now()
	pings := map[string]*pingRun{
		"n2-n1": s.startPing("ping-n2-n1", pod(n2), pod(n1), 20),
		"n1-n2": s.startPing("ping-n1-n2", pod(n1), pod(n2), 20),
	}
	// When what happened, in icmp_seq terms (seq n leaves n×100 ms after
	// the start), for a loss to be placed.
	seq := func() int { return int(time.Since(pingStart) / (100 * time.Millisecond)) }
	time.Sleep(2 * time.Second)
	t.Logf("stopping meshd on n1 at icmp_seq ~%d", seq())
	if err := n1.StopMeshd(syscall.SIGTERM, 15*time.Second); err != nil {
		t.Fatalf("stopping meshd on n1: %v", err)
	}
	// What the prepare leaves behind.
	next, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(n1.Dir, "state", "private-key")
	if err := os.WriteFile(keyPath+".next", []byte(next.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"restart-test",%q:%q}}}`, convert.AnnotationRotateKey, convert.AnnotationNextPublicKey, next.PublicKey().String())
	if _, err := tb.Kube.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	restart := time.Now()
	t.Logf("starting meshd on n1 at icmp_seq ~%d", seq())
	if err := n1.StartMeshd(args...); err != nil {
		t.Fatal(err)
	}
	s.eventually(30*time.Second, 100*time.Millisecond, "n1 completes the rotation after its restart", func() error {
		obj, err := tb.NodeObject(ctx, "n1")
		if err != nil {
			return err
		}
		if obj.Annotations[convert.AnnotationRotatedKey] != "restart-test" || obj.Annotations[convert.AnnotationPublicKey] != next.PublicKey().String() {
			return fmt.Errorf("annotations %v", obj.Annotations)
		}
		return nil
	})
	t.Logf("n1 completed the rotation %s after meshd started again (icmp_seq ~%d)", time.Since(restart).Round(time.Millisecond), seq())
	for name, p := range pings {
		sent, lost, outage := s.pingResult(p)
		t.Logf("path %s: %d of %d pings lost at 10 pps (longest gap %s; %s)", name, lost, sent, outage, strings.TrimSpace(testbed.Tail(p.p.LogPath, 1)))
		if lost > 1 {
			t.Errorf("path %s lost %d pings (want <= 1)", name, lost)
		}
	}
	if b, err := os.ReadFile(keyPath); err != nil || strings.TrimSpace(string(b)) != next.String() {
		t.Errorf("n1's key file does not hold the next key (%v)", err)
	}
	if _, err := os.Stat(keyPath + ".next"); !os.IsNotExist(err) {
		t.Errorf("n1's next key file is left behind (%v)", err)
	}
	s.eventually(10*time.Second, 250*time.Millisecond, "n2 peers with n1's new key only", func() error {
		d, err := n2.WG(ctx, "meshd0")
		if err != nil {
			return err
		}
		if d.Peer(oldKey) != nil || d.Peer(next.PublicKey().String()) == nil {
			return fmt.Errorf("n2's peers: %+v", d.Peers)
		}
		return nil
	})
	if d, err := n1.WG(ctx, "meshd0"); err != nil || d.PublicKey != next.PublicKey().String() {
		t.Errorf("n1's device key is not the next key (%v)", err)
	}
	s.assertNoKeyLeaked([]string{string(oldFile)})
}
