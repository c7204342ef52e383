package wg

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// FakeClient is an in-memory Client applying wgtypes.Config the way the
// kernel and wireguard-go do: UpdateOnly does not create, Remove deletes,
// ReplaceAllowedIPs clears first, an allowed IP belongs to one peer only (a
// peer taking it takes it from the other), a peer with the device's own
// public key is ignored, ReplacePeers clears all peers, nil fields are left
// alone. It counts calls and records the configs it was given.
type FakeClient struct {
	mu      sync.Mutex
	devices map[string]*wgtypes.Device

	// Fail, when set, is called before each ConfigureDevice; an error it
	// returns fails the call without applying anything.
	Fail func(name string, cfg wgtypes.Config) error

	DeviceCalls    int
	ConfigureCalls int
	Configs        []wgtypes.Config // every accepted ConfigureDevice config, in order
	Keepalives     map[wgtypes.Key]int
}

// NewFakeClient returns a FakeClient with no devices.
func NewFakeClient() *FakeClient {
	return &FakeClient{devices: map[string]*wgtypes.Device{}, Keepalives: map[wgtypes.Key]int{}}
}

// AddDevice creates an empty device named name.
func (f *FakeClient) AddDevice(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devices[name] = &wgtypes.Device{Name: name, Type: wgtypes.Userspace}
}

// RemoveDevice deletes the device named name, as when its interface is
// deleted.
func (f *FakeClient) RemoveDevice(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.devices, name)
}

// Device returns a deep copy of the device's state.
func (f *FakeClient) Device(name string) (*wgtypes.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.DeviceCalls++
	d, ok := f.devices[name]
	if !ok {
		return nil, os.ErrNotExist
	}
	return copyDevice(d), nil
}

// ConfigureDevice applies cfg.
func (f *FakeClient) ConfigureDevice(name string, cfg wgtypes.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ConfigureCalls++
	d, ok := f.devices[name]
	if !ok {
		return os.ErrNotExist
	}
	if f.Fail != nil {
		if err := f.Fail(name, cfg); err != nil {
			return err
		}
	}
	f.Configs = append(f.Configs, copyConfig(cfg))
	if cfg.PrivateKey != nil {
		d.PrivateKey = *cfg.PrivateKey
		d.PublicKey = d.PrivateKey.PublicKey()
		d.Peers = slices.DeleteFunc(d.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == d.PublicKey })
	}
	if cfg.ListenPort != nil {
		d.ListenPort = *cfg.ListenPort
	}
	if cfg.FirewallMark != nil {
		d.FirewallMark = *cfg.FirewallMark
	}
	if cfg.ReplacePeers {
		d.Peers = nil
	}
	for _, pc := range cfg.Peers {
		if d.PublicKey != (wgtypes.Key{}) && pc.PublicKey == d.PublicKey {
			continue
		}
		i := slices.IndexFunc(d.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == pc.PublicKey })
		if pc.Remove {
			if i >= 0 {
				d.Peers = slices.Delete(d.Peers, i, i+1)
			}
			continue
		}
		if i < 0 {
			if pc.UpdateOnly {
				continue
			}
			d.Peers = append(d.Peers, wgtypes.Peer{PublicKey: pc.PublicKey, ProtocolVersion: 1})
			i = len(d.Peers) - 1
		}
		p := &d.Peers[i]
		if pc.PresharedKey != nil {
			p.PresharedKey = *pc.PresharedKey
		}
		if pc.Endpoint != nil {
			e := *pc.Endpoint
			e.IP = slices.Clone(e.IP)
			p.Endpoint = &e
		}
		if pc.PersistentKeepaliveInterval != nil {
			old := p.PersistentKeepaliveInterval
			p.PersistentKeepaliveInterval = pc.PersistentKeepaliveInterval.Truncate(time.Second)
			if old == 0 && p.PersistentKeepaliveInterval != 0 {
				f.Keepalives[p.PublicKey]++
			}
		}
		if pc.ReplaceAllowedIPs {
			p.AllowedIPs = nil
		}
		for _, n := range pc.AllowedIPs {
			pf, ok := ipNetToPrefix(n)
			if !ok {
				return fmt.Errorf("fake: invalid allowed IP %v", n)
			}
			pf = pf.Masked()
			// Take the prefix from whichever peer has it.
			for j := range d.Peers {
				d.Peers[j].AllowedIPs = slices.DeleteFunc(d.Peers[j].AllowedIPs, func(m net.IPNet) bool {
					q, _ := ipNetToPrefix(m)
					return q == pf
				})
			}
			p.AllowedIPs = append(p.AllowedIPs, prefixToIPNet(pf))
		}
	}
	return nil
}

// SetEndpoint simulates roaming: the device learns a new endpoint for a peer.
func (f *FakeClient) SetEndpoint(name string, peer wgtypes.Key, ep *net.UDPAddr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.devices[name].Peers {
		if f.devices[name].Peers[i].PublicKey == peer {
			f.devices[name].Peers[i].Endpoint = ep
		}
	}
}

// SetHandshake simulates a completed handshake with a peer.
func (f *FakeClient) SetHandshake(name string, peer wgtypes.Key, t time.Time) {
	f.updatePeer(name, peer, func(p *wgtypes.Peer) { p.LastHandshakeTime = t })
}

// SetReceived simulates bytes received from a peer.
func (f *FakeClient) SetReceived(name string, peer wgtypes.Key, n int64) {
	f.updatePeer(name, peer, func(p *wgtypes.Peer) { p.ReceiveBytes = n })
}

// SetTransmitted simulates bytes sent to a peer.
func (f *FakeClient) SetTransmitted(name string, peer wgtypes.Key, n int64) {
	f.updatePeer(name, peer, func(p *wgtypes.Peer) { p.TransmitBytes = n })
}

// updatePeer applies set to the peer of device name, if there is one.
func (f *FakeClient) updatePeer(name string, peer wgtypes.Key, set func(*wgtypes.Peer)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.devices[name].Peers {
		if f.devices[name].Peers[i].PublicKey == peer {
			set(&f.devices[name].Peers[i])
		}
	}
}

// Reset zeroes the counters and recorded configs.
func (f *FakeClient) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.DeviceCalls, f.ConfigureCalls, f.Configs = 0, 0, nil
	f.Keepalives = map[wgtypes.Key]int{}
}

func copyDevice(d *wgtypes.Device) *wgtypes.Device {
	c := *d
	c.Peers = make([]wgtypes.Peer, len(d.Peers))
	for i, p := range d.Peers {
		if p.Endpoint != nil {
			e := *p.Endpoint
			e.IP = slices.Clone(e.IP)
			p.Endpoint = &e
		}
		p.AllowedIPs = slices.Clone(p.AllowedIPs)
		c.Peers[i] = p
	}
	return &c
}

func copyConfig(c wgtypes.Config) wgtypes.Config {
	c.Peers = slices.Clone(c.Peers)
	for i := range c.Peers {
		c.Peers[i].AllowedIPs = slices.Clone(c.Peers[i].AllowedIPs)
	}
	return c
}

// FakeLinks is an in-memory LinkOps holding one link per name. As the
// kernel does, it refuses (os.ErrExist) an IPv6 address already on the link
// with any prefix length, and an IPv4 address with the same one.
type FakeLinks struct {
	mu    sync.Mutex
	links map[string]*LinkState
	Calls int // write calls
}

// NewFakeLinks returns FakeLinks with no links.
func NewFakeLinks() *FakeLinks { return &FakeLinks{links: map[string]*LinkState{}} }

// AddLink creates a down link.
func (f *FakeLinks) AddLink(name string, index, mtu int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.links[name] = &LinkState{Index: index, MTU: mtu}
}

// RemoveLink deletes the link named name.
func (f *FakeLinks) RemoveLink(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.links, name)
}

func (f *FakeLinks) get(name string) (*LinkState, error) {
	l, ok := f.links[name]
	if !ok {
		return nil, fmt.Errorf("fake link %s: %w", name, os.ErrNotExist)
	}
	return l, nil
}

// Link returns a copy of the link's state.
func (f *FakeLinks) Link(name string) (LinkState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.get(name)
	if err != nil {
		return LinkState{}, err
	}
	c := *l
	c.Addrs = slices.Clone(l.Addrs)
	return c, nil
}

func (f *FakeLinks) SetMTU(name string, mtu int) error {
	return f.do(name, func(l *LinkState) error { l.MTU = mtu; return nil })
}

func (f *FakeLinks) SetUp(name string) error {
	return f.do(name, func(l *LinkState) error { l.Up = true; return nil })
}

func (f *FakeLinks) AddAddr(name string, p netip.Prefix) error {
	return f.do(name, func(l *LinkState) error {
		if slices.ContainsFunc(l.Addrs, func(h netip.Prefix) bool {
			return h == p || (p.Addr().Is6() && h.Addr() == p.Addr())
		}) {
			return fmt.Errorf("fake: address %s: %w", p, os.ErrExist)
		}
		l.Addrs = append(l.Addrs, p)
		return nil
	})
}

func (f *FakeLinks) DelAddr(name string, p netip.Prefix) error {
	return f.do(name, func(l *LinkState) error {
		i := slices.Index(l.Addrs, p)
		if i < 0 {
			return fmt.Errorf("fake: address %s: %w", p, os.ErrNotExist)
		}
		l.Addrs = slices.Delete(l.Addrs, i, i+1)
		return nil
	})
}

func (f *FakeLinks) do(name string, fn func(*LinkState) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	l, err := f.get(name)
	if err != nil {
		return err
	}
	return fn(l)
}
