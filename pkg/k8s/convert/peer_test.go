package convert

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/mesh"
)

func TestPeerFromObject(t *testing.T) {
	k1, psk := testKey(t, 1), testKey(t, 9)
	ka := int32(25)
	peer := func(mod func(*v1alpha1.PeerSpec)) *v1alpha1.Peer {
		p := &v1alpha1.Peer{
			ObjectMeta: metav1.ObjectMeta{Name: "laptop"},
			Spec:       v1alpha1.PeerSpec{PublicKey: k1.String(), AllowedIPs: []string{"10.5.0.1/32"}},
		}
		if mod != nil {
			mod(&p.Spec)
		}
		return p
	}
	ref := &v1alpha1.SecretKeyRef{Namespace: "meshd-system", Name: "psk", Key: "laptop"}
	secrets := map[string][]byte{
		"meshd-system/psk/laptop": []byte(psk.String() + "\n"),
		"meshd-system/psk/raw":    psk[:],
		"meshd-system/psk/short":  []byte("abc"),
	}
	lookup := func(ns, name, key string) ([]byte, error) {
		if v, ok := secrets[ns+"/"+name+"/"+key]; ok {
			return v, nil
		}
		return nil, errors.New("not found")
	}
	tests := []struct {
		name    string
		peer    *v1alpha1.Peer
		want    mesh.Peer
		wantErr string // substring
	}{{
		name: "minimal",
		peer: peer(nil),
		want: mesh.Peer{Name: "laptop", PublicKey: k1, AllowedIPs: prefixes("10.5.0.1/32")},
	}, {
		name: "full with IP endpoint and preshared key",
		peer: peer(func(s *v1alpha1.PeerSpec) {
			s.AllowedIPs = []string{"10.5.0.0/24", "fd05::7/64"}
			s.Endpoint = &v1alpha1.PeerEndpoint{Host: "2001:db8::5", Port: 51821}
			s.PersistentKeepalive = &ka
			s.PresharedKeySecretRef = ref
		}),
		want: mesh.Peer{
			Name: "laptop", PublicKey: k1, AllowedIPs: prefixes("10.5.0.0/24", "fd05::/64"),
			Endpoint: ipEP("[2001:db8::5]:51821"), PersistentKeepalive: 25 * time.Second, PresharedKey: &psk,
		},
	}, {
		name: "DNS endpoint, raw preshared key",
		peer: peer(func(s *v1alpha1.PeerSpec) {
			s.Endpoint = &v1alpha1.PeerEndpoint{Host: "vpn.example.com", Port: 4500}
			s.PresharedKeySecretRef = &v1alpha1.SecretKeyRef{Namespace: "meshd-system", Name: "psk", Key: "raw"}
		}),
		want: mesh.Peer{Name: "laptop", PublicKey: k1, AllowedIPs: prefixes("10.5.0.1/32"), Endpoint: dnsEP("vpn.example.com", 4500), PresharedKey: &psk},
	}, {
		name: "IPv4 endpoint", peer: peer(func(s *v1alpha1.PeerSpec) { s.Endpoint = &v1alpha1.PeerEndpoint{Host: "203.0.113.5", Port: 1} }),
		want: mesh.Peer{Name: "laptop", PublicKey: k1, AllowedIPs: prefixes("10.5.0.1/32"), Endpoint: ipEP("203.0.113.5:1")},
	}, {
		name: "nil", peer: nil, wantErr: "nil Peer",
	}, {
		name: "bad key", peer: peer(func(s *v1alpha1.PeerSpec) { s.PublicKey = "abc" }), wantErr: "spec.publicKey",
	}, {
		name: "no allowed IPs", peer: peer(func(s *v1alpha1.PeerSpec) { s.AllowedIPs = nil }), wantErr: "spec.allowedIPs",
	}, {
		name: "bad CIDR", peer: peer(func(s *v1alpha1.PeerSpec) { s.AllowedIPs = []string{"10.0.0.0/8", "10.0.0.1"} }), wantErr: "spec.allowedIPs[1]",
	}, {
		name: "bad port", peer: peer(func(s *v1alpha1.PeerSpec) { s.Endpoint = &v1alpha1.PeerEndpoint{Host: "a.b", Port: 70000} }), wantErr: "spec.endpoint.port",
	}, {
		name: "bad host", peer: peer(func(s *v1alpha1.PeerSpec) { s.Endpoint = &v1alpha1.PeerEndpoint{Host: "a b", Port: 1} }), wantErr: "spec.endpoint.host",
	}, {
		name: "negative keepalive", peer: peer(func(s *v1alpha1.PeerSpec) { v := int32(-1); s.PersistentKeepalive = &v }), wantErr: "spec.persistentKeepalive",
	}, {
		name: "missing secret", peer: peer(func(s *v1alpha1.PeerSpec) {
			s.PresharedKeySecretRef = &v1alpha1.SecretKeyRef{Namespace: "ns", Name: "nope", Key: "k"}
		}), wantErr: `key "k" of Secret ns/nope: not found`,
	}, {
		name: "malformed secret", peer: peer(func(s *v1alpha1.PeerSpec) {
			s.PresharedKeySecretRef = &v1alpha1.SecretKeyRef{Namespace: "meshd-system", Name: "psk", Key: "short"}
		}), wantErr: "got 3 bytes",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PeerFromObject(tt.peer, lookup)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), psk.String()) {
					t.Fatalf("error leaks the preshared key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
	if _, err := PeerFromObject(peer(func(s *v1alpha1.PeerSpec) { s.PresharedKeySecretRef = ref }), nil); err == nil {
		t.Error("a preshared key reference without a lookup was accepted")
	}
}
