package mesh

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// Property tests of the planner's fast paths (bit-packed keys, radix sort,
// span index, prefix merging and aggregation, the mesh IP pool): each is
// compared with a simple, obviously correct reference on random inputs drawn
// from small universes, so that overlaps, duplicates and siblings are common.

const propRounds = 2000

func propRand(t *testing.T) *rand.Rand {
	t.Helper()
	return rand.New(rand.NewPCG(uint64(len(t.Name())), 0x6d657368))
}

// randPrefix is a masked prefix of 10.0.0.0/24 (bits 24..32) or fd00::/120
// (bits 120..128), or now and then a wider one (down to /0).
func randPrefix(r *rand.Rand, v6 bool) netip.Prefix {
	var a netip.Addr
	base := 24
	if v6 {
		a, base = netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(r.IntN(256))}), 120
	} else {
		a = netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(256))})
	}
	bits := base + r.IntN(9)
	if r.IntN(20) == 0 {
		bits = r.IntN(base + 1)
	}
	return netip.PrefixFrom(a, bits).Masked()
}

func randPrefixes(r *rand.Rand, mixed bool) []netip.Prefix {
	ps := make([]netip.Prefix, r.IntN(40))
	for i := range ps {
		ps[i] = randPrefix(r, mixed && r.IntN(2) == 0)
	}
	return ps
}

func TestPropV4Key(t *testing.T) {
	r := propRand(t)
	for range propRounds {
		x := r.Uint32()
		a := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)}), r.IntN(33)).Masked()
		b := randPrefix(r, false)
		if r.IntN(2) == 0 {
			b = netip.PrefixFrom(a.Addr(), r.IntN(33)).Masked()
		}
		for _, p := range []netip.Prefix{a, b} {
			if got := fromV4key(v4key(p)); got != p {
				t.Fatalf("fromV4key(v4key(%v)) = %v", p, got)
			}
			if got := spanOf(p, 3).prefix(); got != p {
				t.Fatalf("spanOf(%v).prefix() = %v", p, got)
			}
		}
		if got, want := sign(cmpU64(v4key(a), v4key(b))), sign(comparePrefix(a, b)); got != want {
			t.Fatalf("v4key order of %v, %v is %d, comparePrefix says %d", a, b, got, want)
		}
		if got, want := containsKey(v4key(a), v4key(b)), a.Bits() <= b.Bits() && a.Contains(b.Addr()); got != want {
			t.Fatalf("containsKey(%v, %v) = %v", a, b, got)
		}
		lastA := lastAddr(a)
		if got := keyLast(v4key(a)<<24 | 5); got != v4u32(lastA) {
			t.Fatalf("keyLast(%v) = %v, want %v", a, got, lastA)
		}
		if got := v4u32(a.Addr()) | hostMask4(a.Bits()); got != v4u32(lastA) {
			t.Fatalf("hostMask4(%d) wrong for %v", a.Bits(), a)
		}
	}
}

func sign(c int) int { return min(max(c, -1), 1) }

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestPropSortU64(t *testing.T) {
	r := propRand(t)
	for round := range 300 {
		n := []int{0, 1, 2, 255, 256, 257, 1000, 3000}[round%8] + r.IntN(3)
		ks := make([]uint64, n)
		shape := r.IntN(4)
		for i := range ks {
			switch shape {
			case 0:
				ks[i] = r.Uint64()
			case 1: // one varying byte: the others are skipped
				ks[i] = uint64(r.IntN(256)) << (8 * uint(round%8))
			case 2: // few distinct keys
				ks[i] = uint64(r.IntN(4)) << 60
			default: // plan-like keys: v4key<<24 | index
				ks[i] = v4key(randPrefix(r, false))<<24 | uint64(i)
			}
		}
		want := slices.Clone(ks)
		slices.Sort(want)
		sortU64(ks)
		if !slices.Equal(ks, want) {
			t.Fatalf("round %d (n=%d, shape %d): radix sort differs from slices.Sort", round, n, shape)
		}
	}
}

func TestPropSortPrefixes(t *testing.T) {
	r := propRand(t)
	var scratch []uint64
	for range propRounds {
		ps := randPrefixes(r, r.IntN(2) == 0)
		want := slices.Clone(ps)
		slices.SortStableFunc(want, comparePrefix)
		sortPrefixes(ps, &scratch)
		if !slices.Equal(ps, want) {
			t.Fatalf("sortPrefixes:\n%v\nwant\n%v", ps, want)
		}
	}
}

// refMerge keeps the prefixes no other prefix contains, once each, sorted.
func refMerge(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for i, p := range ps {
		covered := false
		for j, q := range ps {
			if q.Bits() < p.Bits() && q.Contains(p.Addr()) || q == p && j < i {
				covered = true
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

func TestPropMergePrefixes(t *testing.T) {
	r := propRand(t)
	for range propRounds {
		ps := randPrefixes(r, r.IntN(2) == 0)
		want := refMerge(ps)
		got := mergePrefixes(slices.Clone(ps))
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("mergePrefixes(%v) = %v, want %v", ps, got, want)
		}
	}
}

// refAggregate is the canonical cover of the addresses of ps (all within
// one /24 or /120): the largest aligned blocks, in order.
func refAggregate(ps []netip.Prefix, v6 bool) []netip.Prefix {
	var covered [256]bool
	base := netip.AddrFrom4([4]byte{10, 0, 0, 0})
	if v6 {
		base = netip.AddrFrom16([16]byte{0: 0xfd})
	}
	for _, p := range ps {
		for i := range 256 {
			a := addrAt(base, i)
			if p.Contains(a) {
				covered[i] = true
			}
		}
	}
	var out []netip.Prefix
	for i := 0; i < 256; {
		if !covered[i] {
			i++
			continue
		}
		size := 1
		for size*2 <= 256 && i%(size*2) == 0 && !slices.Contains(covered[i:i+size*2], false) {
			size *= 2
		}
		out = append(out, netip.PrefixFrom(addrAt(base, i), base.BitLen()-log2(size)))
		i += size
	}
	return out
}

func log2(n int) int {
	l := 0
	for n > 1 {
		n /= 2
		l++
	}
	return l
}

func addrAt(base netip.Addr, i int) netip.Addr {
	if base.Is4() {
		b := base.As4()
		b[3] = byte(i)
		return netip.AddrFrom4(b)
	}
	b := base.As16()
	b[15] = byte(i)
	return netip.AddrFrom16(b)
}

func TestPropAggregatePrefixes(t *testing.T) {
	r := propRand(t)
	for range propRounds {
		v6 := r.IntN(2) == 0
		ps := make([]netip.Prefix, r.IntN(40))
		for i := range ps {
			ps[i] = randPrefix(r, v6)
			if ps[i].Bits() < ps[i].Addr().BitLen()-8 { // stay inside the /24 or /120
				if v6 {
					ps[i] = netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd}), 120)
				} else {
					ps[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, 0}), 24)
				}
			}
		}
		want := refAggregate(ps, v6)
		got := aggregatePrefixes(slices.Clone(ps), nil)
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("aggregatePrefixes(%v) = %v, want %v", ps, got, want)
		}
		if v6 {
			continue
		}
		keys := make([]uint64, len(ps))
		for i, p := range ps {
			keys[i] = v4key(p)
		}
		var fromKeys []netip.Prefix
		for _, k := range aggregateKeys(keys) {
			fromKeys = append(fromKeys, fromV4key(k))
		}
		if !slices.Equal(fromKeys, want) && !(len(fromKeys) == 0 && len(want) == 0) {
			t.Fatalf("aggregateKeys(%v) = %v, want %v", ps, fromKeys, want)
		}
	}
}

func TestPropSpanIndex(t *testing.T) {
	r := propRand(t)
	for range propRounds {
		ps := randPrefixes(r, true)
		var x spanIndex
		for i, p := range ps {
			x.add(p, i)
		}
		x.build()
		for range 10 {
			q := randPrefix(r, r.IntN(2) == 0)
			var got []int
			x.each(q, func(i int) bool {
				got = append(got, int(x.s[i].owner))
				return true
			})
			var want []int
			for i, p := range ps {
				if p.Overlaps(q) {
					want = append(want, i)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("spanIndex.each(%v) over %v gave owners %v, want %v", q, ps, got, want)
			}
		}
		// isDropped finds every entry by (prefix, owner).
		dropped := make([]bool, len(x.s))
		for i := range dropped {
			dropped[i] = i%2 == 0
		}
		for i, s := range x.s {
			if isDropped(&x, dropped, s.prefix(), int(s.owner)) != dropped[i] {
				t.Fatalf("isDropped(%v, %d) is wrong", s.prefix(), s.owner)
			}
		}
	}
}

func TestPropOverlapV4(t *testing.T) {
	r := propRand(t)
	for range propRounds {
		var keys []uint64
		for s := range r.IntN(30) {
			keys = append(keys, v4key(randPrefix(r, false))<<24|uint64(s))
		}
		slices.Sort(keys)
		maxHi := make([]uint32, len(keys))
		var m uint32
		for i, k := range keys {
			m = max(m, keyLast(k))
			maxHi[i] = m
		}
		for range 10 {
			q := randPrefix(r, false)
			lo := v4u32(q.Addr())
			k, ok := overlapV4(keys, maxHi, lo, lo|hostMask4(q.Bits()))
			want := slices.ContainsFunc(keys, func(k uint64) bool { return fromV4key(k >> 24).Overlaps(q) })
			if ok != want || ok && !fromV4key(k>>24).Overlaps(q) {
				t.Fatalf("overlapV4(%v) = %v, %v; want found=%v", q, fromV4key(k>>24), ok, want)
			}
		}
	}
}

func TestPropEndpointsWithin(t *testing.T) {
	r := propRand(t)
	for range propRounds {
		var e endpointSet
		var all []netip.Addr
		for range r.IntN(10) {
			a := randPrefix(r, r.IntN(2) == 0).Addr()
			all = append(all, a)
			if a.Is4() {
				e.v4 = append(e.v4, v4key(hostPrefix(a)))
			} else {
				e.v6 = append(e.v6, a)
			}
		}
		slices.Sort(e.v4)
		e.v4 = slices.Compact(e.v4)
		slices.SortFunc(e.v6, netip.Addr.Compare)
		e.v6 = slices.Compact(e.v6)
		for range 10 {
			q := randPrefix(r, r.IntN(2) == 0)
			a, ok := e.within(q)
			want := slices.ContainsFunc(all, q.Contains)
			if ok != want || ok && (!q.Contains(a) || !slices.Contains(all, a)) {
				t.Fatalf("within(%v) over %v = %v, %v; want found=%v", q, all, a, ok, want)
			}
		}
	}
}

func TestPropPool(t *testing.T) {
	r := propRand(t)
	for range propRounds {
		var cidr netip.Prefix
		if r.IntN(2) == 0 {
			cidr = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}), 8+r.IntN(23)).Masked()
		} else {
			var b [16]byte
			b[0], b[1], b[7], b[15] = 0xfd, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))
			cidr = netip.PrefixFrom(netip.AddrFrom16(b), 48+r.IntN(79)).Masked()
		}
		p := newPool(cidr)
		last := lastAddr(cidr)
		for range 20 {
			off := 1 + r.Uint64N(p.size)
			a := p.addr(off)
			if !cidr.Contains(a) || a == cidr.Addr() || a == last {
				t.Fatalf("pool %v: addr(%d) = %v is not a host address", cidr, off, a)
			}
			if got, ok := p.offset(a); !ok || got != off {
				t.Fatalf("pool %v: offset(addr(%d)=%v) = %d, %v", cidr, off, a, got, ok)
			}
		}
		if _, ok := p.offset(last.Next()); ok {
			t.Fatalf("pool %v: offset(%v) is ok", cidr, last.Next())
		}
		if _, ok := p.offset(cidr.Addr()); ok {
			t.Fatalf("pool %v hands out its network address", cidr)
		}
		if hb := cidr.Addr().BitLen() - cidr.Bits(); hb < 64 {
			if _, ok := p.offset(last); ok {
				t.Fatalf("pool %v hands out its last address", cidr)
			}
		}
	}
}

func TestPropPermute(t *testing.T) {
	r := propRand(t)
	for range propRounds {
		n := r.IntN(50)
		s := make([]int, n)
		for i := range s {
			s[i] = 100 + i
		}
		idx := make([]int32, n)
		for i := range idx {
			idx[i] = int32(i)
		}
		r.Shuffle(n, func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
		want := make([]int, n)
		for i := range want {
			want[i] = s[idx[i]]
		}
		permute(s, slices.Clone(idx))
		if !slices.Equal(s, want) {
			t.Fatalf("permute by %v gave %v, want %v", idx, s, want)
		}
	}
}
