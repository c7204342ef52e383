package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"meshd.io/meshd/pkg/k8s/apis/meshd/v1alpha1"
	"meshd.io/meshd/pkg/mesh"
)

// managedByLabel marks the Peers meshctl prints (for kubectl apply --prune).
const managedByLabel = "app.kubernetes.io/managed-by"

// maxPeerAllowedIPs is the Peer CRD's limit on spec.allowedIPs.
const maxPeerAllowedIPs = 1024

// wgConfig is the structured (-o yaml|json) form of a WireGuard
// configuration. It never holds a private or preshared key.
type wgConfig struct {
	// Node or Peer is whose configuration this is.
	Node       string   `json:"node,omitempty"`
	Peer       string   `json:"peer,omitempty"`
	Location   string   `json:"location,omitempty"`
	Leader     *bool    `json:"leader,omitempty"`
	PublicKey  string   `json:"publicKey,omitempty"`
	Addresses  []string `json:"addresses"`
	ListenPort int      `json:"listenPort,omitempty"`
	Peers      []wgPeer `json:"peers"`
}

type wgPeer struct {
	// Name is "location NAME" or "peer NAME".
	Name      string `json:"name"`
	PublicKey string `json:"publicKey"`
	// PresharedKeySecretRef says where the preshared key is; meshctl never
	// reads or prints it.
	PresharedKeySecretRef *v1alpha1.SecretKeyRef `json:"presharedKeySecretRef,omitempty"`
	Endpoint              string                 `json:"endpoint,omitempty"`
	// PersistentKeepalive is in seconds.
	PersistentKeepalive int      `json:"persistentKeepalive,omitempty"`
	AllowedIPs          []string `json:"allowedIPs"`
}

// showNode prints node name's own WireGuard configuration.
func showNode(stdout, stderr io.Writer, m *model, name, format string) error {
	if _, ok := m.Objs[name]; !ok {
		return unknown("node", name, m.nodeNames())
	}
	plan, err := mesh.Build(m.Input.Nodes, m.Input.Peers, mesh.Local{NodeName: name, Live: m.Live, Candidates: m.Candidates}, m.Opts)
	if err != nil {
		return fmt.Errorf("computing the plan of node %s: %w", name, err)
	}
	n, _ := m.node(name)
	if n.PublicKey == (wgtypes.Key{}) {
		fmt.Fprintf(stderr, "meshctl: node %s has not published a WireGuard public key (is meshd running there?); showing the configuration it would get\n", name)
	}
	if !plan.Leader {
		fmt.Fprintf(stderr, "meshctl: node %s is not the leader of location %q (the leader is %s): it has no WireGuard peers; its traffic to other locations and peers is routed through %s\n",
			name, plan.Location, plan.Leaders[plan.Location], plan.Leaders[plan.Location])
	}
	leader := plan.Leader
	cfg := wgConfig{
		Node:       name,
		Location:   plan.Location,
		Leader:     &leader,
		Addresses:  prefixStrings(plan.WireGuard.Addresses),
		ListenPort: plan.WireGuard.ListenPort,
		Peers:      []wgPeer{},
	}
	if n.PublicKey != (wgtypes.Key{}) {
		cfg.PublicKey = n.PublicKey.String()
	}
	for _, p := range plan.WireGuard.Peers {
		wp := m.wgPeer(p)
		// The node's device gets only resolved addresses (see the daemon).
		wp.Endpoint = ""
		if p.Endpoint.Addr.IsValid() {
			wp.Endpoint = p.Endpoint.Addr.String()
		}
		cfg.Peers = append(cfg.Peers, wp)
	}
	switch format {
	case "yaml", "json":
		return writeStructured(stdout, cfg, format)
	}
	var b strings.Builder
	role := "not the leader"
	if plan.Leader {
		role = "its leader"
	}
	comment(&b, "WireGuard configuration of node %s (location %q, %s), computed by meshctl", name, plan.Location, role)
	comment(&b, "from the Nodes and Peers of %s.", m.Server)
	comment(&b, "The private key never leaves the node and is not shown.")
	b.WriteString("[Interface]\n")
	if cfg.PublicKey != "" {
		comment(&b, "PublicKey = %s", cfg.PublicKey)
	}
	for _, a := range cfg.Addresses {
		comment(&b, "Address = %s", a)
	}
	fmt.Fprintf(&b, "ListenPort = %d\n", cfg.ListenPort)
	for _, p := range cfg.Peers {
		b.WriteString("\n")
		writeWGPeer(&b, p, "IFACE")
	}
	_, err = io.WriteString(stdout, b.String())
	return err
}

// wgPeer converts a planner peer; Endpoint prefers the DNS name.
func (m *model) wgPeer(p mesh.WireGuardPeer) wgPeer {
	wp := wgPeer{
		Name:                m.describeKey(p.PublicKey, p.Name),
		PublicKey:           p.PublicKey.String(),
		Endpoint:            endpointString(p.Endpoint),
		PersistentKeepalive: seconds(p.PersistentKeepalive),
		AllowedIPs:          prefixStrings(p.AllowedIPs),
	}
	if p.PresharedKey != nil {
		wp.PresharedKeySecretRef = m.pskRef(p.Name)
		if wp.PresharedKeySecretRef == nil {
			wp.PresharedKeySecretRef = &v1alpha1.SecretKeyRef{}
		}
	}
	return wp
}

// describeKey names the owner of a WireGuard key: "location L (leader N)"
// or "peer P".
func (m *model) describeKey(key wgtypes.Key, fallback string) string {
	for _, s := range m.Topo.Segments {
		if s.PublicKey == key {
			if s.Location == s.Leader {
				return "node " + s.Leader
			}
			return fmt.Sprintf("location %s (leader %s)", s.Location, s.Leader)
		}
	}
	for _, p := range m.Topo.Peers {
		if p.PublicKey == key {
			return "peer " + p.Name
		}
	}
	return fallback
}

// pskRef is where Peer name's preshared key is.
func (m *model) pskRef(peer string) *v1alpha1.SecretKeyRef {
	if o, ok := m.PeerObjs[peer]; ok && o.Spec.PresharedKeySecretRef != nil {
		r := *o.Spec.PresharedKeySecretRef
		return &r
	}
	return nil
}

func writeWGPeer(b *strings.Builder, p wgPeer, iface string) {
	b.WriteString("[Peer]\n")
	comment(b, "%s", p.Name)
	fmt.Fprintf(b, "PublicKey = %s\n", p.PublicKey)
	if r := p.PresharedKeySecretRef; r != nil {
		comment(b, "PresharedKey: not shown; it is key %q of Secret %s/%s", r.Key, r.Namespace, r.Name)
		comment(b, "  (wg set %s peer %s preshared-key FILE)", iface, p.PublicKey)
	}
	if len(p.AllowedIPs) > 0 {
		fmt.Fprintf(b, "AllowedIPs = %s\n", strings.Join(p.AllowedIPs, ", "))
	}
	if p.Endpoint != "" {
		fmt.Fprintf(b, "Endpoint = %s\n", p.Endpoint)
	}
	if p.PersistentKeepalive > 0 {
		fmt.Fprintf(b, "PersistentKeepalive = %d\n", p.PersistentKeepalive)
	}
}

// asPeerOptions configure showAsPeer.
type asPeerOptions struct {
	Format          string
	ExtraAllowedIPs []netip.Prefix
	NamePrefix      string
	Labels          map[string]string
}

// asPeer returns the Peer object that makes node name a peer of another
// cluster; ok is false (with the reason) when the node carries no WireGuard
// traffic. warnings are for stderr.
func asPeer(m *model, name string, o asPeerOptions) (p *v1alpha1.Peer, reason string, warnings []string, err error) {
	if _, ok := m.Objs[name]; !ok {
		return nil, "", nil, unknown("node", name, m.nodeNames())
	}
	s := m.segmentOf(name)
	if s < 0 {
		return nil, fmt.Sprintf("node %s has not published a WireGuard public key (is meshd running there?): it carries no WireGuard traffic; nothing to print", name), nil, nil
	}
	mp, ok := m.Topo.SegmentAsPeer(name)
	if !ok {
		seg := m.Topo.Segments[s]
		return nil, fmt.Sprintf("node %s is not the leader of location %q (the leader is %s): it carries no WireGuard traffic; nothing to print", name, seg.Location, seg.Leader), nil, nil
	}
	peerName := o.NamePrefix + name
	if msgs := validation.IsDNS1123Subdomain(peerName); len(msgs) > 0 {
		return nil, "", nil, usageError{fmt.Errorf("Peer name %q (--peer-name-prefix + node name) is invalid: %s", peerName, strings.Join(msgs, "; "))} //nolint:staticcheck // ST1005: Peer is the API kind.
	}
	ips := slices.Clone(mp.AllowedIPs)
	for _, e := range o.ExtraAllowedIPs {
		if !slices.Contains(ips, e) {
			ips = append(ips, e)
		}
	}
	p = &v1alpha1.Peer{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "Peer"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   peerName,
			Labels: map[string]string{managedByLabel: "meshctl"},
		},
		Spec: v1alpha1.PeerSpec{
			PublicKey:  mp.PublicKey.String(),
			AllowedIPs: prefixStrings(ips),
		},
	}
	for k, v := range o.Labels {
		p.Labels[k] = v
	}
	switch {
	case mp.Endpoint.Host != "":
		p.Spec.Endpoint = &v1alpha1.PeerEndpoint{Host: mp.Endpoint.Host, Port: int32(mp.Endpoint.Addr.Port())}
	case mp.Endpoint.Addr.IsValid():
		a := mp.Endpoint.Addr.Addr()
		p.Spec.Endpoint = &v1alpha1.PeerEndpoint{Host: a.String(), Port: int32(mp.Endpoint.Addr.Port())}
		if a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() {
			warnings = append(warnings, fmt.Sprintf("node %s's endpoint %s is a private address; if the other cluster cannot reach it, set the meshd.io/force-endpoint annotation on the node", name, mp.Endpoint.Addr))
		}
	default:
		warnings = append(warnings, fmt.Sprintf("node %s has no endpoint: the other cluster cannot connect to it (it must connect first, with a keepalive)", name))
	}
	if mp.PersistentKeepalive > 0 {
		ka := int32(seconds(mp.PersistentKeepalive))
		p.Spec.PersistentKeepalive = &ka
	}
	if len(ips) > maxPeerAllowedIPs {
		warnings = append(warnings, fmt.Sprintf("the Peer has %d allowed IPs but the Peer CRD accepts at most %d: the API server will reject it", len(ips), maxPeerAllowedIPs))
	}
	return p, "", warnings, nil
}

// showAsPeer prints node name as a Peer of another cluster, or nothing
// (reason on stderr) when it carries no WireGuard traffic.
func showAsPeer(stdout, stderr io.Writer, m *model, name string, o asPeerOptions) error {
	p, reason, warnings, err := asPeer(m, name, o)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "meshctl: warning: %s\n", w)
	}
	if p == nil {
		fmt.Fprintf(stderr, "meshctl: %s\n", reason)
		return nil
	}
	switch o.Format {
	case "yaml", "json":
		return writeStructured(stdout, peerManifest(p), o.Format)
	}
	var b strings.Builder
	wp := wgPeer{
		Name:       fmt.Sprintf("node %s of %s", name, m.Server),
		PublicKey:  p.Spec.PublicKey,
		AllowedIPs: p.Spec.AllowedIPs,
	}
	if e := p.Spec.Endpoint; e != nil {
		wp.Endpoint = hostPort(e.Host, uint16(e.Port))
	}
	if ka := p.Spec.PersistentKeepalive; ka != nil {
		wp.PersistentKeepalive = int(*ka)
	}
	writeWGPeer(&b, wp, "IFACE")
	_, err = io.WriteString(stdout, b.String())
	return err
}

// peerManifest is the Peer as a generic object without the empty fields
// the typed object would print (creationTimestamp: null).
func peerManifest(p *v1alpha1.Peer) map[string]any {
	meta := map[string]any{"name": p.Name}
	if len(p.Labels) > 0 {
		meta["labels"] = p.Labels
	}
	return map[string]any{
		"apiVersion": p.APIVersion,
		"kind":       p.Kind,
		"metadata":   meta,
		"spec":       p.Spec,
	}
}

// showPeer prints the configuration outside Peer name applies.
func showPeer(stdout, stderr io.Writer, m *model, name, format string) error {
	obj, ok := m.PeerObjs[name]
	if !ok {
		return unknown("peer", name, m.peerNames())
	}
	oc, err := m.Topo.PeerConfig(name)
	if err != nil {
		why := "see meshctl status"
		if ps := m.Input.Problems["peer/"+name]; len(ps) > 0 {
			why = joinErrors(ps)
		} else {
			for _, w := range m.Topo.Warnings {
				if strings.Contains(w, "peer "+name+" ") {
					why = w
				}
			}
		}
		return fmt.Errorf("Peer %s is not usable, meshd ignores it: %s", name, why) //nolint:staticcheck // ST1005: Peer is the API kind.
	}
	if len(oc.Peers) == 0 {
		fmt.Fprintln(stderr, "meshctl: no node of the cluster has published a WireGuard public key yet: the configuration has no peers")
	}
	if len(oc.Addresses) == 0 {
		fmt.Fprintf(stderr, "meshctl: warning: every allowed IP of Peer %s overlaps the cluster or another Peer (see meshctl status)\n", name)
	}
	cfg := wgConfig{
		Peer:      name,
		PublicKey: obj.Spec.PublicKey,
		Addresses: prefixStrings(oc.Addresses),
		Peers:     []wgPeer{},
	}
	if e := obj.Spec.Endpoint; e != nil {
		cfg.ListenPort = int(e.Port)
	}
	for _, p := range oc.Peers {
		wp := m.wgPeer(p)
		if p.PresharedKey != nil {
			wp.PresharedKeySecretRef = obj.Spec.PresharedKeySecretRef
		}
		cfg.Peers = append(cfg.Peers, wp)
	}
	switch format {
	case "yaml", "json":
		return writeStructured(stdout, cfg, format)
	}
	var b strings.Builder
	comment(&b, "WireGuard configuration of Peer %s to join the meshd mesh of %s, computed by meshctl.", name, m.Server)
	comment(&b, "Apply it with `wg setconf IFACE FILE`, then add your private key with")
	comment(&b, "`wg set IFACE private-key KEYFILE` and your address(es) with")
	comment(&b, "`ip address add ADDRESS dev IFACE` (for wg-quick, uncomment PrivateKey and Address).")
	b.WriteString("[Interface]\n")
	comment(&b, "PrivateKey = <yours; never stored in the cluster>")
	for _, a := range cfg.Addresses {
		comment(&b, "Address = %s", a)
	}
	if cfg.ListenPort > 0 {
		fmt.Fprintf(&b, "ListenPort = %d\n", cfg.ListenPort)
	}
	for _, p := range cfg.Peers {
		b.WriteString("\n")
		writeWGPeer(&b, p, "IFACE")
	}
	_, err = io.WriteString(stdout, b.String())
	return err
}

// comment writes one comment line of a WireGuard configuration: "# " and
// the formatted text, with every control character (line breaks above all)
// escaped. The text carries names, locations, Secret references and the
// API server's address from the cluster and the kubeconfig; a line break in
// any of them would end the comment, and what followed would be read by
// wg setconf or wg-quick (PostUp = ...) as configuration.
func comment(b *strings.Builder, format string, args ...any) {
	b.WriteString("# ")
	b.WriteString(commentSafe(fmt.Sprintf(format, args...)))
	b.WriteString("\n")
}

// commentSafe escapes, Go-style (\n, \x00, \u2028), the control
// characters, the Unicode line and paragraph separators and invalid UTF-8
// in s, so that s stays on one line.
func commentSafe(s string) string {
	safe := func(r rune) bool {
		return r != utf8.RuneError && !unicode.IsControl(r) && r != '\u2028' && r != '\u2029'
	}
	if !strings.ContainsFunc(s, func(r rune) bool { return !safe(r) }) {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			// Invalid UTF-8 (or a literal U+FFFD): escape the byte.
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				fmt.Fprintf(&b, "\\x%02x", s[i])
				continue
			}
			b.WriteRune(r)
		case safe(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		}
	}
	return b.String()
}

func writeStructured(w io.Writer, v any, format string) error {
	var (
		out []byte
		err error
	)
	if format == "json" {
		out, err = json.MarshalIndent(v, "", "  ")
		out = append(out, '\n')
	} else {
		out, err = yaml.Marshal(v)
	}
	if err != nil {
		return fmt.Errorf("encoding %s: %w", format, err)
	}
	_, err = w.Write(out)
	return err
}

// endpointString renders an endpoint as wg wants it: host:port (the DNS
// name when there is one), [v6]:port, or "" when unknown.
func endpointString(e mesh.Endpoint) string {
	switch {
	case e.Host != "":
		return hostPort(e.Host, e.Addr.Port())
	case e.Addr.IsValid():
		return e.Addr.String()
	}
	return ""
}

func hostPort(host string, port uint16) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + strconv.Itoa(int(port))
	}
	return host + ":" + strconv.Itoa(int(port))
}

// seconds is a duration in whole seconds (never nanoseconds).
func seconds(d time.Duration) int { return int(d / time.Second) }

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func parseCIDRs(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func joinErrors(errs []error) string {
	ss := make([]string, len(errs))
	for i, e := range errs {
		ss[i] = e.Error()
	}
	return strings.Join(ss, "; ")
}

func joinAddrs(as []netip.Addr) string {
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = a.String()
	}
	return strings.Join(ss, ",")
}

func joinPrefixes(ps []netip.Prefix, sep string) string {
	return strings.Join(prefixStrings(ps), sep)
}

// parseLabels parses KEY=VALUE labels.
func parseLabels(ss []string) (map[string]string, error) {
	out := map[string]string{}
	for _, s := range ss {
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want KEY=VALUE", s)
		}
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			return nil, fmt.Errorf("key %q: %s", k, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return nil, fmt.Errorf("value %q: %s", v, strings.Join(msgs, "; "))
		}
		if k == managedByLabel {
			return nil, fmt.Errorf("%s is always meshctl", managedByLabel)
		}
		out[k] = v
	}
	return out, nil
}
