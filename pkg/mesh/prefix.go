package mesh

import (
	"encoding/binary"
	"net/netip"
	"slices"
)

// Family indexes: the planner keeps per-family data in [2]T arrays.
const (
	v4 = 0
	v6 = 1
)

// family returns v4 or v6 for a valid address.
func family(a netip.Addr) int {
	if a.Is4() {
		return v4
	}
	return v6
}

// normAddr unmaps 4in6 addresses and drops zones; invalid stays invalid.
func normAddr(a netip.Addr) netip.Addr {
	if !a.IsValid() {
		return a
	}
	return a.Unmap().WithZone("")
}

// normPrefix masks a prefix and unmaps a 4in6 prefix; ok is false for an
// invalid prefix.
func normPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	a := p.Addr()
	if a.Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, false
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	} else if a.Zone() != "" {
		p = netip.PrefixFrom(a.WithZone(""), p.Bits())
	}
	return p.Masked(), true
}

// hostPrefix is the /32 or /128 of an address.
func hostPrefix(a netip.Addr) netip.Prefix {
	return netip.PrefixFrom(a, a.BitLen())
}

// comparePrefix orders prefixes by family, then first address, then length
// (a container sorts before what it contains).
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// v4key packs an IPv4 prefix into an integer that sorts like comparePrefix:
// address in bits 8-39, length in bits 0-7.
func v4key(p netip.Prefix) uint64 {
	b := p.Addr().As4()
	return uint64(binary.BigEndian.Uint32(b[:]))<<8 | uint64(p.Bits())
}

// fromV4key reverses v4key (ignoring bits above 39).
func fromV4key(k uint64) netip.Prefix {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(k>>8))
	return netip.PrefixFrom(netip.AddrFrom4(b), int(k&0xff))
}

// sortPrefixes sorts ps by comparePrefix. An all-IPv4 slice goes through
// integer keys: much faster than moving netip values (which hold a pointer
// and so pay write barriers). scratch is reused between calls; may be nil.
func sortPrefixes(ps []netip.Prefix, scratch *[]uint64) {
	if len(ps) < 2 {
		return
	}
	var keys []uint64
	if scratch != nil {
		keys = (*scratch)[:0]
	}
	for _, p := range ps {
		if !p.Addr().Is4() {
			slices.SortFunc(ps, comparePrefix)
			return
		}
		keys = append(keys, v4key(p))
	}
	if !slices.IsSorted(keys) {
		sortU64(keys)
		for i, k := range keys {
			ps[i] = fromV4key(k)
		}
	}
	if scratch != nil {
		*scratch = keys
	}
}

// mergePrefixes sorts normalized prefixes in place and drops those contained
// in another one; the result (a prefix of ps) is sorted and non-overlapping.
func mergePrefixes(ps []netip.Prefix) []netip.Prefix { return mergePrefixesBuf(ps, nil) }

// mergePrefixesBuf is mergePrefixes with a reusable sort buffer.
func mergePrefixesBuf(ps []netip.Prefix, scratch *[]uint64) []netip.Prefix {
	if len(ps) < 2 {
		return ps
	}
	sortPrefixes(ps, scratch)
	out := ps[:1]
	for _, p := range ps[1:] {
		if last := out[len(out)-1]; last.Overlaps(p) {
			// Sorted by address then length: last contains p.
			continue
		}
		out = append(out, p)
	}
	return out
}

// aggregatePrefixes is mergePrefixes plus joining sibling prefixes into their
// parent (10.0.0.0/24 + 10.0.1.0/24 = 10.0.0.0/23), for compact rule sets.
func aggregatePrefixes(ps []netip.Prefix, scratch *[]uint64) []netip.Prefix {
	ps = mergePrefixesBuf(ps, scratch)
	out := ps[:0]
	for _, p := range ps {
		out = append(out, p)
		for len(out) >= 2 {
			a, b := out[len(out)-2], out[len(out)-1]
			if a.Bits() != b.Bits() || a.Bits() == 0 || a.Addr().BitLen() != b.Addr().BitLen() {
				break
			}
			parent := netip.PrefixFrom(a.Addr(), a.Bits()-1).Masked()
			if parent.Addr() != a.Addr() || !parent.Contains(b.Addr()) {
				break
			}
			out = out[:len(out)-2]
			// The parent may now swallow nothing before it (sorted,
			// non-overlapping input) but may pair with its own sibling.
			out = append(out, parent)
		}
	}
	return out
}

// u128 is an address as an integer (IPv4 in lo).
type u128 struct{ hi, lo uint64 }

func (a u128) cmp(b u128) int {
	if a.hi != b.hi {
		if a.hi < b.hi {
			return -1
		}
		return 1
	}
	if a.lo != b.lo {
		if a.lo < b.lo {
			return -1
		}
		return 1
	}
	return 0
}

// span is a prefix as an address range with an owner index. It holds no
// pointers, so sorting and searching spans is cheap.
type span struct {
	fam    uint8 // v4 or v6: ranges of different families never meet
	bits   uint8
	lo, hi u128
	owner  int32
}

func spanOf(p netip.Prefix, owner int) span {
	a := p.Addr()
	s := span{bits: uint8(p.Bits()), owner: int32(owner)}
	if a.Is4() {
		b := a.As4()
		v := uint64(binary.BigEndian.Uint32(b[:]))
		s.lo = u128{lo: v}
		s.hi = u128{lo: v | (uint64(1)<<(32-p.Bits()) - 1)}
		return s
	}
	s.fam = v6
	b := a.As16()
	s.lo = u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
	s.hi = s.lo
	switch hb := 128 - p.Bits(); {
	case hb >= 64:
		s.hi.lo = ^uint64(0)
		if hb > 64 {
			s.hi.hi |= uint64(1)<<(hb-64) - 1
		}
	case hb > 0:
		s.hi.lo |= uint64(1)<<hb - 1
	}
	return s
}

// prefix converts the span back.
func (s span) prefix() netip.Prefix {
	if s.fam == v4 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(s.lo.lo))
		return netip.PrefixFrom(netip.AddrFrom4(b), int(s.bits))
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], s.lo.hi)
	binary.BigEndian.PutUint64(b[8:], s.lo.lo)
	return netip.PrefixFrom(netip.AddrFrom16(b), int(s.bits))
}

// compareSpans orders spans like comparePrefix, then by owner.
func compareSpans(a, b span) int {
	if a.fam != b.fam {
		return int(a.fam) - int(b.fam)
	}
	if c := a.lo.cmp(b.lo); c != 0 {
		return c
	}
	if a.bits != b.bits {
		return int(a.bits) - int(b.bits)
	}
	return int(a.owner) - int(b.owner)
}

// spanIndex answers "which entries overlap this prefix" in logarithmic time
// for the usual nested-or-disjoint prefix sets.
type spanIndex struct {
	s     []span
	maxHi []u128 // maxHi[i] = max(s[j].hi) over the j <= i of the same family
}

func (x *spanIndex) add(p netip.Prefix, owner int) { x.s = append(x.s, spanOf(p, owner)) }

func (x *spanIndex) build() {
	slices.SortFunc(x.s, compareSpans)
	x.maxHi = slices.Grow(x.maxHi[:0], len(x.s))
	var m u128
	for i, s := range x.s {
		if i == 0 || s.fam != x.s[i-1].fam || s.hi.cmp(m) > 0 {
			m = s.hi
		}
		x.maxHi = append(x.maxHi, m)
	}
}

// each calls fn with the index of every entry overlapping p until fn returns
// false.
func (x *spanIndex) each(p netip.Prefix, fn func(i int) bool) {
	q := spanOf(p, 0)
	n := len(x.s)
	lb, _ := slices.BinarySearchFunc(x.s, q, func(s span, q span) int {
		if s.fam != q.fam {
			return int(s.fam) - int(q.fam)
		}
		return s.lo.cmp(q.lo)
	})
	for i := lb; i < n && x.s[i].fam == q.fam && x.s[i].lo.cmp(q.hi) <= 0; i++ {
		if !fn(i) {
			return
		}
	}
	for i := lb - 1; i >= 0 && x.s[i].fam == q.fam; i-- {
		if x.maxHi[i].cmp(q.lo) < 0 {
			return
		}
		if x.s[i].hi.cmp(q.lo) >= 0 {
			if !fn(i) {
				return
			}
		}
	}
}

// sortU64 sorts keys ascending. Large slices use an LSD radix sort (bytes
// whose value is the same in every key are skipped), several times faster
// than comparison sorting for the few thousand keys a plan sorts.
func sortU64(keys []uint64) {
	if len(keys) < 256 {
		slices.Sort(keys)
		return
	}
	var counts [8][256]int32
	for _, k := range keys {
		for d := range 8 {
			counts[d][byte(k>>(8*d))]++
		}
	}
	buf := make([]uint64, len(keys))
	src, dst := keys, buf
	for d := range 8 {
		c := &counts[d]
		if c[byte(src[0]>>(8*d))] == int32(len(src)) {
			continue // every key has the same byte here
		}
		var sum int32
		for i := range c {
			c[i], sum = sum, sum+c[i]
		}
		for _, k := range src {
			b := byte(k >> (8 * d))
			dst[c[b]] = k
			c[b]++
		}
		src, dst = dst, src
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
}
