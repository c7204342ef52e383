package wg

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// delta is the result of comparing the device with a desired Config: the
// wgtypes.Config to write (empty when nothing differs) and the bookkeeping of
// written endpoints to do once it is applied.
type delta struct {
	cfg wgtypes.Config
	// written: endpoints the delta writes, recorded as last-written once it
	// is applied. known: desired endpoints equal to the current ones,
	// recorded without a write. forget: peers the delta removes.
	written map[wgtypes.Key]netip.AddrPort
	known   map[wgtypes.Key]netip.AddrPort
	forget  []wgtypes.Key
	nudged  []wgtypes.Key // peers whose first handshake the delta starts
}

// empty reports whether the delta writes nothing.
func (d *delta) empty() bool {
	return d.cfg.PrivateKey == nil && d.cfg.ListenPort == nil && d.cfg.FirewallMark == nil &&
		!d.cfg.ReplacePeers && len(d.cfg.Peers) == 0
}

// peerCount is the number of distinct peers in the delta.
func (d *delta) peerCount() int { return len(groupPeers(d.cfg.Peers)) }

// groupPeers splits consecutive entries for the same public key into groups
// (a created peer has two entries when its handshake is nudged).
func groupPeers(ps []wgtypes.PeerConfig) [][]wgtypes.PeerConfig {
	var out [][]wgtypes.PeerConfig
	for i := 0; i < len(ps); {
		j := i + 1
		for j < len(ps) && ps[j].PublicKey == ps[i].PublicKey {
			j++
		}
		out = append(out, ps[i:j])
		i = j
	}
	return out
}

// wantPeer is a desired peer in normalised form.
type wantPeer struct {
	key        wgtypes.Key
	psk        wgtypes.Key
	endpoint   netip.AddrPort // zero: leave alone
	keepalive  time.Duration  // whole seconds
	allowedIPs []netip.Prefix // masked, sorted, unique
}

// computeDelta compares the device's current state with the desired config.
// It never modifies its inputs. last holds the endpoints this Device last
// wrote per peer. The returned error lists desired entries that were invalid
// and skipped; the delta is still usable.
func computeDelta(cur *wgtypes.Device, want Config, last map[wgtypes.Key]netip.AddrPort) (*delta, error) {
	d := &delta{
		written: map[wgtypes.Key]netip.AddrPort{},
		known:   map[wgtypes.Key]netip.AddrPort{},
	}
	var errs []error
	ownPub, err := d.deviceFields(cur, want)
	if err != nil {
		errs = append(errs, err)
	}
	wants, err := normalizePeers(want.Peers, ownPub)
	if err != nil {
		errs = append(errs, err)
	}
	curPeers := make(map[wgtypes.Key]*wgtypes.Peer, len(cur.Peers))
	for i := range cur.Peers {
		curPeers[cur.Peers[i].PublicKey] = &cur.Peers[i]
	}

	// Additions and updates first (sorted), then removals (sorted): a peer
	// that takes over the allowed IPs of a removed one (a node whose key was
	// rotated) gets them before the old entry goes, so no packet in between
	// finds no peer; inserting an allowed IP moves it from its old owner.
	keys := make([]wgtypes.Key, 0, len(wants))
	for k := range wants {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	for _, k := range keys {
		w := wants[k]
		c, exists := curPeers[k]
		if !exists {
			d.cfg.Peers = append(d.cfg.Peers, d.createPeer(w)...)
			continue
		}
		if pc, ok := d.updatePeer(w, c, last); ok {
			d.cfg.Peers = append(d.cfg.Peers, pc)
		}
	}

	if d.cfg.PrivateKey != nil {
		d.nudgeKeptPeers(keys, wants, curPeers)
	}

	var removed []wgtypes.Key
	for k := range curPeers {
		if _, ok := wants[k]; !ok {
			removed = append(removed, k)
		}
	}
	slices.SortFunc(removed, compareKeys)
	for _, k := range removed {
		d.cfg.Peers = append(d.cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
		d.forget = append(d.forget, k)
	}
	return d, errors.Join(errs...)
}

// createPeer returns the entries that create a peer. With an endpoint, its
// first handshake is nudged: persistent keepalive goes from off to on (the
// kernel and wireguard-go then send a keepalive, which starts a handshake)
// and, if the desired value is off, back off in a second entry.
func (d *delta) createPeer(w *wantPeer) []wgtypes.PeerConfig {
	pc := wgtypes.PeerConfig{
		PublicKey:         w.key,
		ReplaceAllowedIPs: true,
		AllowedIPs:        toIPNets(w.allowedIPs),
	}
	if w.psk != (wgtypes.Key{}) {
		psk := w.psk
		pc.PresharedKey = &psk
	}
	// Always explicit, even 0: wireguard-go carries a pending "keepalive
	// turned on" from the previous peer entry to one that does not set it.
	ka := w.keepalive
	pc.PersistentKeepaliveInterval = &ka
	if !w.endpoint.IsValid() {
		return []wgtypes.PeerConfig{pc}
	}
	pc.Endpoint = net.UDPAddrFromAddrPort(w.endpoint)
	d.written[w.key] = w.endpoint
	d.nudged = append(d.nudged, w.key)
	if w.keepalive != 0 {
		return []wgtypes.PeerConfig{pc}
	}
	on, off := nudgeKeepalive, time.Duration(0)
	pc.PersistentKeepaliveInterval = &on
	return []wgtypes.PeerConfig{pc, {PublicKey: w.key, UpdateOnly: true, PersistentKeepaliveInterval: &off}}
}

// deviceFields sets the device-wide settings that differ (private key,
// listen port) and returns the public key the device will have.
func (d *delta) deviceFields(cur *wgtypes.Device, want Config) (wgtypes.Key, error) {
	ownPub := cur.PublicKey
	if want.PrivateKey != (wgtypes.Key{}) && want.PrivateKey != cur.PrivateKey {
		k := want.PrivateKey
		d.cfg.PrivateKey = &k
		ownPub = k.PublicKey()
	}
	if want.ListenPort != 0 && want.ListenPort != cur.ListenPort {
		if want.ListenPort < 0 || want.ListenPort > 65535 {
			return ownPub, fmt.Errorf("invalid listen port %d", want.ListenPort)
		}
		p := want.ListenPort
		d.cfg.ListenPort = &p
	}
	return ownPub, nil
}

// nudgeKeptPeers appends, for a new private key, the nudge of every kept
// peer (keys, sorted) with an endpoint (see nudgeKept): in the same write,
// before the new public key is published.
func (d *delta) nudgeKeptPeers(keys []wgtypes.Key, wants map[wgtypes.Key]*wantPeer, cur map[wgtypes.Key]*wgtypes.Peer) {
	for _, k := range keys {
		if c, ok := cur[k]; ok && (wants[k].endpoint.IsValid() || c.Endpoint != nil) {
			d.cfg.Peers = append(d.cfg.Peers, nudgeKept(k, wants[k].keepalive)...)
		}
	}
}

// nudgeKept returns the entries that make a kept peer send a keepalive at
// once (persistent keepalive turned on from off, then back to desired).
// With a new private key that keepalive starts a handshake as the new key
// right away, which the peer cannot answer yet: it learns the key only from
// the publish that follows. WireGuard then initiates no other handshake for
// REKEY_TIMEOUT (5 s), so the handshake as the new key is the peer's, made
// when it has switched; were it left to the next packet, that packet could
// start one just as the switched peer starts its own, and crossed
// initiations stall both sides until one is retried (and a retry drops the
// packets queued meanwhile).
func nudgeKept(k wgtypes.Key, desired time.Duration) []wgtypes.PeerConfig {
	first, last := time.Duration(0), desired
	if desired == 0 {
		first = nudgeKeepalive
	}
	return []wgtypes.PeerConfig{
		{PublicKey: k, UpdateOnly: true, PersistentKeepaliveInterval: &first},
		{PublicKey: k, UpdateOnly: true, PersistentKeepaliveInterval: &last},
	}
}

// updatePeer returns the entry updating an existing peer, if anything differs.
func (d *delta) updatePeer(w *wantPeer, c *wgtypes.Peer, last map[wgtypes.Key]netip.AddrPort) (wgtypes.PeerConfig, bool) {
	pc := wgtypes.PeerConfig{PublicKey: w.key, UpdateOnly: true}
	changed := false
	if w.psk != c.PresharedKey {
		psk := w.psk
		pc.PresharedKey = &psk
		changed = true
	}
	if w.endpoint.IsValid() {
		prev, ok := last[w.key]
		if !ok {
			prev = udpToAddrPort(c.Endpoint)
		}
		if prev != w.endpoint {
			pc.Endpoint = net.UDPAddrFromAddrPort(w.endpoint)
			d.written[w.key] = w.endpoint
			changed = true
		} else if !ok {
			d.known[w.key] = w.endpoint
		}
	}
	if w.keepalive != c.PersistentKeepaliveInterval.Truncate(time.Second) {
		ka := w.keepalive
		pc.PersistentKeepaliveInterval = &ka
		changed = true
	}
	if !slices.Equal(w.allowedIPs, normalizeIPNets(c.AllowedIPs)) {
		pc.ReplaceAllowedIPs = true
		pc.AllowedIPs = toIPNets(w.allowedIPs)
		changed = true
	}
	return pc, changed
}

// normalizePeers validates and normalises desired peers into copies. Invalid
// entries (zero key, duplicate key, our own key, invalid prefix, a prefix
// already given to another peer) are skipped and reported, so that the
// device can converge on the rest.
func normalizePeers(in []Peer, ownPub wgtypes.Key) (map[wgtypes.Key]*wantPeer, error) {
	var errs []error
	out := make(map[wgtypes.Key]*wantPeer, len(in))
	owner := map[netip.Prefix]wgtypes.Key{}
	for i := range in {
		p := &in[i]
		if p.PublicKey == (wgtypes.Key{}) {
			errs = append(errs, fmt.Errorf("peer %d has no public key; skipped", i))
			continue
		}
		if _, dup := out[p.PublicKey]; dup {
			errs = append(errs, fmt.Errorf("peer %s listed twice; later entry skipped", p.PublicKey))
			continue
		}
		if ownPub != (wgtypes.Key{}) && p.PublicKey == ownPub {
			errs = append(errs, fmt.Errorf("peer %s is this device's own public key; skipped", p.PublicKey))
			continue
		}
		w := &wantPeer{key: p.PublicKey, endpoint: udpToAddrPort(p.Endpoint)}
		if p.PresharedKey != nil {
			w.psk = *p.PresharedKey
		}
		if p.PersistentKeepalive > 0 {
			w.keepalive = p.PersistentKeepalive.Truncate(time.Second)
		}
		if w.endpoint.IsValid() && (w.endpoint.Addr().IsUnspecified() || w.endpoint.Port() == 0) {
			// A zero IP means "no endpoint"; a zero port is unusable.
			if !w.endpoint.Addr().IsUnspecified() {
				errs = append(errs, fmt.Errorf("peer %s: endpoint %s has no port; ignored", p.PublicKey, w.endpoint))
			}
			w.endpoint = netip.AddrPort{}
		}
		prefixes, err := normalizePrefixes(p.AllowedIPs)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", p.PublicKey, err))
		}
		w.allowedIPs = prefixes[:0:0]
		for _, pf := range prefixes {
			if o, taken := owner[pf]; taken {
				errs = append(errs, fmt.Errorf("peer %s: allowed IP %s already belongs to peer %s; skipped", p.PublicKey, pf, o))
				continue
			}
			owner[pf] = p.PublicKey
			w.allowedIPs = append(w.allowedIPs, pf)
		}
		out[p.PublicKey] = w
	}
	return out, errors.Join(errs...)
}

// normalizePrefixes returns a sorted, de-duplicated copy of in with every
// prefix masked and IPv4-mapped addresses unmapped.
func normalizePrefixes(in []netip.Prefix) ([]netip.Prefix, error) {
	var errs []error
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		n, ok := normalizePrefix(p)
		if !ok {
			errs = append(errs, fmt.Errorf("invalid allowed IP %s; skipped", p))
			continue
		}
		out = append(out, n.Masked())
	}
	slices.SortFunc(out, comparePrefixes)
	return slices.Compact(out), errors.Join(errs...)
}

// normalizePrefix unmaps an IPv4-mapped prefix, keeping the address bits.
func normalizePrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	a, bits := p.Addr(), p.Bits()
	if a.Is4In6() {
		if bits < 96 {
			return netip.Prefix{}, false
		}
		a, bits = a.Unmap(), bits-96
	}
	return netip.PrefixFrom(a.WithZone(""), bits), true
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

func compareKeys(a, b wgtypes.Key) int { return slices.Compare(a[:], b[:]) }

// normalizeIPNets converts the device's allowed IPs for comparison.
func normalizeIPNets(in []net.IPNet) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, n := range in {
		if p, ok := ipNetToPrefix(n); ok {
			out = append(out, p.Masked())
		}
	}
	slices.SortFunc(out, comparePrefixes)
	return slices.Compact(out)
}

func ipNetToPrefix(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits == 0 {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	if a.Is4() && bits == 128 {
		ones -= 96
	}
	p := netip.PrefixFrom(a, ones)
	return p, p.IsValid()
}

func toIPNets(ps []netip.Prefix) []net.IPNet {
	out := make([]net.IPNet, 0, len(ps))
	for _, p := range ps {
		out = append(out, prefixToIPNet(p))
	}
	return out
}

func prefixToIPNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// udpToAddrPort converts an endpoint, returning the zero AddrPort for nil or
// a missing IP. IPv4-mapped addresses are unmapped.
func udpToAddrPort(u *net.UDPAddr) netip.AddrPort {
	if u == nil {
		return netip.AddrPort{}
	}
	a, ok := netip.AddrFromSlice(u.IP)
	if !ok {
		return netip.AddrPort{}
	}
	a = a.Unmap()
	if u.Zone != "" && a.Is6() {
		a = a.WithZone(u.Zone)
	}
	return netip.AddrPortFrom(a, uint16(u.Port))
}

func sortPrefixes(ps []netip.Prefix) { slices.SortFunc(ps, comparePrefixes) }
