package mesh

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// pool is one mesh CIDR seen as host offsets 1..size (the network and the
// last address are never handed out).
type pool struct {
	cidr netip.Prefix
	size uint64
}

func newPool(cidr netip.Prefix) pool {
	hb := cidr.Addr().BitLen() - cidr.Bits()
	size := ^uint64(0) - 1 // 2^64-2: enough for any /64 or larger
	if hb < 64 {
		size = uint64(1)<<hb - 2
	}
	return pool{cidr: cidr, size: size}
}

// offset returns a's host offset, ok only for a host address of the pool
// (1..size: never the network or last address, and for pools larger than
// 2^64 only the part the allocator uses).
func (p pool) offset(a netip.Addr) (uint64, bool) {
	if !p.cidr.Contains(a) {
		return 0, false
	}
	var off uint64
	if a.Is4() {
		x, b := a.As4(), p.cidr.Addr().As4()
		off = uint64(binary.BigEndian.Uint32(x[:]) - binary.BigEndian.Uint32(b[:]))
	} else {
		x, b := a.As16(), p.cidr.Addr().As16()
		if binary.BigEndian.Uint64(x[:8]) != binary.BigEndian.Uint64(b[:8]) {
			return 0, false
		}
		off = binary.BigEndian.Uint64(x[8:]) - binary.BigEndian.Uint64(b[8:])
	}
	return off, off >= 1 && off <= p.size
}

// takenSet records used offsets: a bitmap for pools up to 2^18 addresses
// (32 KiB), a map beyond.
type takenSet struct {
	bits []uint64
	m    map[uint64]struct{}
	n    uint64
}

func newTakenSet(size uint64, hint int) takenSet {
	if size < 1<<18 {
		return takenSet{bits: make([]uint64, (size+2+63)/64)}
	}
	return takenSet{m: make(map[uint64]struct{}, hint)}
}

// add marks off as used; false if it already was.
func (t *takenSet) add(off uint64) bool {
	if t.bits != nil {
		w, b := off/64, uint64(1)<<(off%64)
		if t.bits[w]&b != 0 {
			return false
		}
		t.bits[w] |= b
	} else {
		if _, ok := t.m[off]; ok {
			return false
		}
		t.m[off] = struct{}{}
	}
	t.n++
	return true
}

// addr is the address at offset (1..size) in the pool.
func (p pool) addr(off uint64) netip.Addr {
	base := p.cidr.Addr()
	if base.Is4() {
		b := base.As4()
		binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+uint32(off))
		return netip.AddrFrom4(b)
	}
	b := base.As16()
	// The host part of the low 64 bits is zero and off < 2^hostbits, so
	// there is no carry into the high half.
	binary.BigEndian.PutUint64(b[8:], binary.BigEndian.Uint64(b[8:])+off)
	return netip.AddrFrom16(b)
}

// fnv64a hashes a name without allocating.
func fnv64a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// allocateMeshIPs assigns every member (sorted by name) at most one address
// per family with a mesh CIDR. A valid published address is kept (the first
// claimant in name order wins a conflict); the others get hash(name) modulo
// the pool size, probing linearly to the first free address.
func allocateMeshIPs(ms []member, mesh [2]netip.Prefix, warn func(string)) {
	for f, cidr := range mesh {
		if !cidr.IsValid() {
			continue
		}
		p := newPool(cidr)
		taken := newTakenSet(p.size, len(ms))
		var pending []int
		for i := range ms {
			m := &ms[i]
			claim := netip.Addr{}
			for _, a := range m.n.WireGuardIPs {
				if a = normAddr(a); a.IsValid() && family(a) == f {
					claim = a
					break
				}
			}
			if off, ok := p.offset(claim); ok {
				if taken.add(off) {
					m.mesh[f] = claim
					continue
				}
				warn(fmt.Sprintf("mesh IP %v of node %s is taken by an earlier node; reallocated", claim, m.n.Name))
			}
			pending = append(pending, i)
		}
		for _, i := range pending {
			m := &ms[i]
			if taken.n >= p.size {
				warn(fmt.Sprintf("mesh CIDR %v exhausted: node %s gets no address", cidr, m.n.Name))
				continue
			}
			off := fnv64a(m.n.Name)%p.size + 1
			for !taken.add(off) {
				off = off%p.size + 1
			}
			m.mesh[f] = p.addr(off)
		}
	}
}
