package iptables

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func newFake(t *testing.T, fam Family) (*FakeRunner, *Controller) {
	t.Helper()
	f := NewFakeRunner(fam)
	return f, NewWithRunner(Options{Family: fam, Logger: testLogger(t)}, f)
}

func baseConfig() Config {
	return Config{
		Chains: []Chain{
			{Table: "nat", Name: "MESHD-POSTROUTING", Rules: [][]string{
				{"-s", "10.4.0.0/16", "-d", "10.4.0.0/16", "-j", "RETURN"},
				{"-s", "10.4.1.7", "-m", "comment", "--comment", "meshd: masquerade pods", "-j", "MASQUERADE"},
			}},
			{Table: "filter", Name: "MESHD-FORWARD", Rules: [][]string{
				{"-i", "meshd0", "-j", "ACCEPT"},
				{"-o", "meshd0", "-j", "ACCEPT"},
			}},
		},
		Jumps: []Jump{
			{Table: "nat", From: "POSTROUTING", To: "MESHD-POSTROUTING"},
			{Table: "filter", From: "FORWARD", To: "MESHD-FORWARD", Insert: true},
		},
	}
}

// foreign is state other software keeps in the same tables.
const foreign = `*nat
:KUBE-POSTROUTING - [0:0]
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
-A POSTROUTING -s 10.99.0.0/16 -j MASQUERADE
COMMIT
*filter
:KUBE-FORWARD - [0:0]
-A FORWARD -j KUBE-FORWARD
-A FORWARD -i cni0 -j ACCEPT
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
`

// foreignState returns every rule that is not meshd's, by table and chain.
func foreignState(f *FakeRunner) map[string]map[string][]ruleKey {
	tables, err := parseSave([]byte(f.Dump("")), "")
	if err != nil {
		panic(err)
	}
	return foreignOf(tables, func(table, chain string) bool { return slices.Contains(fakeBuiltins[table], chain) })
}

// foreignOf returns the rules of tables that are not meshd's, leaving out
// empty chains for which builtin is true.
func foreignOf(tables map[string]*savedTable, builtin func(table, chain string) bool) map[string]map[string][]ruleKey {
	out := map[string]map[string][]ruleKey{}
	for table, st := range tables {
		for _, c := range st.chains {
			if strings.HasPrefix(c, DefaultPrefix) {
				continue
			}
			var rules []ruleKey
			for _, r := range st.rules[c] {
				if !strings.HasPrefix(target(r.tokens()), DefaultPrefix) {
					rules = append(rules, r)
				}
			}
			if len(rules) == 0 && builtin(table, c) {
				continue // tables appear with their built-in chains
			}
			if out[table] == nil {
				out[table] = map[string][]ruleKey{}
			}
			out[table][c] = rules
		}
	}
	return out
}

// checkState fails unless f holds exactly cfg's chains and jumps (and the
// foreign state want, when not nil).
func checkState(t *testing.T, f *FakeRunner, cfg Config, wantForeign map[string]map[string][]ruleKey) {
	t.Helper()
	tables, err := parseSave([]byte(f.Dump("")), "")
	if err != nil {
		t.Fatal(err)
	}
	checkTables(t, tables, cfg, f.render)
	if wantForeign != nil {
		if got := foreignState(f); fmt.Sprint(got) != fmt.Sprint(wantForeign) {
			t.Errorf("foreign state changed:\n got %v\nwant %v", got, wantForeign)
		}
	}
	if t.Failed() {
		t.Logf("state:\n%s", f.Dump(""))
	}
}

// checkTables fails unless tables hold exactly cfg's chains, with each rule
// as render prints it, and cfg's jumps, each once.
func checkTables(t *testing.T, tables map[string]*savedTable, cfg Config, render func([]string) []string) {
	t.Helper()
	desired := map[string]map[string][]ruleKey{}
	for _, ch := range cfg.Chains {
		if desired[ch.Table] == nil {
			desired[ch.Table] = map[string][]ruleKey{}
		}
		rules := []ruleKey{}
		for _, r := range ch.Rules {
			rules = append(rules, keyOf(render(r)))
		}
		desired[ch.Table][ch.Name] = rules
	}
	wantJumps := map[string]int{}
	for _, j := range cfg.Jumps {
		wantJumps[j.Table+" "+j.From+" "+j.To] = 1
	}
	gotJumps := map[string]int{}
	for table, st := range tables {
		for _, c := range st.chains {
			rules := st.rules[c]
			if strings.HasPrefix(c, DefaultPrefix) {
				want, ok := desired[table][c]
				if !ok {
					t.Errorf("chain %s/%s should not exist", table, c)
					continue
				}
				if fmt.Sprintf("%q", rules) != fmt.Sprintf("%q", want) && (len(rules) != 0 || len(want) != 0) {
					t.Errorf("chain %s/%s:\n got %q\nwant %q", table, c, rules, want)
				}
				continue
			}
			for _, r := range rules {
				if to := target(r.tokens()); strings.HasPrefix(to, DefaultPrefix) {
					if len(r.tokens()) != 2 {
						t.Errorf("%s/%s: unexpected rule into meshd chain %q", table, c, r)
					}
					gotJumps[table+" "+c+" "+to]++
				}
			}
		}
	}
	for table, chains := range desired {
		for c := range chains {
			if tables[table] == nil || !tables[table].exists[c] {
				t.Errorf("chain %s/%s missing", table, c)
			}
		}
	}
	if fmt.Sprint(gotJumps) != fmt.Sprint(wantJumps) {
		t.Errorf("jumps: got %v, want %v", gotJumps, wantJumps)
	}
}

func mustSet(t *testing.T, c *Controller, cfg Config, wantRestores uint64) {
	t.Helper()
	before := c.Restores()
	if err := c.Set(cfg); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if got := c.Restores() - before; got != wantRestores {
		t.Fatalf("Set made %d restores, want %d", got, wantRestores)
	}
}

func TestSetCreateThenUnchanged(t *testing.T) {
	f, c := newFake(t, IPv4)
	if err := f.Apply(foreign); err != nil {
		t.Fatal(err)
	}
	fs := foreignState(f)
	cfg := baseConfig()
	mustSet(t, c, cfg, 2) // nat and filter
	checkState(t, f, cfg, fs)
	if got := f.Rules("filter", "FORWARD")[0]; !slices.Equal(got, []string{"-j", "MESHD-FORWARD"}) {
		t.Errorf("inserted jump is not first: %q", got)
	}
	if got := f.Rules("nat", "POSTROUTING"); !slices.Equal(got[len(got)-1], []string{"-j", "MESHD-POSTROUTING"}) {
		t.Errorf("appended jump is not last: %q", got)
	}
	// The fake has a ruleset generation: unchanged, nothing is read.
	saves := f.Saves()
	for range 3 {
		mustSet(t, c, cfg, 0)
	}
	if got := f.Saves() - saves; got != 0 {
		t.Errorf("3 unchanged Sets made %d saves, want 0", got)
	}
	checkState(t, f, cfg, fs)

	// Without one (iptables-legacy), every Set reads once.
	c = NewWithRunner(Options{Logger: testLogger(t)}, plainRunner{f})
	saves = f.Saves()
	for range 3 {
		mustSet(t, c, cfg, 0)
	}
	if got := f.Saves() - saves; got != 3 {
		t.Errorf("3 unchanged Sets made %d saves, want 3", got)
	}
}

// plainRunner hides the fake's Generation.
type plainRunner struct{ r Runner }

func (p plainRunner) Save(table string) ([]byte, error) { return p.r.Save(table) }
func (p plainRunner) Restore(in []byte) error           { return p.r.Restore(in) }

// brokenGen is a Runner whose generation cannot be read or never changes.
type brokenGen struct {
	*FakeRunner
	err error
}

func (b brokenGen) Generation() (uint64, error) { return 7, b.err }

func TestGeneration(t *testing.T) {
	f := NewFakeRunner(IPv4)
	cfg := baseConfig()
	// Unreadable: every Set reads the tables.
	c := NewWithRunner(Options{Logger: testLogger(t)}, brokenGen{f, errors.New("no netlink")})
	mustSet(t, c, cfg, 2)
	saves := f.Saves()
	mustSet(t, c, cfg, 0)
	if f.Saves() != saves+1 {
		t.Errorf("unchanged Set without a generation made %d saves, want 1", f.Saves()-saves)
	}
	// A changed Config is applied even when the generation is unchanged.
	c = NewWithRunner(Options{Logger: testLogger(t)}, brokenGen{f, nil})
	mustSet(t, c, cfg, 0)
	cfg.Chains[1].Rules = cfg.Chains[1].Rules[:1]
	mustSet(t, c, cfg, 1)
	checkState(t, f, cfg, nil)
	// A failed Set does not count as verified.
	f.FailRestore = func([]byte) error { return errors.New("boom") }
	cfg.Chains[1].Rules = nil
	if err := c.Set(cfg); err == nil {
		t.Fatal("no error")
	}
	f.FailRestore = nil
	mustSet(t, c, cfg, 1)
	checkState(t, f, cfg, nil)
}

func TestSetChangeOneRuleOneRestore(t *testing.T) {
	f, c := newFake(t, IPv4)
	cfg := baseConfig()
	mustSet(t, c, cfg, 2)
	filterBefore := f.Dump("filter")
	cfg.Chains[0].Rules[1] = []string{"-s", "10.4.1.8", "-j", "MASQUERADE"}
	var inputs []string
	f.FailRestore = func(in []byte) error { inputs = append(inputs, string(in)); return nil }
	mustSet(t, c, cfg, 1)
	checkState(t, f, cfg, nil)
	if len(inputs) != 1 || !strings.HasPrefix(inputs[0], "*nat\n") || strings.Contains(inputs[0], "-A POSTROUTING") {
		t.Errorf("restore input: %q", inputs)
	}
	if f.Dump("filter") != filterBefore {
		t.Errorf("filter changed")
	}
	mustSet(t, c, cfg, 0)
}

func TestForeignUntouched(t *testing.T) {
	f, c := newFake(t, IPv4)
	cfg := baseConfig()
	mustSet(t, c, cfg, 2)
	// Other software comes later and writes around our rules.
	if err := f.Apply(foreign); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply("*filter\n-I FORWARD 1 -j DROP\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	fs := foreignState(f)
	mustSet(t, c, cfg, 0) // our jump is no longer first: left alone
	cfg.Chains[1].Rules = cfg.Chains[1].Rules[:1]
	mustSet(t, c, cfg, 1)
	checkState(t, f, cfg, fs)
	if err := c.Cleanup(); err != nil {
		t.Fatal(err)
	}
	checkState(t, f, Config{}, fs)
}

func TestRepair(t *testing.T) {
	for _, tc := range []struct {
		name, perturb string
	}{
		{"delete rule", "*nat\n-D MESHD-POSTROUTING 2\nCOMMIT\n"},
		{"reorder", "*nat\n-D MESHD-POSTROUTING 1\n-A MESHD-POSTROUTING -s 10.4.0.0/16 -d 10.4.0.0/16 -j RETURN\nCOMMIT\n"},
		{"flush chain", "*nat\n-F MESHD-POSTROUTING\nCOMMIT\n"},
		{"extra rule", "*nat\n-A MESHD-POSTROUTING -j ACCEPT\nCOMMIT\n"},
		{"delete jump", "*filter\n-D FORWARD -j MESHD-FORWARD\nCOMMIT\n"},
		{"duplicate jump", "*filter\n-A FORWARD -j MESHD-FORWARD\nCOMMIT\n"},
		{"foreign jump into ours", "*filter\n-A FORWARD -i eth9 -j MESHD-FORWARD\nCOMMIT\n"},
		{"delete chain", "*nat\n-D POSTROUTING -j MESHD-POSTROUTING\n-F MESHD-POSTROUTING\n-X MESHD-POSTROUTING\nCOMMIT\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c := newFake(t, IPv4)
			if err := f.Apply(foreign); err != nil {
				t.Fatal(err)
			}
			fs := foreignState(f)
			cfg := baseConfig()
			mustSet(t, c, cfg, 2)
			if err := f.Apply(tc.perturb); err != nil {
				t.Fatal(err)
			}
			mustSet(t, c, cfg, 1)
			checkState(t, f, cfg, fs)
			mustSet(t, c, cfg, 0)
		})
	}
}

func TestAdoptAfterRestart(t *testing.T) {
	f, c := newFake(t, IPv4)
	if err := f.Apply(foreign); err != nil {
		t.Fatal(err)
	}
	fs := foreignState(f)
	cfg := baseConfig()
	old := cfg
	old.Chains = append(slices.Clone(cfg.Chains),
		Chain{Table: "raw", Name: "MESHD-NOTRACK", Rules: [][]string{{"-j", "MESHD-NOTRACK2"}}},
		Chain{Table: "raw", Name: "MESHD-NOTRACK2", Rules: [][]string{{"-p", "udp", "--dport", "51820", "-j", "NOTRACK"}}},
		Chain{Table: "nat", Name: "MESHD-OLD", Rules: [][]string{{"-j", "RETURN"}}},
	)
	old.Jumps = append(slices.Clone(cfg.Jumps),
		Jump{Table: "raw", From: "PREROUTING", To: "MESHD-NOTRACK"},
		Jump{Table: "nat", From: "POSTROUTING", To: "MESHD-OLD", Insert: true},
	)
	mustSet(t, c, old, 3)
	// A jump with a match, as an older meshd might have written.
	if err := f.Apply("*raw\n-A OUTPUT -o meshd0 -j MESHD-NOTRACK\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}

	// Restart with the same config: nothing to do.
	c2 := NewWithRunner(Options{Logger: testLogger(t)}, f)
	mustSet(t, c2, old, 1) // only the raw OUTPUT jump, which is not desired
	mustSet(t, c2, old, 0)

	// Restart with a smaller config: the leftovers go.
	c3 := NewWithRunner(Options{Logger: testLogger(t)}, f)
	mustSet(t, c3, cfg, 2) // nat and raw
	checkState(t, f, cfg, fs)
	mustSet(t, c3, cfg, 0)
}

func TestJumps(t *testing.T) {
	f, c := newFake(t, IPv4)
	cfg := Config{
		Chains: []Chain{
			{Table: "filter", Name: "MESHD-A", Rules: [][]string{{"-j", "RETURN"}}},
			{Table: "filter", Name: "MESHD-B"},
			{Table: "filter", Name: "MESHD-C"},
		},
		Jumps: []Jump{
			{Table: "filter", From: "FORWARD", To: "MESHD-A", Insert: true},
			{Table: "filter", From: "FORWARD", To: "MESHD-B", Insert: true},
			{Table: "filter", From: "FORWARD", To: "MESHD-C"},
			{Table: "filter", From: "FORWARD", To: "MESHD-C"}, // twice: once in the kernel
			{Table: "filter", From: "INPUT", To: "MESHD-A"},
		},
	}
	if err := f.Apply("*filter\n-A FORWARD -j ACCEPT\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	mustSet(t, c, cfg, 1)
	checkState(t, f, cfg, nil)
	want := [][]string{{"-j", "MESHD-A"}, {"-j", "MESHD-B"}, {"-j", "ACCEPT"}, {"-j", "MESHD-C"}}
	if got := f.Rules("filter", "FORWARD"); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("FORWARD = %q, want %q", got, want)
	}
	// Dropping a jump deletes just it; the chain stays.
	cfg.Jumps = cfg.Jumps[1:]
	mustSet(t, c, cfg, 1)
	checkState(t, f, cfg, nil)
	mustSet(t, c, cfg, 0)
}

func TestValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"prefix", Config{Chains: []Chain{{Table: "nat", Name: "KUBE-X"}}}, "must start with"},
		{"long name", Config{Chains: []Chain{{Table: "nat", Name: "MESHD-" + strings.Repeat("X", 30)}}}, "at most 28"},
		{"table", Config{Chains: []Chain{{Table: "Nat!", Name: "MESHD-X"}}}, "bad table"},
		{"twice", Config{Chains: []Chain{{Table: "nat", Name: "MESHD-X"}, {Table: "nat", Name: "MESHD-X"}}}, "twice"},
		{"jump to missing", Config{Jumps: []Jump{{Table: "nat", From: "POSTROUTING", To: "MESHD-X"}}}, "not a desired chain"},
		{"jump from owned", Config{Chains: []Chain{{Table: "nat", Name: "MESHD-X"}}, Jumps: []Jump{{Table: "nat", From: "MESHD-Y", To: "MESHD-X"}}}, "meshd does not own"},
		{"jump across tables", Config{Chains: []Chain{{Table: "nat", Name: "MESHD-X"}}, Jumps: []Jump{{Table: "filter", From: "FORWARD", To: "MESHD-X"}}}, "not a desired chain"},
		{"rule to undesired", Config{Chains: []Chain{{Table: "nat", Name: "MESHD-X", Rules: [][]string{{"-j", "MESHD-Y"}}}}}, "not a desired chain"},
		{"two addresses", Config{Chains: []Chain{{Table: "nat", Name: "MESHD-X", Rules: [][]string{{"-s", "10.0.0.1,10.0.0.2", "-j", "ACCEPT"}}}}}, "one address"},
		{"newline", Config{Chains: []Chain{{Table: "nat", Name: "MESHD-X", Rules: [][]string{{"-j", "ACCEPT\n-A X"}}}}}, "line break"},
		{"empty rule", Config{Chains: []Chain{{Table: "nat", Name: "MESHD-X", Rules: [][]string{{}}}}}, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c := newFake(t, IPv4)
			err := c.Set(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Set = %v, want an error containing %q", err, tc.want)
			}
			if f.Saves() != 0 || f.Restores() != 0 {
				t.Errorf("an invalid config touched the kernel")
			}
		})
	}
}

func TestKeepGoingPastFailure(t *testing.T) {
	f, c := newFake(t, IPv4)
	cfg := baseConfig()
	f.FailRestore = func(in []byte) error {
		if strings.HasPrefix(string(in), "*filter") {
			return errors.New("iptables-restore: line 3 failed: boom")
		}
		return nil
	}
	err := c.Set(cfg)
	if err == nil || !strings.Contains(err.Error(), "writing IPv4 table filter") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Set = %v", err)
	}
	if f.Rules("nat", "MESHD-POSTROUTING") == nil {
		t.Errorf("nat was not written")
	}
	f.FailRestore = nil
	mustSet(t, c, cfg, 1)
	checkState(t, f, cfg, nil)
	mustSet(t, c, cfg, 0)
}

func TestSaveFailure(t *testing.T) {
	c := NewWithRunner(Options{}, failingRunner{})
	err := c.Set(baseConfig())
	if err == nil || !strings.Contains(err.Error(), "reading IPv4 iptables") || !strings.Contains(err.Error(), "no save") {
		t.Fatalf("Set = %v", err)
	}
	if err := c.Cleanup(); err == nil {
		t.Fatal("Cleanup did not fail")
	}
}

type failingRunner struct{}

func (failingRunner) Save(string) ([]byte, error) { return nil, errors.New("no save") }
func (failingRunner) Restore([]byte) error        { return errors.New("no restore") }

// TestLearnRendering uses a fake kernel that renders rules in a way
// canonRule cannot predict: the first write of a rule teaches the
// Controller its rendering.
func TestLearnRendering(t *testing.T) {
	f, c := newFake(t, IPv4)
	f.Render = func(r []string) []string {
		for i := range r {
			if i > 0 && r[i-1] == "--comment" {
				r[i] = strings.ToUpper(r[i])
			}
		}
		return r
	}
	cfg := baseConfig()
	mustSet(t, c, cfg, 2)
	mustSet(t, c, cfg, 0)
	// A restarted Controller cannot predict it: one write, then learned.
	c2 := NewWithRunner(Options{Logger: testLogger(t)}, f)
	mustSet(t, c2, cfg, 1)
	mustSet(t, c2, cfg, 0)
	checkState(t, f, cfg, nil)
	// Learned renderings of rules no longer desired are forgotten.
	cfg.Chains[0].Rules = cfg.Chains[0].Rules[:1]
	mustSet(t, c2, cfg, 1)
	if n := len(c2.learned["nat"]); n != 0 {
		t.Errorf("%d learned renderings left", n)
	}
}

func TestCleanup(t *testing.T) {
	f, c := newFake(t, IPv6)
	if err := f.Apply(foreign); err != nil {
		t.Fatal(err)
	}
	fs := foreignState(f)
	cfg := baseConfig()
	cfg.Chains[0].Rules = [][]string{{"-s", "2001:db8::1", "-j", "MASQUERADE"}}
	mustSet(t, c, cfg, 2)
	mustSet(t, c, cfg, 0)
	if err := c.Cleanup(); err != nil {
		t.Fatal(err)
	}
	checkState(t, f, Config{}, fs)
	before := c.Restores()
	if err := c.Cleanup(); err != nil || c.Restores() != before {
		t.Fatalf("second Cleanup: %v, %d restores", err, c.Restores()-before)
	}
	// Set works again after Cleanup.
	mustSet(t, c, cfg, 2)
	checkState(t, f, cfg, fs)
}

func TestQuoteRoundTrip(t *testing.T) {
	for _, tok := range []string{"plain", "two words", `a "q" b`, `back\slash`, "it's", "", "tab\there", `\"`} {
		got, err := splitLine("-A X " + quote(tok) + " end")
		if err != nil || len(got) != 4 || got[2] != tok || got[3] != "end" {
			t.Errorf("quote(%q) = %s → %q, %v", tok, quote(tok), got, err)
		}
	}
	// What iptables-save prints.
	got, err := splitLine(`-A MESHD-X -m comment --comment "it\'s \\ \"x\"" -j RETURN`)
	if err != nil || got[5] != `it's \ "x"` {
		t.Errorf("splitLine = %q, %v", got, err)
	}
}

func TestCanonRule(t *testing.T) {
	for _, tc := range []struct {
		fam     Family
		in, out string
	}{
		{IPv4, "-s 10.0.0.1 -d 10.1.0.0/16 -o eth0 -p tcp --dport 80 -j MASQUERADE --random-fully",
			"-s 10.0.0.1/32 -d 10.1.0.0/16 -o eth0 -p tcp -m tcp --dport 80 -j MASQUERADE --random-fully"},
		{IPv4, "-p tcp -o eth0 -d 10.0.0.0/8 -s 2.3.4.5 -i wg0 -j ACCEPT", "-s 2.3.4.5/32 -d 10.0.0.0/8 -i wg0 -o eth0 -p tcp -j ACCEPT"},
		{IPv4, "--protocol udp --destination-port 53 --in-interface wg+ ! --out-interface lo -j DROP", "-i wg+ ! -o lo -p udp -m udp --dport 53 -j DROP"},
		{IPv4, "! -s 10.2.0.5/24 -j SNAT --to-source 10.0.0.9", "! -s 10.2.0.0/24 -j SNAT --to-source 10.0.0.9"},
		{IPv4, "-s 10.0.0.0/255.255.0.0 -j ACCEPT", "-s 10.0.0.0/16 -j ACCEPT"},
		{IPv4, "-s 0.0.0.0/0 -j ACCEPT", "-j ACCEPT"},
		{IPv4, "-p 6 -j ACCEPT", "-p tcp -j ACCEPT"},
		{IPv4, "-p TCP -j ACCEPT", "-p tcp -j ACCEPT"},
		{IPv4, "-m mark --mark 1/1 -j ACCEPT", "-m mark --mark 0x1/0x1 -j ACCEPT"},
		{IPv4, "-m mark --mark 16 -j CONNMARK --save-mark", "-m mark --mark 0x10 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff"},
		{IPv4, "-j MARK --set-mark 0x10", "-j MARK --set-xmark 0x10/0xffffffff"},
		{IPv4, "-j MARK --set-mark 0x4000/0x4000", "-j MARK --set-xmark 0x4000/0x4000"},
		{IPv4, "-j MARK --or-mark 0x4000", "-j MARK --set-xmark 0x4000/0x4000"},
		{IPv4, "-p tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu", "-p tcp -m tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu"},
		{IPv4, "-i wg0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", "-i wg0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"},
		{IPv6, "-s 2001:db8:0:0::1 -d 2001:db8::/32 -j ACCEPT", "-s 2001:db8::1/128 -d 2001:db8::/32 -j ACCEPT"},
		{IPv6, "-s 10.0.0.1 -j ACCEPT", "-s 10.0.0.1 -j ACCEPT"}, // not for ip6tables: left alone
	} {
		got := strings.Join(canonRule(tc.fam, strings.Fields(tc.in)), " ")
		if got != tc.out {
			t.Errorf("canonRule(%q)\n got %q\nwant %q", tc.in, got, tc.out)
		}
	}
	// Comments keep their words.
	got := canonRule(IPv4, []string{"-s", "10.0.0.1", "-m", "comment", "--comment", "-x y", "-j", "ACCEPT"})
	if want := []string{"-s", "10.0.0.1/32", "-m", "comment", "--comment", "-x y", "-j", "ACCEPT"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestRandomConfigs replays random configurations in random order, with
// random damage to the kernel in between, and checks after every Set that
// the kernel holds exactly the desired state and that repeating the Set
// costs nothing.
func TestRandomConfigs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cfgs := make([]Config, 40)
	for i := range cfgs {
		cfgs[i] = randomConfig(rng)
	}
	f := NewFakeRunner(IPv4)
	if err := f.Apply(foreign); err != nil {
		t.Fatal(err)
	}
	fs := foreignState(f)
	c := NewWithRunner(Options{}, f)
	for step := range 300 {
		cfg := cfgs[rng.IntN(len(cfgs))]
		if step%50 == 49 {
			c = NewWithRunner(Options{}, f) // a restart
		}
		if rng.IntN(3) == 0 {
			damage(t, rng, f)
		}
		before := c.Restores()
		if err := c.Set(cfg); err != nil {
			t.Fatalf("step %d: Set: %v", step, err)
		}
		if n := c.Restores() - before; n > 4 {
			t.Fatalf("step %d: %d restores for at most 4 tables", step, n)
		}
		checkState(t, f, cfg, fs)
		mustSet(t, c, cfg, 0)
		if t.Failed() {
			t.Fatalf("step %d", step)
		}
	}
	if err := c.Cleanup(); err != nil {
		t.Fatal(err)
	}
	checkState(t, f, Config{}, fs)
}

var randomRules = [][]string{
	{"-j", "ACCEPT"},
	{"-s", "10.4.0.0/16", "-j", "RETURN"},
	{"-s", "10.4.1.1", "-j", "MASQUERADE"},
	{"-d", "198.51.100.7", "-m", "comment", "--comment", "peer b", "-j", "ACCEPT"},
	{"-i", "meshd0", "-j", "ACCEPT"},
	{"-o", "meshd0", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
	{"-p", "udp", "-m", "udp", "--dport", "51820", "-j", "ACCEPT"},
	{"-j", "DROP"},
}

func randomConfig(rng *rand.Rand) Config {
	var cfg Config
	builtins := map[string][]string{"filter": {"FORWARD", "INPUT"}, "nat": {"POSTROUTING"}, "mangle": {"PREROUTING", "FORWARD"}, "raw": {"PREROUTING"}}
	for _, table := range []string{"filter", "nat", "mangle", "raw"} {
		var names []string
		for _, n := range []string{"MESHD-A", "MESHD-B", "MESHD-C", "MESHD-" + strings.ToUpper(table)} {
			if rng.IntN(2) == 0 {
				names = append(names, n)
			}
		}
		for _, n := range names {
			ch := Chain{Table: table, Name: n}
			for range rng.IntN(5) {
				if rng.IntN(6) == 0 {
					ch.Rules = append(ch.Rules, []string{"-j", names[rng.IntN(len(names))]})
					continue
				}
				ch.Rules = append(ch.Rules, randomRules[rng.IntN(len(randomRules))])
			}
			cfg.Chains = append(cfg.Chains, ch)
			for _, from := range builtins[table] {
				if rng.IntN(2) == 0 {
					cfg.Jumps = append(cfg.Jumps, Jump{Table: table, From: from, To: n, Insert: rng.IntN(2) == 0})
				}
			}
		}
	}
	rng.Shuffle(len(cfg.Chains), func(i, j int) { cfg.Chains[i], cfg.Chains[j] = cfg.Chains[j], cfg.Chains[i] })
	return cfg
}

// damage changes one meshd thing in the fake kernel behind the
// Controller's back.
func damage(t *testing.T, rng *rand.Rand, f *FakeRunner) {
	t.Helper()
	table := []string{"filter", "nat", "mangle", "raw"}[rng.IntN(4)]
	var ours, others []string
	for _, c := range f.Chains(table) {
		if strings.HasPrefix(c, DefaultPrefix) {
			ours = append(ours, c)
		} else {
			others = append(others, c)
		}
	}
	if len(ours) == 0 {
		return
	}
	c := ours[rng.IntN(len(ours))]
	rules := f.Rules(table, c)
	var cmd string
	switch rng.IntN(5) {
	case 0:
		cmd = "-F " + c
	case 1:
		if len(rules) == 0 {
			return
		}
		cmd = fmt.Sprintf("-D %s %d", c, rng.IntN(len(rules))+1)
	case 2:
		if len(rules) < 2 {
			return
		}
		cmd = fmt.Sprintf("-D %s 1\n-A %s %s", c, c, strings.Join(quoteAll(rules[0]), " "))
	case 3:
		cmd = "-A " + others[rng.IntN(len(others))] + " -j " + c
	case 4:
		for _, o := range others {
			for _, r := range f.Rules(table, o) {
				if target(r) == c {
					cmd = "-D " + o + " " + strings.Join(quoteAll(r), " ")
				}
			}
		}
		if cmd == "" {
			return
		}
	}
	if err := f.Apply("*" + table + "\n" + cmd + "\nCOMMIT\n"); err != nil {
		t.Fatalf("damage %q: %v", cmd, err)
	}
}

func quoteAll(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = quote(t)
	}
	return out
}

func TestNew(t *testing.T) {
	if _, err := New(Options{Backend: "bogus"}); err == nil || !strings.Contains(err.Error(), "unknown iptables backend") {
		t.Errorf("New(bogus) = %v", err)
	}
	for _, backend := range []string{"", "nft", "legacy"} {
		for _, fam := range []Family{IPv4, IPv6} {
			c, err := New(Options{Family: fam, Backend: backend})
			if err != nil {
				t.Logf("backend %q %s: %v", backend, fam, err) // not installed here
				continue
			}
			r := c.run.(*ExecRunner)
			if want := backend == "nft" || (backend == "" && r.NFT); r.NFT != want {
				t.Errorf("backend %q: NFT = %v", backend, r.NFT)
			}
			if backend == "legacy" && r.NFT {
				t.Errorf("legacy detected as nft")
			}
		}
	}
}
