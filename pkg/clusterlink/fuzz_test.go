package clusterlink

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/k8s/convert"
	"meshd.io/meshd/pkg/mesh"
)

// fuzzKeyText is a deterministic key's base64 text.
func fuzzKeyText(i int) string { return wgtypes.Key(sha256.Sum256([]byte{byte(i)})).String() }

// checkEndpoint checks that e is empty, an IP endpoint with a port, or a
// DNS name with a port.
func checkEndpoint(t *testing.T, e mesh.Endpoint) {
	t.Helper()
	if e.IsZero() {
		return
	}
	a := e.Addr.Addr()
	if e.Host != "" {
		if a.IsValid() || e.Addr.Port() == 0 {
			t.Errorf("DNS endpoint %q has address %v", e.Host, e.Addr)
		}
		return
	}
	if e.Addr.Port() == 0 || a.Is4In6() || a.Zone() != "" {
		t.Errorf("endpoint %v is not usable", e.Addr)
	}
}

// fuzzReader hands out the fuzzer's bytes one decision at a time (zero once
// they run out).
type fuzzReader []byte

func (b *fuzzReader) n(m int) int {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return int(c) % m
}

// remoteNodes decodes a linked cluster's nodes: names, regions, keys,
// internal and external IPs of both families, pod CIDRs and published mesh
// IPs from small universes, so that overlaps with the local ranges are
// frequent.
func remoteNodes(data []byte) []*corev1.Node {
	b := fuzzReader(data)
	var nodes []*corev1.Node
	for range b.n(6) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("w%d", b.n(5)),
			Labels:      map[string]string{convert.DefaultTopologyLabel: []string{"a", "b", ""}[b.n(3)]},
			Annotations: map[string]string{},
		}}
		if k := b.n(5); k > 0 {
			n.Annotations[convert.AnnotationPublicKey] = fuzzKeyText(k)
		}
		v4 := func() string { return fmt.Sprintf("10.%d.%d.%d", []int{4, 42, 43, 96}[b.n(4)], b.n(3), b.n(4)) }
		v6 := func() string { return fmt.Sprintf("fd%02x::%x", []int{0x4e, 0x42, 0x43, 0x96}[b.n(4)], b.n(4)) }
		if b.n(2) == 1 {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: v4()})
		}
		if b.n(2) == 1 {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: v6()})
		}
		if b.n(3) == 0 {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: fmt.Sprintf("198.51.100.%d", b.n(4))})
		}
		for range b.n(3) {
			if b.n(2) == 0 {
				n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, v4()+"/"+strconv.Itoa([]int{16, 24, 32, 8}[b.n(4)]))
			} else {
				n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, v6()+"/"+strconv.Itoa([]int{64, 112, 128, 16}[b.n(4)]))
			}
		}
		if b.n(2) == 1 {
			n.Annotations[convert.AnnotationWireGuardIP] = v4()
		}
		if b.n(3) == 0 {
			n.Annotations[convert.AnnotationAllowedLocationIPs] = v4() + "/24"
		}
		if b.n(4) == 0 {
			n.Annotations[convert.AnnotationLeader] = "true"
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// FuzzLinkFromSecret reads a link Secret with fuzzed annotations, then
// computes the linked cluster's peers from fuzzed remote nodes. A read
// Secret's settings written back as annotations read the same; no remote
// peer's allowed IP overlaps a local range, the remote service CIDRs go to
// at most one peer, and every peer is usable.
func FuzzLinkFromSecret(f *testing.F) {
	f.Add("west", "10.97.0.0/16", "location", "10.5.0.0/16", "", "51820", []byte("kubeconfig"), []byte{3, 0, 0, 1, 1, 1, 0, 2, 1, 1, 1, 1, 1, 0, 1, 1, 2, 0, 1, 1, 1, 3, 1, 1, 1}, "10.42.0.0/16,10.96.0.0/12,10.4.0.0/16")
	f.Add("east", "10.96.0.0/12,fd96::/108", "full", "10.4.0.0/16,fd4e::/64", "zone", "4000", []byte("k"), []byte("\x05some nodes with overlapping pod CIDRs and keys"), "10.42.0.0/16,fd42::/48,10.96.0.0/12")
	f.Add("", "", "", "", "", "0", []byte(nil), []byte{}, "")
	f.Add("x", "bad", "mesh", "10.4.0.0/31,fd00::/127", "", "65536", []byte("k"), []byte{1, 1, 1, 1}, "0.0.0.0/0")
	f.Fuzz(func(t *testing.T, cluster, services, granularity, meshCIDRs, topology, port string, kubeconfig, nodeBytes []byte, localRanges string) {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "meshd", Name: LinkSecretPrefix + "x", Annotations: map[string]string{}},
			Data:       map[string][]byte{LinkKubeconfigKey: kubeconfig},
		}
		for k, v := range map[string]string{
			AnnotationRemoteCluster: cluster, AnnotationRemoteServiceCIDRs: services, AnnotationRemoteGranularity: granularity,
			AnnotationRemoteMeshCIDRs: meshCIDRs, AnnotationRemoteTopologyLabel: topology, AnnotationRemotePort: port,
		} {
			if v != "" {
				s.Annotations[k] = v
			}
		}
		ls, kc, err := LinkFromSecret(s)
		if err != nil {
			if kc != nil {
				t.Errorf("error %v with a kubeconfig", err)
			}
		} else {
			if !bytes.Equal(kc, kubeconfig) || len(kc) == 0 {
				t.Errorf("kubeconfig %q, want %q", kc, kubeconfig)
			}
			// Written back as GrantLink writes it, it reads the same.
			s2 := s.DeepCopy()
			s2.Annotations = ls.annotations()
			ls2, _, err := LinkFromSecret(s2)
			if err != nil {
				t.Fatalf("settings %+v written back do not read: %v", ls, err)
			}
			if !reflect.DeepEqual(ls, ls2) {
				t.Fatalf("read, write, read: %+v became %+v", ls, ls2)
			}
		}
		if ls.Port < 1 || ls.Port > 65535 || len(ls.MeshCIDRs) == 0 || ls.Granularity == "" || ls.TopologyLabel == "" {
			t.Errorf("settings not defaulted: %+v", ls)
		}

		var local []netip.Prefix
		for _, r := range strings.Split(localRanges, ",") {
			if p, err := netip.ParsePrefix(strings.TrimSpace(r)); err == nil {
				local = append(local, p.Masked())
			}
		}
		nodes := remoteNodes(nodeBytes)
		peers, problems := RemotePeers(ls, nodes, mesh.RemoteGuard{Local: local})
		for _, p := range problems {
			if p == nil || !strings.Contains(p.Error(), ls.Name) {
				t.Errorf("problem %v does not name cluster %q", p, ls.Name)
			}
		}
		withServices := 0
		names := map[string]bool{}
		for _, p := range peers {
			if p.PublicKey == (wgtypes.Key{}) || len(p.AllowedIPs) == 0 || !strings.HasPrefix(p.Name, "cluster-"+ls.Name+"-") || names[p.Name] {
				t.Errorf("unusable or duplicate peer %+v", p)
			}
			names[p.Name] = true
			checkEndpoint(t, p.Endpoint)
			hasService := false
			for _, a := range p.AllowedIPs {
				for _, l := range local {
					if a.Overlaps(l) {
						t.Errorf("peer %s: allowed IP %v overlaps local range %v", p.Name, a, l)
					}
				}
				for _, svc := range ls.ServiceCIDRs {
					hasService = hasService || a == svc
				}
			}
			if hasService {
				withServices++
			}
		}
		if withServices > 1 {
			t.Errorf("the remote service CIDRs go to %d peers", withServices)
		}
	})
}

// checkExpiry checks a token expiry that was found: whole seconds within
// 2000-9999, and encodable the ways it is published (meshctl status -o
// json|yaml, the ClusterLink's spec.tokenExpires) and read back.
func checkExpiry(t *testing.T, what string, exp time.Time) {
	t.Helper()
	if exp.Before(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)) || exp.After(time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)) || exp.Nanosecond() != 0 {
		t.Fatalf("%s: expiry %v is not whole seconds within 2000-9999", what, exp)
	}
	if _, err := json.Marshal(exp); err != nil {
		t.Fatalf("%s: expiry %v: %v", what, exp, err)
	}
	if _, err := yaml.Marshal(map[string]time.Time{"tokenExpires": exp}); err != nil {
		t.Fatalf("%s: expiry %v: %v", what, exp, err)
	}
	mt := metav1.NewTime(exp.UTC())
	b, err := json.Marshal(mt)
	if err != nil {
		t.Fatalf("%s: expiry %v as metav1.Time: %v", what, exp, err)
	}
	var back metav1.Time
	if err := json.Unmarshal(b, &back); err != nil || !back.Equal(&mt) {
		t.Fatalf("%s: expiry %v written as %s reads back as %v (%v)", what, exp, b, back, err)
	}
}

// FuzzLinkTokenExpiry reads the expiry of a link Secret's token from a
// fuzzed meshd.io/link-token-expires annotation and a fuzzed JWT payload
// (and jwtExpiry from a fuzzed token). A found expiry is whole seconds
// within 2000-9999 and encodes as JSON, YAML and metav1.Time; the annotation
// wins when it is such a time, else the claim "exp" (a number) of the
// current context's token, else that of the kubeconfig's other user.
func FuzzLinkTokenExpiry(f *testing.F) {
	f.Add("", []byte(`{"exp":1800000000}`), "")
	f.Add("2027-11-25T09:00:00Z", []byte(`{"exp":1800000000.5,"sub":"x"}`), "eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE4MDAwMDAwMDB9.c2ln")
	f.Add("10000-01-01T00:00:00Z", []byte(`{"exp":999999999999}`), "a.b.c")
	f.Add("9999-12-31T23:30:00-01:00", []byte(`{"exp":-1e300}`), "x.eyJleHAiOjk5OTk5OTk5OTk5OX0=.y")
	f.Add("1999-12-31T23:59:59Z", []byte(`{"exp":946684800,"EXP":253402300800}`), "..")
	f.Add("soon", []byte(`{"exp":"1800000000"}`), "x.bnVsbA.y")
	f.Add("", []byte(`null`), "")
	f.Fuzz(func(t *testing.T, annotation string, payload []byte, token string) {
		if exp, ok := jwtExpiry(token); ok {
			checkExpiry(t, fmt.Sprintf("token %q", token), exp)
		}
		tok := "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(payload) + ".c2ln"
		claimed, ok := jwtExpiry(tok)
		var claims struct{ Exp *float64 }
		want := json.Unmarshal(payload, &claims) == nil && claims.Exp != nil && *claims.Exp >= 946684800 && *claims.Exp <= 253402300799
		if ok != want || ok && !claimed.Equal(time.Unix(int64(*claims.Exp), 0)) {
			t.Fatalf("payload %q: expiry %v %v, want the exp claim's whole seconds when within 2000-9999", payload, claimed, ok)
		}
		if ok {
			checkExpiry(t, fmt.Sprintf("payload %q", payload), claimed)
		}

		other := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		otherTok := "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"exp":%d}`, other.Unix()))) + ".c2ln"
		kc := fmt.Sprintf("apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: c, user: z}\n"+
			"users:\n- name: a\n  user: {token: %q}\n- name: z\n  user: {token: %q}\n", otherTok, tok)
		s := &corev1.Secret{Data: map[string][]byte{LinkKubeconfigKey: []byte(kc)}}
		if annotation != "" {
			s.Annotations = map[string]string{AnnotationLinkTokenExpires: annotation}
		}
		got, ok := LinkTokenExpiry(s)
		if !ok {
			t.Fatalf("annotation %q, payload %q: no expiry (user a's token says %v)", annotation, payload, other)
		}
		checkExpiry(t, fmt.Sprintf("annotation %q, payload %q", annotation, payload), got)
		switch a, err := time.Parse(time.RFC3339, annotation); {
		case err == nil && !a.Before(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)) && !a.After(time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)):
			if !got.Equal(a) {
				t.Fatalf("annotation %q: expiry %v, want the annotation's", annotation, got)
			}
		case want:
			if !got.Equal(claimed) {
				t.Fatalf("annotation %q, payload %q: expiry %v, want the current context's token's %v", annotation, payload, got, claimed)
			}
		default:
			if !got.Equal(other) {
				t.Fatalf("annotation %q, payload %q: expiry %v, want the other user's %v", annotation, payload, got, other)
			}
		}
	})
}

// fuzzList splits a fuzzed list (sep-separated; "" is no entry).
func fuzzList(s, sep string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, sep)
}

// FuzzRemoteFromObject reads a ClusterLink with fuzzed spec and status, as
// every meshd node does, then applies this cluster's trust policy to its
// leaders (Remote.Peers). Every CIDR either reads (masked) or is named in
// the error; the leaders read back the same from the status the link
// controller writes for them (LeaderStatus); no peer's allowed IP overlaps a
// local range, leaves the ranges agreed at link time, or covers a leader's
// endpoint; the result does not depend on the call.
func FuzzRemoteFromObject(f *testing.F) {
	f.Add("c2", "", true, "10.8.0.0/16,10.112.0.0/12", "10.8.0.0/16", "True", "True",
		"a,b", "1,2", "198.51.100.9:51820,vpn.c2.example:51820", "10.8.0.5/32,10.9.0.0/24;10.112.0.0/12", int32(25), "10.4.0.0/16,10.96.0.0/12")
	f.Add("c3", "the link Secret has no kubeconfig", false, "", "bad,fd00::/64,10.5.0.1/16", "False", "False",
		"x", "not-a-key", "", "10.0.0.0/8", int32(0), "10.0.0.0/16")
	f.Add("c4", "", true, "0.0.0.0/0,::/0", "", "Unknown", "False",
		"l1,l2,l3", "3,3,", "[2001:db8::9]:4000,[::ffff:198.51.100.1]:1,host:0", "198.51.100.1/32,0.0.0.0/0;::/0;10.1.0.1/8", int32(-1), "")
	f.Add("", "", true, "", "10.4.0.0/33", "", "", "", "", "[fe80::1%eth0]:5,1.2.3.4", "", int32(65536), "fd4e::/64")
	f.Fuzz(func(t *testing.T, name, problem string, recorded bool, allowed, meshCIDRs, synced, reachable, leaders, keys, endpoints, leaderIPs string, keepalive int32, local string) {
		cl := &v1alpha1.ClusterLink{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.ClusterLinkSpec{
				Problem: problem, AllowedCIDRsRecorded: recorded, AllowedCIDRs: fuzzList(allowed, ","), MeshCIDRs: fuzzList(meshCIDRs, ","),
			},
			Status: v1alpha1.ClusterLinkStatus{Conditions: []metav1.Condition{
				{Type: ConditionSynced, Status: metav1.ConditionStatus(synced)},
				{Type: ConditionReachable, Status: metav1.ConditionStatus(reachable)},
			}},
		}
		if keepalive%7 == 0 {
			exp := metav1.NewTime(time.Unix(int64(keepalive)*1000, 0))
			cl.Spec.TokenExpires = &exp
		}
		ks, es, ips := fuzzList(keys, ","), fuzzList(endpoints, ","), fuzzList(leaderIPs, ";")
		for i, n := range fuzzList(leaders, ",") {
			l := v1alpha1.ClusterLinkLeader{Name: n, PersistentKeepalive: keepalive + int32(i)}
			if i < len(ks) {
				l.PublicKey = ks[i]
				if k, err := strconv.Atoi(ks[i]); err == nil {
					l.PublicKey = fuzzKeyText(k)
				}
			}
			if i < len(es) {
				l.Endpoint = es[i]
			}
			if i < len(ips) {
				l.AllowedIPs = fuzzList(ips[i], ",")
			}
			cl.Status.Leaders = append(cl.Status.Leaders, l)
		}
		orig := cl.DeepCopy()

		r := RemoteFromObject(cl)
		if !reflect.DeepEqual(cl, orig) {
			t.Fatal("RemoteFromObject modified the ClusterLink")
		}
		if again := RemoteFromObject(cl); !reflect.DeepEqual(again.Link, r.Link) || !reflect.DeepEqual(again.Leaders, r.Leaders) || fmt.Sprint(again.Err) != fmt.Sprint(r.Err) {
			t.Fatalf("reading twice differs: %+v and %+v", r, again)
		}
		if r.Object != cl || r.Link.Cluster != name {
			t.Fatalf("object %p, cluster %q; want %p, %q", r.Object, r.Link.Cluster, cl, name)
		}
		errText := ""
		if r.Err != nil {
			errText = r.Err.Error()
			if !strings.HasPrefix(errText, "ClusterLink "+name+": ") {
				t.Fatalf("error %q does not name ClusterLink %q", errText, name)
			}
		}
		bad := problem != ""
		if problem != "" && !strings.Contains(errText, problem) {
			t.Fatalf("error %q lacks the problem %q", errText, problem)
		}
		// Every CIDR reads, masked, or is named in the error.
		cidrs := func(field string, in []string, got []netip.Prefix) {
			var want []netip.Prefix
			for _, s := range in {
				p, err := netip.ParsePrefix(s)
				if err == nil {
					want = append(want, p.Masked())
					continue
				}
				bad = true
				if !strings.Contains(errText, fmt.Sprintf("%s: %q", field, s)) {
					t.Fatalf("%s %q neither read nor named in the error %q", field, s, errText)
				}
			}
			if len(want) != len(got) || len(want) > 0 && !reflect.DeepEqual(want, got) {
				t.Fatalf("%s %q read as %v, want %v", field, in, got, want)
			}
		}
		if recorded {
			if r.Link.Allowed == nil {
				t.Fatal("recorded allowed ranges read as none recorded (nil)")
			}
			cidrs("spec.allowedCIDRs", cl.Spec.AllowedCIDRs, r.Link.Allowed)
		} else if r.Link.Allowed != nil {
			t.Fatalf("no allowed ranges recorded, read %v", r.Link.Allowed)
		}
		cidrs("spec.meshCIDRs", cl.Spec.MeshCIDRs, r.Link.MeshCIDRs)
		if (cl.Spec.TokenExpires == nil) != r.TokenExpires.IsZero() || cl.Spec.TokenExpires != nil && !r.TokenExpires.Equal(cl.Spec.TokenExpires.Time) {
			t.Fatalf("token expiry %v, want %v", r.TokenExpires, cl.Spec.TokenExpires)
		}
		if r.Observed != (synced == string(metav1.ConditionTrue)) || r.Unreachable != (reachable == string(metav1.ConditionFalse)) {
			t.Fatalf("conditions Synced=%q Reachable=%q read as observed %v, unreachable %v", synced, reachable, r.Observed, r.Unreachable)
		}
		// Leaders: read, or named in the error; what the link controller
		// writes for a leader reads back the same.
		read := 0
		for _, l := range cl.Status.Leaders {
			if _, err := leaderPeer(l); err == nil {
				if read >= len(r.Leaders) {
					t.Fatalf("leader %+v was not read", l)
				}
				p := r.Leaders[read]
				read++
				if p.Name != l.Name || p.PublicKey.String() != l.PublicKey || p.PersistentKeepalive != time.Duration(l.PersistentKeepalive)*time.Second {
					t.Fatalf("leader %+v read as %+v", l, p)
				}
				back, err := leaderPeer(LeaderStatus([]mesh.Peer{p}, nil)[0])
				if err != nil || !reflect.DeepEqual(back, p) {
					t.Fatalf("leader %+v, written by the link controller, reads back as %+v (%v)", p, back, err)
				}
				if e := p.Endpoint; !e.IsZero() && (e.Addr.Port() == 0 || (e.Host != "") == e.Addr.Addr().IsValid() || e.Addr.Addr().Is4In6()) {
					t.Fatalf("leader %q: endpoint %q read as %#v", l.Name, l.Endpoint, e)
				}
				continue
			}
			bad = true
			if !strings.Contains(errText, "status.leaders "+l.Name+": ") {
				t.Fatalf("leader %+v neither read nor named in the error %q", l, errText)
			}
		}
		if read != len(r.Leaders) {
			t.Fatalf("%d leaders read from %d, %d of them readable", len(r.Leaders), len(cl.Status.Leaders), read)
		}
		if bad != (r.Err != nil) {
			t.Fatalf("error %v for a ClusterLink whose problems are %v", r.Err, bad)
		}

		// This cluster's trust policy.
		var guard mesh.RemoteGuard
		for _, s := range fuzzList(local, ",") {
			if p, err := netip.ParsePrefix(s); err == nil {
				guard.Local = append(guard.Local, p.Masked())
			}
		}
		peers, problems := r.Peers(guard)
		for _, x := range problems {
			var rr mesh.RangeRefusal
			if !errors.As(x, &rr) || rr.Cluster != name {
				t.Fatalf("problem %#v is not a refusal naming cluster %q", x, name)
			}
		}
		for _, p := range peers {
			if !strings.HasPrefix(p.Name, "cluster-"+name+"-") || len(p.AllowedIPs) == 0 {
				t.Fatalf("peer %+v: bad name or nothing to route", p)
			}
			for _, a := range p.AllowedIPs {
				for _, l := range guard.Local {
					if a.Overlaps(l) {
						t.Fatalf("peer %s: allowed IP %v overlaps local range %v", p.Name, a, l)
					}
				}
				if r.Link.Allowed != nil && !slices.ContainsFunc(r.Link.Allowed, func(q netip.Prefix) bool { return q.Bits() <= a.Bits() && q.Contains(a.Addr()) }) {
					t.Fatalf("peer %s: allowed IP %v is outside the agreed ranges %v", p.Name, a, r.Link.Allowed)
				}
				for _, l := range r.Leaders {
					if e := l.Endpoint.Addr.Addr(); e.IsValid() && a.Contains(e.Unmap()) {
						t.Fatalf("peer %s: allowed IP %v covers leader %s's endpoint %v", p.Name, a, l.Name, e)
					}
				}
			}
		}
	})
}
