package iptables

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// These tests use the real iptables binaries and kernel, as root, each in a
// network namespace of its own: the test's goroutine is locked to its thread
// and that thread moves into a new namespace; child processes forked from
// it inherit the namespace. The thread is never unlocked, so Go throws it
// away (and with it the namespace) when the test ends, even if it fails.
// Every command goes through a guard that refuses to run anywhere else.

var backends = []string{"nft", "legacy"}

// kernelNS is one test's namespace and the iptables binaries of a backend.
type kernelNS struct {
	tb      testing.TB
	ns      netns.NsHandle
	backend string
	closed  bool
}

// close releases the namespace handle; the thread leaves the namespace
// only by ending (or by moving into the next one).
func (k *kernelNS) close() {
	if !k.closed {
		k.closed = true
		k.ns.Close()
	}
}

// newKernelNS moves the calling goroutine's thread into a new network
// namespace for the rest of the test; it skips without root or binaries.
func newKernelNS(tb testing.TB, backend string) *kernelNS {
	tb.Helper()
	if os.Geteuid() != 0 || testing.Short() {
		tb.Skip("needs root; skipped by -short (make unit)")
	}
	for _, fam := range []Family{IPv4, IPv6} {
		if _, err := NewExecRunner(Options{Family: fam, Backend: backend}); err != nil {
			tb.Skipf("backend %s: %v", backend, err)
		}
	}
	runtime.LockOSThread() // never unlocked: see above
	ns, err := netns.New()
	if err != nil {
		tb.Fatalf("creating a network namespace: %v", err)
	}
	k := &kernelNS{tb: tb, ns: ns, backend: backend}
	tb.Cleanup(k.close)
	k.check()
	return k
}

// check fails the test unless the calling thread is in the namespace.
func (k *kernelNS) check() {
	cur, err := netns.Get()
	if err != nil {
		k.tb.Fatalf("reading the current network namespace: %v", err)
	}
	defer cur.Close()
	if !cur.Equal(k.ns) {
		k.tb.Fatalf("not in the test's network namespace: refusing to touch iptables")
	}
}

// controller returns a Controller whose every command is guarded.
func (k *kernelNS) controller(fam Family) *Controller {
	opts := Options{Family: fam, Backend: k.backend, Logger: testLogger(k.tb)}
	r, err := NewExecRunner(opts)
	if err != nil {
		k.tb.Fatal(err)
	}
	return NewWithRunner(opts, guardRunner{k, r})
}

type guardRunner struct {
	k *kernelNS
	r Runner
}

func (g guardRunner) Save(table string) ([]byte, error) { g.k.check(); return g.r.Save(table) }
func (g guardRunner) Restore(in []byte) error           { g.k.check(); return g.r.Restore(in) }
func (g guardRunner) Generation() (uint64, error) {
	g.k.check()
	if gr, ok := g.r.(Generationer); ok {
		return gr.Generation()
	}
	return 0, errNoGeneration
}

// ipt runs iptables (or ip6tables) of the backend with args.
func (k *kernelNS) ipt(fam Family, args ...string) {
	k.tb.Helper()
	k.check()
	bin := "iptables-" + k.backend
	if fam == IPv6 {
		bin = "ip6tables-" + k.backend
	}
	if out, err := exec.Command(bin, append([]string{"-w"}, args...)...).CombinedOutput(); err != nil {
		k.tb.Fatalf("%s %s: %v: %s", bin, strings.Join(args, " "), err, out)
	}
}

// save returns every table of the family as parsed iptables-save output.
func (k *kernelNS) save(fam Family) map[string]*savedTable {
	k.tb.Helper()
	r, err := NewExecRunner(Options{Family: fam, Backend: k.backend})
	if err != nil {
		k.tb.Fatal(err)
	}
	k.check()
	out, err := r.Save("")
	if err != nil {
		k.tb.Fatal(err)
	}
	tables, err := parseSave(out, "")
	if err != nil {
		k.tb.Fatal(err)
	}
	return tables
}

func (k *kernelNS) foreign(fam Family) map[string]map[string][]ruleKey {
	return foreignOf(k.save(fam), func(table, chain string) bool {
		return slices.Contains(fakeBuiltins[table], chain)
	})
}

// checkKernel fails unless the kernel holds cfg (rules as canonRule
// predicts them) and the foreign rules want.
func (k *kernelNS) checkKernel(t *testing.T, fam Family, cfg Config, want map[string]map[string][]ruleKey) {
	t.Helper()
	checkTables(t, k.save(fam), cfg, func(r []string) []string { return canonRule(fam, r) })
	if got := k.foreign(fam); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("foreign rules changed:\n got %v\nwant %v", got, want)
	}
}

func kernelConfig(fam Family) Config {
	cfg := baseConfig()
	if fam == IPv6 {
		cfg.Chains[0].Rules = [][]string{
			{"-s", "2001:db8:4::/48", "-d", "2001:db8:4::/48", "-j", "RETURN"},
			{"-s", "2001:db8:4:1::7", "-m", "comment", "--comment", "meshd: masquerade pods", "-j", "MASQUERADE"},
		}
	}
	return cfg
}

func TestKernel(t *testing.T) {
	for _, backend := range backends {
		for _, fam := range []Family{IPv4, IPv6} {
			t.Run(backend+"/"+fam.String(), func(t *testing.T) { testKernel(t, backend, fam) })
		}
	}
}

func testKernel(t *testing.T, backend string, fam Family) {
	k := newKernelNS(t, backend)
	// kube-proxy's and a CNI's rules, written with plain iptables.
	k.ipt(fam, "-t", "nat", "-N", "KUBE-POSTROUTING")
	k.ipt(fam, "-t", "nat", "-A", "KUBE-POSTROUTING", "-m", "mark", "--mark", "0x4000/0x4000", "-j", "MASQUERADE")
	k.ipt(fam, "-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING")
	k.ipt(fam, "-t", "filter", "-A", "FORWARD", "-i", "cni0", "-j", "ACCEPT")
	foreign := k.foreign(fam)

	c := k.controller(fam)
	cfg := kernelConfig(fam)
	mustSet(t, c, cfg, 2) // nat and filter
	k.checkKernel(t, fam, cfg, foreign)
	if len(c.learned) != 0 {
		t.Errorf("canonRule mispredicted: %q", c.learned)
	}
	mustSet(t, c, cfg, 0)
	if backend == "nft" {
		// Unchanged ruleset generation: not even a save.
		r := &countingRunner{Runner: c.run}
		c.run = r
		mustSet(t, c, cfg, 0)
		if r.saves != 0 {
			t.Errorf("unchanged Set on nft made %d saves", r.saves)
		}
	}

	// Change one rule: one restore, of that table.
	cfg.Chains[1].Rules[1] = []string{"-o", "meshd0", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"}
	mustSet(t, c, cfg, 1)
	k.checkKernel(t, fam, cfg, foreign)
	mustSet(t, c, cfg, 0)

	// Foreign software comes later.
	k.ipt(fam, "-t", "nat", "-I", "POSTROUTING", "1", "-o", "eth9", "-j", "ACCEPT")
	k.ipt(fam, "-t", "filter", "-N", "KUBE-FORWARD")
	k.ipt(fam, "-t", "filter", "-I", "FORWARD", "1", "-j", "KUBE-FORWARD")
	foreign = k.foreign(fam)
	mustSet(t, c, cfg, 0)

	// Repairs.
	k.ipt(fam, "-t", "nat", "-F", "MESHD-POSTROUTING")
	mustSet(t, c, cfg, 1)
	k.checkKernel(t, fam, cfg, foreign)
	k.ipt(fam, "-t", "filter", "-D", "FORWARD", "-j", "MESHD-FORWARD")
	mustSet(t, c, cfg, 1)
	k.checkKernel(t, fam, cfg, foreign)
	k.ipt(fam, "-t", "filter", "-A", "FORWARD", "-j", "MESHD-FORWARD") // a duplicate
	k.ipt(fam, "-t", "filter", "-D", "MESHD-FORWARD", "1")
	k.ipt(fam, "-t", "filter", "-A", "MESHD-FORWARD", "-i", "meshd0", "-j", "ACCEPT") // reordered
	mustSet(t, c, cfg, 1)
	k.checkKernel(t, fam, cfg, foreign)
	mustSet(t, c, cfg, 0)

	// Restart with a larger config, then with the original one: the
	// leftovers of the first go, also in a table cfg does not use.
	bigger := cfg
	bigger.Chains = append(slices.Clone(cfg.Chains),
		Chain{Table: "mangle", Name: "MESHD-MARK", Rules: [][]string{{"-i", "meshd0", "-j", "MARK", "--set-mark", "0x10"}, {"-j", "MESHD-MARK2"}}},
		Chain{Table: "mangle", Name: "MESHD-MARK2", Rules: [][]string{{"-j", "CONNMARK", "--save-mark"}}},
		Chain{Table: "nat", Name: "MESHD-OLD"},
	)
	bigger.Jumps = append(slices.Clone(cfg.Jumps),
		Jump{Table: "mangle", From: "PREROUTING", To: "MESHD-MARK", Insert: true},
		Jump{Table: "nat", From: "POSTROUTING", To: "MESHD-OLD"},
	)
	mustSet(t, k.controller(fam), bigger, 2)
	k.checkKernel(t, fam, bigger, foreign)
	mustSet(t, k.controller(fam), bigger, 0) // adopted: nothing to do
	c = k.controller(fam)
	mustSet(t, c, cfg, 2) // nat and mangle
	k.checkKernel(t, fam, cfg, foreign)
	mustSet(t, c, cfg, 0)

	// Cleanup leaves only the foreign rules.
	if err := c.Cleanup(); err != nil {
		t.Fatal(err)
	}
	k.checkKernel(t, fam, Config{}, foreign)
	before := c.Restores()
	if err := c.Cleanup(); err != nil || c.Restores() != before {
		t.Fatalf("second Cleanup: %v, %d restores", err, c.Restores()-before)
	}
}

// TestKernelRendering checks that canonRule predicts how iptables-save
// prints the kinds of rules meshd writes, and that quoting survives.
func TestKernelRendering(t *testing.T) {
	rules := map[Family][][]string{
		IPv4: {
			{"-s", "10.0.0.1", "-d", "10.1.0.0/16", "-o", "eth0", "-p", "tcp", "--dport", "80", "-j", "MASQUERADE", "--random-fully"},
			{"-p", "tcp", "-o", "eth0", "-d", "10.0.0.0/8", "-s", "198.51.100.5", "-i", "wg0", "-j", "ACCEPT"},
			{"--protocol", "udp", "--destination-port", "53", "--in-interface", "wg+", "!", "--out-interface", "lo", "-j", "DROP"},
			{"!", "-s", "10.2.0.5/24", "-j", "SNAT", "--to-source", "10.0.0.9"},
			{"-s", "10.0.0.0/255.255.0.0", "-j", "ACCEPT"},
			{"-s", "0.0.0.0/0", "-j", "ACCEPT"},
			{"-p", "6", "-j", "ACCEPT"},
			{"-m", "mark", "--mark", "1/1", "-j", "ACCEPT"},
			{"-m", "mark", "--mark", "16", "-j", "CONNMARK", "--save-mark"},
			{"-j", "CONNMARK", "--restore-mark"},
			{"-j", "MARK", "--set-mark", "0x10"},
			{"-j", "MARK", "--set-mark", "0x4000/0x4000"},
			{"-j", "MARK", "--or-mark", "0x4000"},
			{"-j", "MARK", "--and-mark", "0xffffbfff"},
			{"-j", "MARK", "--xor-mark", "0x4000"},
			{"-p", "tcp", "--tcp-flags", "SYN,RST", "SYN", "-j", "TCPMSS", "--clamp-mss-to-pmtu"},
			{"-i", "meshd0", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
			{"-m", "comment", "--comment", `it's "quoted" \ and spaced`, "-j", "RETURN"},
			{"-m", "comment", "--comment", "-dash", "-j", "RETURN"},
			{"-p", "udp", "-m", "udp", "--sport", "51820", "-m", "comment", "--comment", "x", "-j", "ACCEPT"},
		},
		IPv6: {
			{"-s", "2001:db8:0:0::1", "-d", "2001:db8::/32", "-j", "ACCEPT"},
			{"!", "-d", "2001:db8:1::5/64", "-o", "meshd0", "-j", "MASQUERADE"},
			{"-p", "udp", "--dport", "51820", "-j", "ACCEPT"},
			{"-j", "MARK", "--set-mark", "0x10"},
		},
	}
	for _, backend := range backends {
		for _, fam := range []Family{IPv4, IPv6} {
			t.Run(backend+"/"+fam.String(), func(t *testing.T) {
				k := newKernelNS(t, backend)
				table := "mangle" // has every built-in chain; MARK and TCPMSS work here
				var cfg Config
				if fam == IPv4 {
					// SNAT and MASQUERADE need nat.
					cfg.Chains = append(cfg.Chains, Chain{Table: "nat", Name: "MESHD-NAT", Rules: [][]string{rules[fam][0], rules[fam][3]}})
				} else {
					cfg.Chains = append(cfg.Chains, Chain{Table: "nat", Name: "MESHD-NAT", Rules: [][]string{rules[fam][1]}})
				}
				var rest [][]string
				for _, r := range rules[fam] {
					if !slices.Contains(r, "MASQUERADE") && !slices.Contains(r, "SNAT") {
						rest = append(rest, r)
					}
				}
				cfg.Chains = append(cfg.Chains, Chain{Table: table, Name: "MESHD-R", Rules: rest})
				c := k.controller(fam)
				mustSet(t, c, cfg, 2)
				for table, m := range c.learned {
					for in, out := range m {
						t.Errorf("%s: canonRule(%q) = %q, kernel prints %q", table, in.tokens(), canonRule(fam, in.tokens()), out.tokens())
					}
				}
				k.checkKernel(t, fam, cfg, map[string]map[string][]ruleKey{})
				mustSet(t, k.controller(fam), cfg, 0)
			})
		}
	}
}

// bigConfig has n rules: half MASQUERADE exceptions in nat, half ACCEPTs
// in filter, like a large mesh's per-peer rules.
func bigConfig(n int) Config {
	nat := Chain{Table: "nat", Name: "MESHD-POSTROUTING"}
	filter := Chain{Table: "filter", Name: "MESHD-FORWARD"}
	for i := range n / 2 {
		cidr := fmt.Sprintf("10.%d.%d.0/24", 64+i/256, i%256)
		nat.Rules = append(nat.Rules, []string{"-s", cidr, "-d", "10.0.0.0/8", "-m", "comment", "--comment", fmt.Sprintf("peer %d", i), "-j", "RETURN"})
		filter.Rules = append(filter.Rules, []string{"-s", cidr, "-i", "meshd0", "-j", "ACCEPT"})
	}
	return Config{
		Chains: []Chain{nat, filter},
		Jumps: []Jump{
			{Table: "nat", From: "POSTROUTING", To: nat.Name},
			{Table: "filter", From: "FORWARD", To: filter.Name, Insert: true},
		},
	}
}

func BenchmarkSet2000Rules(b *testing.B) {
	cfg := bigConfig(2000)
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) {
			var total, cpu time.Duration
			for range b.N {
				b.StopTimer()
				k := newKernelNS(b, backend) // a fresh, empty namespace
				c := k.controller(IPv4)
				b.StartTimer()
				start, cpu0 := time.Now(), cpuTime()
				if err := c.Set(cfg); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
				cpu += cpuTime() - cpu0
				if c.Restores() != 2 {
					b.Fatalf("%d restores", c.Restores())
				}
				b.StopTimer()
				k.close()
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/set")
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/set")
		})
	}
}

func BenchmarkSetUnchanged(b *testing.B) {
	cfg := bigConfig(2000)
	// "nft-read" is nft when its generation changed (someone else wrote
	// to nf_tables) and the tables have to be read and compared.
	for _, name := range []string{"nft", "legacy", "nft-read"} {
		backend, read := strings.CutSuffix(name, "-read")
		b.Run(name, func(b *testing.B) {
			k := newKernelNS(b, backend)
			c := k.controller(IPv4)
			if read {
				c.run = plainRunner{c.run}
			}
			if err := c.Set(cfg); err != nil {
				b.Fatal(err)
			}
			before := c.Restores()
			b.ResetTimer()
			cpu := cpuTime()
			for range b.N {
				if err := c.Set(cfg); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportCPU(b, cpu)
			if c.Restores() != before {
				b.Fatalf("unchanged Set made %d restores", c.Restores()-before)
			}
		})
	}
}

// BenchmarkSave is the floor of BenchmarkSetUnchanged: one iptables-save
// process reading the same 2,000 rules.
func BenchmarkSave(b *testing.B) {
	cfg := bigConfig(2000)
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) {
			k := newKernelNS(b, backend)
			if err := k.controller(IPv4).Set(cfg); err != nil {
				b.Fatal(err)
			}
			r := guardRunner{k, mustRunner(b, backend)}
			b.ResetTimer()
			cpu := cpuTime()
			for range b.N {
				if _, err := r.Save(""); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		})
	}
}

func mustRunner(tb testing.TB, backend string) Runner {
	r, err := NewExecRunner(Options{Backend: backend})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// cpuTime returns the CPU time used so far by this process and its
// waited-for children (the iptables binaries): a figure that a busy machine
// distorts less than wall time.
func cpuTime() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}

func reportCPU(b *testing.B, since time.Duration) {
	b.ReportMetric(float64((cpuTime()-since).Microseconds())/1000/float64(b.N), "cpu-ms/op")
}

type countingRunner struct {
	Runner
	saves int
}

func (r *countingRunner) Save(table string) ([]byte, error) { r.saves++; return r.Runner.Save(table) }
func (r *countingRunner) Generation() (uint64, error)       { return r.Runner.(Generationer).Generation() }

func TestKernelGeneration(t *testing.T) {
	k := newKernelNS(t, "nft")
	g0, err := nftGeneration()
	if err != nil {
		t.Fatal(err)
	}
	k.ipt(IPv4, "-t", "filter", "-A", "FORWARD", "-j", "ACCEPT")
	g1, err := nftGeneration()
	if err != nil {
		t.Fatal(err)
	}
	k.ipt(IPv6, "-t", "filter", "-A", "FORWARD", "-j", "ACCEPT")
	g2, err := nftGeneration()
	if err != nil {
		t.Fatal(err)
	}
	if g0 >= g1 || g1 >= g2 {
		t.Errorf("generations %d, %d, %d do not increase", g0, g1, g2)
	}
}
