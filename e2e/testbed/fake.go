//go:build e2e

package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// FakeEndpointPrefix holds the underlay addresses of fake nodes (Node
// objects with no namespace behind them, for scale tests). The router
// namespace discards traffic to it (a blackhole route, more specific than
// br-wan's 203.0.113.0/24), so WireGuard handshakes that nodes send to fake
// endpoints die inside the testbed: nothing answers, nothing leaves the
// machine. Hosts attached to br-wan itself (external hosts, NAT boxes) would
// ARP for these addresses instead and get no answer, which also drops.
var FakeEndpointPrefix = netip.MustParsePrefix("203.0.113.240/28")

// fakeEndpoint is fake node i's endpoint: address i mod 15 of
// FakeEndpointPrefix (its last address, 203.0.113.255, is the WAN's
// broadcast address: nothing answers there, not even a fake responder),
// port 51820 + i/15.
func fakeEndpoint(i int) netip.AddrPort {
	return netip.AddrPortFrom(addrAdd(FakeEndpointPrefix.Addr(), i%15), uint16(51820+i/15))
}

// FakeNode is a Node object without a namespace: it carries a published
// WireGuard key and endpoint as if meshd ran there, so real nodes configure
// it as a peer. Its endpoint and InternalIP lie in FakeEndpointPrefix.
type FakeNode struct {
	Name       string
	Region     string
	PrivateKey wgtypes.Key // for a responder (StartFakeResponder)
	PublicKey  wgtypes.Key
	Endpoint   netip.AddrPort
	InternalIP netip.Addr
	PodCIDR    netip.Prefix
	// Annotations are more annotations of its Node (e.g. the
	// meshd.io/discovered-endpoints a real node would publish).
	Annotations map[string]string
}

// FakeNodes returns count fake nodes named <prefix>-<i> for i in
// [first, first+count) with fresh random keys, pod CIDRs 10.200.<i>.0/24
// (so i < 256; not 10.100.x, which lies in the testbed's service CIDR
// 10.96.0.0/12), regions fake-<i mod 4>, and endpoints spread over
// FakeEndpointPrefix (fakeEndpoint).
func FakeNodes(prefix string, first, count int) ([]FakeNode, error) {
	if first < 0 || first+count > 256 {
		return nil, fmt.Errorf("fake nodes %d..%d: want indexes in [0, 256)", first, first+count-1)
	}
	out := make([]FakeNode, 0, count)
	for i := first; i < first+count; i++ {
		priv, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			return nil, err
		}
		ep := fakeEndpoint(i)
		out = append(out, FakeNode{
			Name:       fmt.Sprintf("%s-%d", prefix, i),
			Region:     fmt.Sprintf("fake-%d", i%4),
			PrivateKey: priv,
			PublicKey:  priv.PublicKey(),
			Endpoint:   ep,
			InternalIP: ep.Addr(),
			PodCIDR:    netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, byte(i), 0}), 24),
		})
	}
	return out, nil
}

// EnsureFakeBlackhole installs (idempotently) the router's blackhole route
// for FakeEndpointPrefix. It survives Reset; it is harmless to real nodes.
// While a fake responder runs (StartFakeResponder) the prefix is routed to
// it instead.
func (tb *Testbed) EnsureFakeBlackhole(ctx context.Context) error {
	tb.mu.Lock()
	via := tb.fakeResponder
	tb.mu.Unlock()
	route := []string{"blackhole", FakeEndpointPrefix.String()}
	if via.IsValid() {
		route = []string{FakeEndpointPrefix.String(), "via", via.String()}
	}
	_, err := run(ctx, append([]string{"ip", "-n", tb.RouterNS, "route", "replace"}, route...)...)
	return err
}

// StartFakeResponder makes the fakes answer as real meshd nodes would:
// an outside host on the WAN segment holds every address of
// FakeEndpointPrefix, the router sends the prefix there instead of
// blackholing it, and `e2etool wgfakes` answers WireGuard handshakes on
// each fake's endpoint (with its private key) and meshd's probes on
// probePort. Real nodes then establish sessions with the fakes as with real
// peers, instead of retrying their handshakes (and keeping their first
// packet queued) for 90 s. Pass every fake that may ever be created; stop
// restores the blackhole (Reset removes the host).
func (tb *Testbed) StartFakeResponder(ctx context.Context, fakes []FakeNode, probePort int) (stop func(), err error) {
	e, err := tb.AddExternal(ctx, "fakewg")
	if err != nil {
		return nil, err
	}
	var keys strings.Builder
	addrs := map[netip.Addr]bool{}
	for _, f := range fakes {
		fmt.Fprintf(&keys, "%s %s\n", f.PrivateKey, f.Endpoint)
		addrs[f.Endpoint.Addr()] = true
	}
	for a := range addrs {
		if _, err := e.Exec(ctx, "ip", "addr", "add", netip.PrefixFrom(a, 32).String(), "dev", "eth0"); err != nil {
			return nil, err
		}
	}
	file := filepath.Join(e.Dir, "wgfakes.txt")
	if err := os.WriteFile(file, []byte(keys.String()), 0o600); err != nil {
		return nil, err
	}
	p, err := e.Start("wgfakes", tb.ToolBinary, "wgfakes", "-probe-port", fmt.Sprint(probePort), file)
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(p.LogPath); strings.Contains(string(b), "answer handshakes and probes") {
			break
		}
		if p.Exited() {
			return nil, fmt.Errorf("the fake responder exited: %w\n%s", p.ExitErr(), tail(p.LogPath, 10))
		}
		if time.Now().After(deadline) {
			p.Stop(time.Second)
			return nil, fmt.Errorf("the fake responder did not start in 10 s\n%s", tail(p.LogPath, 10))
		}
	}
	tb.mu.Lock()
	tb.fakeResponder = e.IP
	tb.mu.Unlock()
	if err := tb.EnsureFakeBlackhole(ctx); err != nil {
		return nil, err
	}
	return func() {
		_ = p.Signal(syscall.SIGTERM)
		tb.mu.Lock()
		tb.fakeResponder = netip.Addr{}
		tb.mu.Unlock()
		_ = tb.EnsureFakeBlackhole(context.Background())
	}, nil
}

// fastKube is a clientset without client-side rate limiting (the shared one
// allows 100 QPS), so a burst really is a burst.
func (tb *Testbed) fastKube() (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(tb.RESTConfig)
	cfg.QPS = -1 // no client-side rate limiter
	cfg.Burst = 0
	return kubernetes.NewForConfig(cfg)
}

// CreateFakeNodes makes sure fake endpoints are blackholed, then creates
// the Node objects with `parallel` concurrent workers: each is one create
// (labels, annotations meshd.io/public-key and meshd.io/endpoint, pod
// CIDR, and the status: InternalIP, Ready), as a kubelet registers. It
// returns the first error.
func (tb *Testbed) CreateFakeNodes(ctx context.Context, nodes []FakeNode, parallel int) error {
	if err := tb.EnsureFakeBlackhole(ctx); err != nil {
		return err
	}
	kc, err := tb.fastKube()
	if err != nil {
		return err
	}
	if parallel < 1 {
		parallel = 1
	}
	work := make(chan FakeNode)
	errc := make(chan error, len(nodes))
	var wg sync.WaitGroup
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				errc <- tb.createFakeNode(ctx, kc, f)
			}
		}()
	}
	for _, f := range nodes {
		work <- f
	}
	close(work)
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			return err
		}
	}
	return nil
}

func (tb *Testbed) createFakeNode(ctx context.Context, kc kubernetes.Interface, f FakeNode) error {
	now := metav1.Now()
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: f.Name,
			Labels: map[string]string{
				LabelRegion:              f.Region,
				"kubernetes.io/hostname": f.Name,
				"kubernetes.io/os":       "linux",
				"e2e.meshd.io/fake":      "true",
			},
			Annotations: map[string]string{
				AnnotationPublicKey: f.PublicKey.String(),
				AnnotationEndpoint:  f.Endpoint.String(),
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: f.PodCIDR.String(), PodCIDRs: []string{f.PodCIDR.String()}},
		// A kubelet registers its Node with the status it has already
		// collected, in one create (the API server keeps a new Node's
		// status), so a fake does the same: one write, one watch event.
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: f.InternalIP.String()},
				{Type: corev1.NodeHostName, Address: f.Name},
			},
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "fake node of the meshd e2e testbed", LastHeartbeatTime: now, LastTransitionTime: now,
			}},
		},
	}
	maps.Copy(obj.Annotations, f.Annotations)
	created, err := kc.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating fake Node %s: %w", f.Name, err)
	}
	if !slices.Equal(created.Status.Addresses, obj.Status.Addresses) {
		return fmt.Errorf("fake Node %s was created without its status (addresses %v): this API server drops a new Node's status", f.Name, created.Status.Addresses)
	}
	return nil
}

// WithDiscovered gives every fake the meshd.io/discovered-endpoints a real
// node publishes after handshakes with k peers: the endpoints of the k
// fakes after it (wrapping around), as meshd would have learned them.
func WithDiscovered(fakes []FakeNode, k int) error {
	if k <= 0 {
		return nil
	}
	k = min(k, len(fakes)-1)
	for i := range fakes {
		eps := make(map[string]string, k)
		for j := 1; j <= k; j++ {
			f := fakes[(i+j)%len(fakes)]
			eps[f.PublicKey.String()] = f.Endpoint.String()
		}
		b, err := json.Marshal(eps)
		if err != nil {
			return err
		}
		if fakes[i].Annotations == nil {
			fakes[i].Annotations = map[string]string{}
		}
		fakes[i].Annotations[AnnotationDiscovered] = string(b)
	}
	return nil
}

// MaxWideFakeNodes is how many fake nodes FakeNodesWide can make.
const MaxWideFakeNodes = 1024

// FakeNodesWide is FakeNodes for up to MaxWideFakeNodes fake nodes (scale
// benchmarks): pod CIDRs 10.<200+i/256>.<i%256>.0/24 (10.200.0.0/14, clear
// of the testbed's pod, mesh and service ranges), endpoints as FakeNodes
// (fakeEndpoint), and regions
// region(i) (FakeNodes' fake-<i mod 4> when region is nil).
func FakeNodesWide(prefix string, first, count int, region func(i int) string) ([]FakeNode, error) {
	if first < 0 || first+count > MaxWideFakeNodes {
		return nil, fmt.Errorf("fake nodes %d..%d: want indexes in [0, %d)", first, first+count-1, MaxWideFakeNodes)
	}
	if region == nil {
		region = func(i int) string { return fmt.Sprintf("fake-%d", i%4) }
	}
	out := make([]FakeNode, 0, count)
	for i := first; i < first+count; i++ {
		priv, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			return nil, err
		}
		ep := fakeEndpoint(i)
		out = append(out, FakeNode{
			Name:       fmt.Sprintf("%s-%d", prefix, i),
			Region:     region(i),
			PrivateKey: priv,
			PublicKey:  priv.PublicKey(),
			Endpoint:   ep,
			InternalIP: ep.Addr(),
			PodCIDR:    netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + i/256), byte(i % 256), 0}), 24),
		})
	}
	return out, nil
}

// FakeHeartbeats keeps the heartbeat Leases of fake nodes renewed, as meshd
// does for a real node (Lease meshd-<node> in LeaseNamespace, one update
// per interval), so that liveness at scale is measured with live
// heartbeats. Renewals are spread evenly over the interval. As meshd does,
// the Leases of each region's leader candidates are labelled
// meshd.io/candidate: the first Candidates fakes of a region by name (no
// fake prefers to lead or has a public endpoint; the regions hold no real
// node).
type FakeHeartbeats struct {
	tb       *Testbed
	kc       kubernetes.Interface
	interval time.Duration
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// Candidates is meshd's --leader-candidates (0: 4, its default).
	Candidates int
	labelled   map[string]int

	renewals, failures atomic.Int64
}

// StartFakeHeartbeats starts renewing fake nodes' Leases every interval
// until Stop (or ctx ends). Add more nodes with Add.
func (tb *Testbed) StartFakeHeartbeats(ctx context.Context, interval time.Duration) (*FakeHeartbeats, error) {
	kc, err := tb.fastKube()
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithCancel(ctx)
	return &FakeHeartbeats{tb: tb, kc: kc, interval: interval, ctx: hctx, cancel: cancel}, nil
}

// Add creates the Leases of nodes (parallel creates) and renews them from
// now on. It returns the first creation error.
func (h *FakeHeartbeats) Add(nodes []FakeNode, parallel int) error {
	leases := make([]*coordinationv1.Lease, len(nodes))
	cands := h.candidates(nodes)
	errc := make(chan error, len(nodes))
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < max(parallel, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				l, err := h.kc.CoordinationV1().Leases(LeaseNamespace).Create(h.ctx, h.lease(nodes[i].Name, cands[nodes[i].Name], time.Now()), metav1.CreateOptions{})
				if err != nil {
					errc <- fmt.Errorf("creating the Lease of fake node %s: %w", nodes[i].Name, err)
					continue
				}
				leases[i] = l
			}
		}()
	}
	for i := range nodes {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	for i, l := range leases {
		// Spread the first renewals over one interval.
		delay := time.Duration(i) * h.interval / time.Duration(len(leases))
		h.wg.Add(1)
		go h.run(l, delay)
	}
	return nil
}

// candidates picks the leader candidates among nodes: per region, in name
// order, as many as the region still has candidate places for (after the
// fakes added before). meshd's candidates are the first live ones in
// leader order, so fakes added later in the same region must not come
// before earlier ones by name.
func (h *FakeHeartbeats) candidates(nodes []FakeNode) map[string]bool {
	k := h.Candidates
	if k <= 0 {
		k = 4
	}
	byRegion := map[string][]string{}
	for _, n := range nodes {
		if n.Region != "" {
			byRegion[n.Region] = append(byRegion[n.Region], n.Name)
		}
	}
	if h.labelled == nil {
		h.labelled = map[string]int{}
	}
	out := map[string]bool{}
	for region, names := range byRegion {
		slices.Sort(names)
		for _, n := range names {
			if h.labelled[region] >= k {
				break
			}
			out[n] = true
			h.labelled[region]++
		}
	}
	return out
}

func (h *FakeHeartbeats) lease(node string, candidate bool, now time.Time) *coordinationv1.Lease {
	holder := node
	dur := int32(4 * h.interval / time.Second)
	mt := metav1.NewMicroTime(now)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "meshd-" + node, Namespace: LeaseNamespace, Labels: map[string]string{
			"meshd.io/node": node, "app.kubernetes.io/managed-by": "meshd", "e2e.meshd.io/fake": "true",
		}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &mt, RenewTime: &mt},
	}
	if candidate {
		l.Labels[LabelLeaseCandidate] = "true"
	}
	return l
}

func (h *FakeHeartbeats) run(l *coordinationv1.Lease, delay time.Duration) {
	defer h.wg.Done()
	select {
	case <-h.ctx.Done():
		return
	case <-time.After(delay):
	}
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		mt := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &mt
		updated, err := h.kc.CoordinationV1().Leases(LeaseNamespace).Update(h.ctx, l, metav1.UpdateOptions{})
		switch {
		case err == nil:
			l = updated
			h.renewals.Add(1)
		case h.ctx.Err() != nil:
			return
		default:
			h.failures.Add(1)
			if cur, gerr := h.kc.CoordinationV1().Leases(LeaseNamespace).Get(h.ctx, l.Name, metav1.GetOptions{}); gerr == nil {
				l = cur // a conflict: renew the current one next time
			}
		}
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Counts returns the renewals made and failed so far.
func (h *FakeHeartbeats) Counts() (renewals, failures int64) {
	return h.renewals.Load(), h.failures.Load()
}

// Stop ends every renewal and waits for them.
func (h *FakeHeartbeats) Stop() {
	h.cancel()
	h.wg.Wait()
}
