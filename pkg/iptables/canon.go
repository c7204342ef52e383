package iptables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// canonRule predicts how iptables-save prints the rule toks (the arguments
// after "-A CHAIN"). It covers what meshd writes: addresses (/32, masked
// networks), the order of -s -d -i -o -p, long option names, implicit
// "-m tcp"/"-m udp", mark values and the MARK and CONNMARK targets. Anything
// else is returned unchanged; the Controller learns the real rendering after
// its first write.
func canonRule(fam Family, toks []string) []string {
	basic, rest, proto := canonBasic(fam, splitClauses(toks))
	out := make([]string, 0, len(toks)+4)
	for _, o := range []string{"-s", "-d", "-i", "-o", "-p", "-f"} {
		if c := basic[o]; c != nil {
			out = c.appendTo(out)
		}
	}
	return canonRest(out, rest, proto)
}

// canonBasic splits the clauses into the first of each basic option (-s -d
// -i -o -p -f, canonical, those iptables-save drops removed) and the rest;
// proto is the protocol the rule matches ("" for any).
func canonBasic(fam Family, clauses []clause) (basic map[string]*clause, rest []*clause, proto string) {
	basic = map[string]*clause{}
	for i := range clauses {
		c := &clauses[i]
		c.opt = longToShort(c.opt)
		switch c.opt {
		case "-s", "-d", "-i", "-o", "-p", "-f":
			if basic[c.opt] == nil {
				basic[c.opt] = c
				continue
			}
		}
		rest = append(rest, c)
	}
	if c := basic["-p"]; c != nil && len(c.args) == 1 {
		c.args[0] = canonProto(fam, c.args[0])
		if c.args[0] == "all" && !c.neg {
			delete(basic, "-p")
		} else if !c.neg {
			proto = c.args[0]
		}
	}
	for _, o := range []string{"-s", "-d"} {
		if c := basic[o]; c != nil && len(c.args) == 1 {
			addr, drop := canonAddr(fam, c.args[0])
			if drop && !c.neg {
				delete(basic, o)
			} else {
				c.args[0] = addr
			}
		}
	}
	return basic, rest, proto
}

// canonRest appends the matches, their options and the target to out,
// adding the implicit protocol match before the first option that needs it.
func canonRest(out []string, rest []*clause, proto string) []string {
	explicit := map[string]bool{}
	for _, c := range rest {
		if c.opt == "-m" && len(c.args) == 1 {
			explicit[c.args[0]] = true
		}
	}
	implicit := protoMatch(proto)
	ctx := "" // the match or target ("target:X") the options belong to
	for _, c := range rest {
		switch c.opt {
		case "-m":
			if len(c.args) == 1 {
				ctx = c.args[0]
			}
		case "-j", "-g":
			if len(c.args) == 1 {
				ctx = "target:" + c.args[0]
			}
		default:
			if implicit != "" && !explicit[implicit] && isProtoOption(implicit, c.opt) {
				out = append(out, "-m", implicit)
				explicit[implicit] = true
				ctx = implicit
			}
			canonOption(ctx, c)
		}
		out = c.appendTo(out)
		if c.opt == "-j" && len(c.args) == 1 && c.args[0] == "CONNMARK" {
			out = appendConnmarkDefaults(out, rest, c)
		}
	}
	return out
}

type clause struct {
	neg  bool
	opt  string
	args []string
}

func (c *clause) appendTo(out []string) []string {
	if c.neg {
		out = append(out, "!")
	}
	if c.opt != "" {
		out = append(out, c.opt)
	}
	return append(out, c.args...)
}

// oneArg lists options that always take exactly one argument, which may
// itself start with "-".
var oneArg = map[string]bool{
	"-s": true, "--source": true, "-d": true, "--destination": true,
	"-i": true, "--in-interface": true, "-o": true, "--out-interface": true,
	"-p": true, "--protocol": true, "-j": true, "--jump": true,
	"-g": true, "--goto": true, "-m": true, "--match": true, "--comment": true,
}

func splitClauses(toks []string) []clause {
	var out []clause
	neg := false
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t == "!" {
			neg = true
			continue
		}
		if len(t) < 2 || t[0] != '-' {
			// A stray argument: keep it as a clause of its own.
			out = append(out, clause{neg: neg, args: []string{t}})
			neg = false
			continue
		}
		c := clause{neg: neg, opt: t}
		neg = false
		if oneArg[t] {
			if i+1 < len(toks) {
				i++
				c.args = []string{toks[i]}
			}
		} else {
			for i+1 < len(toks) && toks[i+1] != "!" && (len(toks[i+1]) <= 1 || toks[i+1][0] != '-') {
				i++
				c.args = append(c.args, toks[i])
			}
		}
		out = append(out, c)
	}
	if neg {
		out = append(out, clause{args: []string{"!"}})
	}
	return out
}

func longToShort(opt string) string {
	switch opt {
	case "--source":
		return "-s"
	case "--destination":
		return "-d"
	case "--in-interface":
		return "-i"
	case "--out-interface":
		return "-o"
	case "--protocol":
		return "-p"
	case "--fragment":
		return "-f"
	case "--jump":
		return "-j"
	case "--goto":
		return "-g"
	case "--match":
		return "-m"
	}
	return opt
}

func canonProto(fam Family, p string) string {
	p = strings.ToLower(p)
	switch p {
	case "1":
		return "icmp"
	case "6":
		return "tcp"
	case "17":
		return "udp"
	case "58", "icmpv6":
		return "ipv6-icmp"
	case "0":
		return "all"
	}
	return p
}

// canonAddr renders an -s/-d value like iptables-save; drop reports a
// match-everything prefix, which iptables-save leaves out.
func canonAddr(fam Family, s string) (string, bool) {
	addrPart, maskPart, hasMask := strings.Cut(s, "/")
	a, err := netip.ParseAddr(addrPart)
	if err != nil || a.Zone() != "" || (fam == IPv6) != a.Is6() || a.Is4In6() {
		return s, false
	}
	bits := a.BitLen()
	if hasMask {
		if n, err := strconv.Atoi(maskPart); err == nil {
			bits = n
		} else if m, err := netip.ParseAddr(maskPart); err == nil && m.BitLen() == a.BitLen() {
			bits = maskBits(m)
			if bits < 0 {
				return s, false
			}
		} else {
			return s, false
		}
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return s, false
	}
	return p.String(), bits == 0
}

// maskBits returns the length of a contiguous netmask, or -1.
func maskBits(m netip.Addr) int {
	b := m.AsSlice()
	n, done := 0, false
	for _, x := range b {
		for i := 7; i >= 0; i-- {
			set := x&(1<<i) != 0
			switch {
			case set && done:
				return -1
			case set:
				n++
			default:
				done = true
			}
		}
	}
	return n
}

func protoMatch(proto string) string {
	switch proto {
	case "tcp", "udp", "icmp":
		return proto
	case "ipv6-icmp":
		return "icmp6"
	}
	return ""
}

func isProtoOption(match, opt string) bool {
	switch match {
	case "tcp":
		switch opt {
		case "--dport", "--sport", "--destination-port", "--source-port", "--tcp-flags", "--syn", "--tcp-option":
			return true
		}
	case "udp":
		switch opt {
		case "--dport", "--sport", "--destination-port", "--source-port":
			return true
		}
	case "icmp":
		return opt == "--icmp-type"
	case "icmp6":
		return opt == "--icmpv6-type"
	}
	return false
}

// canonOption normalizes one option of the match or target ctx in place.
func canonOption(ctx string, c *clause) {
	switch ctx {
	case "tcp", "udp":
		switch c.opt {
		case "--destination-port":
			c.opt = "--dport"
		case "--source-port":
			c.opt = "--sport"
		}
	case "mark", "connmark":
		if c.opt == "--mark" && len(c.args) == 1 {
			c.args[0] = canonMarkMask(c.args[0])
		}
	case "target:MARK":
		if len(c.args) != 1 {
			return
		}
		v, m, ok := parseMark(c.args[0])
		if !ok {
			return
		}
		switch c.opt {
		case "--set-mark":
			c.opt, c.args[0] = "--set-xmark", fmt.Sprintf("%#x/%#x", v, v|m)
		case "--set-xmark":
			c.args[0] = fmt.Sprintf("%#x/%#x", v, m)
		case "--and-mark":
			c.opt, c.args[0] = "--set-xmark", fmt.Sprintf("0x0/%#x", ^v)
		case "--or-mark":
			c.opt, c.args[0] = "--set-xmark", fmt.Sprintf("%#x/%#x", v, v)
		case "--xor-mark":
			c.opt, c.args[0] = "--set-xmark", fmt.Sprintf("%#x/0x0", v)
		}
	}
}

// parseMark parses "value[/mask]"; the mask defaults to 0xffffffff.
func parseMark(s string) (v, m uint32, ok bool) {
	vs, ms, hasMask := strings.Cut(s, "/")
	x, err := strconv.ParseUint(vs, 0, 32)
	if err != nil {
		return 0, 0, false
	}
	y := uint64(0xffffffff)
	if hasMask {
		if y, err = strconv.ParseUint(ms, 0, 32); err != nil {
			return 0, 0, false
		}
	}
	return uint32(x), uint32(y), true
}

// canonMarkMask renders a mark match value: hex, mask left out when full.
func canonMarkMask(s string) string {
	v, m, ok := parseMark(s)
	if !ok {
		return s
	}
	if m == 0xffffffff {
		return fmt.Sprintf("%#x", v)
	}
	return fmt.Sprintf("%#x/%#x", v, m)
}

// appendConnmarkDefaults gives a lone "--save-mark" or "--restore-mark" after
// the CONNMARK target the masks iptables-save prints for it. The option is
// still to be appended to out, so it is changed in place.
func appendConnmarkDefaults(out []string, rest []*clause, target *clause) []string {
	idx := -1
	for i, c := range rest {
		if c == target {
			idx = i
		}
	}
	opts := rest[idx+1:]
	if len(opts) != 1 || len(opts[0].args) != 0 || opts[0].neg {
		return out
	}
	switch opts[0].opt {
	case "--save-mark", "--restore-mark":
		opts[0].args = []string{"--nfmask", "0xffffffff", "--ctmask", "0xffffffff"}
	}
	return out
}
