package mirror

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// The faults below each once made imported or mirrored endpoints wrong.

// remoteOf is the controller's state of the linked cluster name.
func (e *env) remoteOf(name string) *remote {
	e.c.mu.Lock()
	defer e.c.mu.Unlock()
	return e.c.remotes[name]
}

// probeFailing reports whether the last probe of r failed.
func (r *remote) probeFailing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.probeOK
}

// setDown takes the fake source f down (or brings it back) and waits until
// the controller's probe of it, r, has seen so.
func setDown(t *testing.T, f *fakeRemote, r *remote, down bool) {
	t.Helper()
	f.down.Store(down)
	eventually(t, func() error {
		if r.probeFailing() != down {
			return fmt.Errorf("the probe of %s has not seen it down=%v yet", r.Name, down)
		}
		return nil
	})
}

// A source cluster's API outage shorter than the grace period freezes the
// ages of its heartbeat Leases (no renewal can be seen then): its nodes are
// not dead, its imported endpoints stay ready. Once it answers again the
// ages count on, and a Lease that is not renewed expires.
func TestImportReadyThroughSourceAPIOutage(t *testing.T) {
	e, c2, _, ready := startLeaseFollowing(t, time.Hour)
	eventually(t, ready(true))
	r := e.remoteOf("c2")
	setDown(t, c2, r, true)
	e.clock.Advance(11 * time.Second) // past the Lease's 10 s, far inside the grace period
	never(t, 300*time.Millisecond, func() error {
		if err := ready(true)(); err != nil {
			return fmt.Errorf("11 s into c2's API outage, grace period 1h: %w", err)
		}
		return nil
	})
	setDown(t, c2, r, false)
	e.clock.Advance(11 * time.Second) // c2 answers, its node renews nothing
	eventually(t, ready(false))
}

// The mirror restarts while a source cluster is unreachable: the source
// never syncs, and its slices are kept (never deleted on a partial view),
// but set not ready once it has been unreachable past the grace period.
func TestUnsyncedSourceNotReadyAfterGrace(t *testing.T) {
	e := startUnsyncedC9(t, Options{GracePeriod: time.Minute}, true, nil)
	state := func() (ready bool, err error) {
		sls := e.importSlices("shop", "web")
		if len(sls) != 1 {
			return false, fmt.Errorf("%d import slices, want c9's kept", len(sls))
		}
		return deref(sls[0].Endpoints[0].Conditions.Ready) || deref(sls[0].Endpoints[0].Conditions.Serving), nil
	}
	e.c.mcs.enqueue("shop", "web")
	never(t, 200*time.Millisecond, func() error {
		if r, err := state(); err != nil || !r {
			return fmt.Errorf("c9's endpoint not ready inside the grace period (%v)", err)
		}
		return nil
	})
	e.clock.Advance(2 * time.Minute) // c9 unreachable past the grace period: expiring queues the imports
	eventually(t, func() error {
		if r, err := state(); err != nil || r {
			return fmt.Errorf("c9 unreachable 2m (grace 1m), its imported endpoint is still ready or serving (%v)", err)
		}
		return nil
	})
}

// Two clusters' ports that cannot share one Service: the later one is left
// out of the union as a port conflict, so the derived Service stays valid.
func TestPortUnionStaysValid(t *testing.T) {
	svc := func(ip string, ports ...corev1.ServicePort) *corev1.Service {
		s := remoteService("shop", "web", ip)
		s.Spec.Ports = ports
		return s
	}
	http80 := corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}
	for _, tc := range []struct {
		name      string
		a, b      *corev1.Service
		wantPorts []string
		wantMsg   string
	}{
		{"same number, other name", svc("10.96.0.10", http80), svc("10.97.0.10", corev1.ServicePort{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP}),
			[]string{"http 80/TCP"}, `port 80/TCP is named "web", using "http"`},
		{"an unnamed port joining a named one", svc("10.96.0.10", http80), svc("10.97.0.10", corev1.ServicePort{Port: 8080, Protocol: corev1.ProtocolTCP}),
			[]string{"http 80/TCP"}, "several ports must all be named"},
		{"a named port joining an unnamed one", svc("10.96.0.10", corev1.ServicePort{Port: 80}), svc("10.97.0.10", corev1.ServicePort{Name: "metrics", Port: 9090}),
			[]string{" 80/TCP"}, "several ports must all be named"},
		{"the same number on another protocol", svc("10.96.0.10", http80), svc("10.97.0.10", corev1.ServicePort{Name: "dns", Port: 80, Protocol: corev1.ProtocolUDP}),
			[]string{"dns 80/UDP", "http 80/TCP"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mergeExports([]constituent{{cluster: "a", created: t0, svc: tc.a}, {cluster: "b", created: t0.Add(time.Second), svc: tc.b}})
			var got []string
			for _, p := range m.spec.Ports {
				got = append(got, fmt.Sprintf("%s %d/%s", p.Name, p.Port, p.Protocol))
			}
			if strings.Join(got, ",") != strings.Join(tc.wantPorts, ",") {
				t.Errorf("ports %q, want %q", got, tc.wantPorts)
			}
			if len(m.conflicts["a"]) != 0 {
				t.Errorf("the oldest export has conflicts %v", m.conflicts["a"])
			}
			msgs := strings.Join(m.messages["b"], "; ")
			switch {
			case tc.wantMsg == "" && len(m.conflicts["b"]) != 0:
				t.Errorf("conflicts %v (%s), want none", m.conflicts["b"], msgs)
			case tc.wantMsg != "" && (len(m.conflicts["b"]) != 1 || m.conflicts["b"][0] != string(mcsv1beta1.ServiceExportReasonPortConflict) || !strings.Contains(msgs, tc.wantMsg)):
				t.Errorf("conflicts %v (%s), want one %s saying %q", m.conflicts["b"], msgs, mcsv1beta1.ServiceExportReasonPortConflict, tc.wantMsg)
			}
		})
	}
}

// A ServiceImport another controller wrote is left alone, and the local
// ServiceExport says so instead of Ready=True.
func TestNotOwnedImportExportNotReady(t *testing.T) {
	si := &unstructured.Unstructured{}
	si.SetAPIVersion(ServiceImportGVR.GroupVersion().String())
	si.SetKind("ServiceImport")
	si.SetNamespace("shop")
	si.SetName("web")
	_ = unstructured.SetNestedField(si.Object, "ClusterSetIP", "spec", "type")
	e := startMCS(t, Options{NoMirrors: true},
		localObjects(remoteService("shop", "web", "10.96.0.10", 80), remoteSlice("shop", "web", "web-local", 8080, ep{ip: "10.244.0.1", ready: true})),
		[]runtime.Object{exportAt("shop", "web", t0), si})
	e.waitCondition("shop", "web", "Ready", metav1.ConditionFalse, string(mcsv1beta1.ServiceExportReasonFailed))
	got, err := e.serviceImport("shop", "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Labels) != 0 || len(got.Spec.IPs) != 0 || len(e.importSlices("shop", "web")) != 0 {
		t.Errorf("the other controller's ServiceImport was written to: labels %v, ips %v, %d slices", got.Labels, got.Spec.IPs, len(e.importSlices("shop", "web")))
	}
}

// A change of the source's ClientIP affinity timeout reaches the mirror.
func TestMirrorFollowsAffinityTimeout(t *testing.T) {
	src := remoteService("shop", "web", "10.96.0.10", 80)
	src.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	src.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(10800))}}
	c1 := newFakeRemote("c1", src, export("shop", "web"), remoteSlice("shop", "web", "web-abc", 8080, ep{ip: "10.244.1.5", ready: true}))
	e := start(t, Options{}, nil, c1)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
	c1.updateService(t, "shop", "web", func(s *corev1.Service) {
		s.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = ptr(int32(60))
	})
	eventually(t, func() error {
		s, err := e.service("shop", "web")
		if err != nil {
			return err
		}
		if c := s.Spec.SessionAffinityConfig; c == nil || c.ClientIP == nil || deref(c.ClientIP.TimeoutSeconds) != 60 {
			return fmt.Errorf("mirror affinity config %+v, want a 60 s timeout", c)
		}
		return nil
	})
}

// The same Service exported by two clusters (one mirror Service, the second
// cluster's endpoints added to it): the second cluster unreachable past the
// grace period, its endpoints are set not ready; answering again, ready.
func TestMergedMirrorEndpointsNotReadyPastGrace(t *testing.T) {
	c1 := shopRemote("c1")
	c2 := newFakeRemote("c2", remoteService("shop", "web", "10.112.0.10", 80), export("shop", "web"),
		remoteSlice("shop", "web", "w", 80, ep{ip: "10.245.0.1", ready: true}))
	e := start(t, Options{GracePeriod: time.Minute}, nil, c1)
	e.checkMirror("shop", "web", "c1", "shop/web", "10.96.0.10", true, 80)
	if err := e.c.AddRemote(c2.remote()); err != nil {
		t.Fatal(err)
	}
	e.waitSynced("c2")
	readyOf := func(ip string) error {
		for _, sl := range e.slices("shop", "web") {
			for _, ep := range sl.Endpoints {
				if ep.Addresses[0] == ip {
					if deref(ep.Conditions.Ready) {
						return nil
					}
					return fmt.Errorf("%s not ready", ip)
				}
			}
		}
		return fmt.Errorf("%s not in the mirror's slices", ip)
	}
	eventually(t, func() error { return readyOf("10.112.0.10") })
	r := e.remoteOf("c2")
	setDown(t, c2, r, true)
	e.clock.Advance(2 * time.Minute)
	eventually(t, func() error {
		if err := readyOf("10.112.0.10"); err == nil || !strings.HasSuffix(err.Error(), "not ready") {
			return fmt.Errorf("c2 unreachable 2m (grace 1m): its merged endpoint: %v, want not ready", err)
		}
		return nil
	})
	if err := readyOf("10.96.0.10"); err != nil {
		t.Errorf("c1's endpoint: %v", err)
	}
	c2.down.Store(false)
	eventually(t, func() error { return readyOf("10.112.0.10") })
}

// A dual-stack cluster exporting after a single-stack one: the derived
// Service turns PreferDualStack (the API server adds the second family
// where the cluster has one), once.
func TestDerivedServiceTurnsDualStack(t *testing.T) {
	e := startMCS(t, Options{NoMirrors: true},
		localObjects(remoteService("shop", "web", "10.96.0.10", 80), remoteSlice("shop", "web", "web-local", 8080, ep{ip: "10.244.0.1", ready: true})),
		[]runtime.Object{exportAt("shop", "web", t0)})
	nn := types.NamespacedName{Namespace: "shop", Name: "web"}
	eventually(t, func() error {
		_, err := e.service("shop", derivedServiceName(nn))
		return err
	})
	svc := remoteService("shop", "web", "10.112.0.10", 80)
	svc.Spec.ClusterIPs = []string{"10.112.0.10", "fd00:112::10"}
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	c2 := newFakeRemote("c2", svc, exportAt("shop", "web", t0.Add(time.Minute)),
		remoteSlice("shop", "web", "web-c2", 8080, ep{ip: "10.245.0.1", ready: true}))
	if err := e.c.AddRemote(c2.remote()); err != nil {
		t.Fatal(err)
	}
	e.waitSynced("c2")
	eventually(t, func() error {
		d, err := e.service("shop", derivedServiceName(nn))
		if err != nil {
			return err
		}
		if p := d.Spec.IPFamilyPolicy; p == nil || *p != corev1.IPFamilyPolicyPreferDualStack {
			return fmt.Errorf("derived Service ipFamilyPolicy %v, want PreferDualStack", p)
		}
		return nil
	})
	d, _ := e.service("shop", derivedServiceName(nn))
	if len(d.Spec.IPFamilies) != 1 || d.Spec.IPFamilies[0] != corev1.IPv4Protocol {
		t.Errorf("derived Service families %v: the primary family must stay", d.Spec.IPFamilies)
	}
}

// A dual-stack import creates its derived Service without naming the
// families (PreferDualStack), so a single-stack cluster accepts it.
func TestDesiredDerivedServiceDualStack(t *testing.T) {
	nn := types.NamespacedName{Namespace: "shop", Name: "web"}
	d := desiredDerivedService(nn, &mcsv1beta1.ServiceImportSpec{IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}})
	if d.Spec.IPFamilies != nil || d.Spec.IPFamilyPolicy == nil || *d.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyPreferDualStack {
		t.Errorf("families %v policy %v, want none named, PreferDualStack", d.Spec.IPFamilies, d.Spec.IPFamilyPolicy)
	}
	s := desiredDerivedService(nn, &mcsv1beta1.ServiceImportSpec{IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}})
	if len(s.Spec.IPFamilies) != 1 || s.Spec.IPFamilies[0] != corev1.IPv6Protocol || *s.Spec.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack {
		t.Errorf("families %v policy %v, want [IPv6] SingleStack", s.Spec.IPFamilies, *s.Spec.IPFamilyPolicy)
	}
}

// A source outage longer than the grace period, during which the node
// behind the endpoint died: the outage counts against its Lease past the
// grace period, so when the source answers again the endpoint stays not
// ready until the Lease is seen renewed.
func TestImportNotReadyAfterLongSourceOutage(t *testing.T) {
	e, c2, lease, ready := startLeaseFollowing(t, time.Minute)
	eventually(t, ready(true))
	r := e.remoteOf("c2")
	setDown(t, c2, r, true)
	e.clock.Advance(5 * time.Minute) // past the grace period; the node renews nothing
	eventually(t, func() error {
		if !r.isExpired() {
			return errors.New("c2 not past the grace period yet")
		}
		return nil
	})
	eventually(t, ready(false))
	c2.down.Store(false)
	eventually(t, func() error {
		if r.probeFailing() || r.isExpired() {
			return errors.New("c2 not answering again yet")
		}
		return nil
	})
	never(t, 300*time.Millisecond, ready(false))
	// The node renews its Lease: ready again.
	lease.ResourceVersion = "2"
	if _, err := c2.kube.CoordinationV1().Leases("meshd-system").Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ready(true))
}
