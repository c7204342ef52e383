package iptables

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Chain is one meshd chain and all of its rules, in order.
type Chain struct {
	Table string // "filter", "nat", "mangle", "raw", ...
	Name  string // must start with the Controller's prefix
	// Rules are the arguments after "-A CHAIN", one slice per rule, e.g.
	// {"-s", "10.0.0.0/24", "-j", "MASQUERADE"}.
	Rules [][]string
}

// Jump is a plain "-j To" rule in a chain meshd does not own (usually a
// built-in one) that sends packets into a meshd chain.
type Jump struct {
	Table, From, To string
	// Insert puts a new jump at position 1 of From; otherwise it is
	// appended. An existing jump is left where it is.
	Insert bool
}

// Config is the complete desired set of meshd chains and jumps of one
// address family. Chains and jumps not in it are removed.
type Config struct {
	Chains []Chain
	Jumps  []Jump
}

// Family is an address family: IPv4 (iptables) or IPv6 (ip6tables).
type Family int

const (
	IPv4 Family = iota
	IPv6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return fmt.Sprintf("Family(%d)", int(f))
}

// DefaultPrefix starts the name of every chain meshd owns.
const DefaultPrefix = "MESHD-"

// maxChainName is the longest chain name iptables accepts.
const maxChainName = 28

// Options configure a Controller.
type Options struct {
	Family Family
	// Backend picks the binaries: "" (iptables, whatever the system's
	// alternative is), "legacy" (iptables-legacy) or "nft" (iptables-nft).
	Backend string
	// Prefix of every chain meshd owns; DefaultPrefix when empty.
	Prefix string
	// Exec is put before every command line of the real binaries (New
	// only), e.g. {"nsenter", "--net=/run/netns/NAME"}.
	Exec   []string
	Logger *slog.Logger
}

// Controller keeps the meshd chains of one address family equal to the
// last Config given to Set. It is safe for concurrent use.
type Controller struct {
	fam    Family
	prefix string
	log    *slog.Logger
	run    Runner

	restores atomic.Uint64

	mu sync.Mutex
	// learned maps, per table, a desired rule to the kernel's rendering
	// of it, as read back right after writing it.
	learned map[string]map[ruleKey]ruleKey
	// predicted caches canonRule, by desired rule.
	predicted map[ruleKey]ruleKey
	// verified is set when the kernel held the Config with digest sum at
	// ruleset generation gen (Runners that are Generationers only).
	verified bool
	gen      uint64
	sum      [sha256.Size]byte
}

// New returns a Controller that runs the iptables binaries of opts.Family
// and opts.Backend; it fails when they are not installed.
func New(opts Options) (*Controller, error) {
	r, err := NewExecRunner(opts)
	if err != nil {
		return nil, fmt.Errorf("setting up %s iptables: %w", opts.Family, err)
	}
	return NewWithRunner(opts, r), nil
}

// NewWithRunner returns a Controller that reads and writes the kernel only
// through r (opts.Backend and opts.Exec are ignored).
func NewWithRunner(opts Options, r Runner) *Controller {
	c := &Controller{
		fam:       opts.Family,
		prefix:    opts.Prefix,
		log:       opts.Logger,
		run:       r,
		learned:   map[string]map[ruleKey]ruleKey{},
		predicted: map[ruleKey]ruleKey{},
	}
	if c.prefix == "" {
		c.prefix = DefaultPrefix
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.log = c.log.With("family", c.fam.String())
	return c
}

// Restores returns the number of restore transactions made so far.
func (c *Controller) Restores() uint64 { return c.restores.Load() }

func (c *Controller) restore(input []byte) error {
	c.restores.Add(1)
	return c.run.Restore(input)
}

func (c *Controller) owned(chain string) bool { return strings.HasPrefix(chain, c.prefix) }

// desiredTable is the validated part of a Config in one table.
type desiredTable struct {
	chains []Chain
	byName map[string]*Chain
	jumps  []Jump
}

func (c *Controller) validate(cfg Config) (map[string]*desiredTable, error) {
	tables := map[string]*desiredTable{}
	get := func(name string) *desiredTable {
		t := tables[name]
		if t == nil {
			t = &desiredTable{byName: map[string]*Chain{}}
			tables[name] = t
		}
		return t
	}
	var errs []error
	for _, ch := range cfg.Chains {
		if err := c.validateChain(ch); err != nil {
			errs = append(errs, err)
			continue
		}
		t := get(ch.Table)
		if t.byName[ch.Name] != nil {
			errs = append(errs, fmt.Errorf("chain %s/%s given twice", ch.Table, ch.Name))
			continue
		}
		t.chains = append(t.chains, ch)
		t.byName[ch.Name] = &t.chains[len(t.chains)-1]
	}
	for _, t := range tables {
		for i := range t.chains {
			t.byName[t.chains[i].Name] = &t.chains[i]
		}
	}
	seen := map[Jump]bool{}
	for _, j := range cfg.Jumps {
		key := Jump{Table: j.Table, From: j.From, To: j.To}
		switch {
		case !validTable(j.Table):
			errs = append(errs, fmt.Errorf("jump %s -> %s: bad table %q", j.From, j.To, j.Table))
		case j.From == "" || c.owned(j.From):
			errs = append(errs, fmt.Errorf("jump %s/%s -> %s: the source must be a chain meshd does not own (put jumps between meshd chains into their rules)", j.Table, j.From, j.To))
		case tables[j.Table] == nil || tables[j.Table].byName[j.To] == nil:
			errs = append(errs, fmt.Errorf("jump %s/%s -> %s: the target is not a desired chain of that table", j.Table, j.From, j.To))
		case seen[key]:
			// The same jump twice: one is enough.
		default:
			seen[key] = true
			tables[j.Table].jumps = append(tables[j.Table].jumps, j)
		}
	}
	// Rules may only jump to meshd chains that are desired.
	for name, t := range tables {
		for _, ch := range t.chains {
			for _, r := range ch.Rules {
				if to := target(r); to != "" && c.owned(to) && t.byName[to] == nil {
					errs = append(errs, fmt.Errorf("chain %s/%s: rule %q jumps to %s, which is not a desired chain", name, ch.Name, strings.Join(r, " "), to))
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid iptables config: %w", err)
	}
	return tables, nil
}

func (c *Controller) validateChain(ch Chain) error {
	if !validTable(ch.Table) {
		return fmt.Errorf("chain %s: bad table %q", ch.Name, ch.Table)
	}
	if !c.owned(ch.Name) || len(ch.Name) > maxChainName || strings.ContainsAny(ch.Name, " \t\"'\\\x00\n\r") {
		return fmt.Errorf("chain %s/%q: name must start with %q, have at most %d characters and no blanks or quotes", ch.Table, ch.Name, c.prefix, maxChainName)
	}
	for i, r := range ch.Rules {
		if len(r) == 0 {
			return fmt.Errorf("chain %s/%s: rule %d is empty", ch.Table, ch.Name, i+1)
		}
		for j, tok := range r {
			if strings.ContainsAny(tok, "\x00\n\r") {
				return fmt.Errorf("chain %s/%s: rule %d has a line break or NUL", ch.Table, ch.Name, i+1)
			}
			if (tok == "-s" || tok == "-d" || tok == "--source" || tok == "--destination") && j+1 < len(r) && strings.Contains(r[j+1], ",") {
				return fmt.Errorf("chain %s/%s: rule %d: %s %s: give one address per rule", ch.Table, ch.Name, i+1, tok, r[j+1])
			}
		}
	}
	return nil
}

func validTable(t string) bool {
	if t == "" {
		return false
	}
	for _, r := range t {
		if r < 'a' || r > 'z' {
			return false
		}
	}
	return true
}

// target returns the chain or target a rule jumps or goes to, or "".
func target(toks []string) string {
	for i := 0; i+1 < len(toks); i++ {
		switch toks[i] {
		case "-j", "--jump", "-g", "--goto":
			return toks[i+1]
		}
	}
	return ""
}

// Set makes the kernel's meshd chains and jumps of this family equal to cfg:
// it reads all tables once and writes one restore transaction per table
// that differs, and none when nothing differs. Chains with the prefix that
// are not in cfg are removed. A failure in one table does not stop the
// others; the errors are joined.
func (c *Controller) Set(cfg Config) error {
	desired, err := c.validate(cfg)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sum := digest(cfg)
	gen, genErr := c.generation()
	if genErr == nil && c.verified && gen == c.gen && sum == c.sum {
		return nil // nothing changed since the kernel last matched
	}
	c.verified = false
	kernel, err := c.read()
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for t := range desired {
		names[t] = true
	}
	for t, st := range kernel {
		if c.hasOwned(st) {
			names[t] = true
		}
	}
	var errs []error
	var written []string
	for _, table := range slices.Sorted(maps.Keys(names)) {
		want := desired[table]
		if want == nil {
			want = &desiredTable{byName: map[string]*Chain{}}
		}
		have := kernel[table]
		if have == nil {
			have = newSavedTable()
		}
		input, summary := c.plan(table, want, have)
		if input == nil {
			continue
		}
		c.log.Info("updating iptables", "table", table, "changes", summary)
		if err := c.restore(input); err != nil {
			errs = append(errs, fmt.Errorf("writing %s table %s (%s): %w", c.fam, table, summary, err))
			continue
		}
		written = append(written, table)
	}
	c.prune(desired)
	if len(written) > 0 {
		gen, genErr = c.generation() // before reading back: later changes show
		if err := c.learn(desired, written); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 && genErr == nil {
		c.verified, c.gen, c.sum = true, gen, sum
	}
	return errors.Join(errs...)
}

// generation returns the Runner's ruleset generation, if it has one.
func (c *Controller) generation() (uint64, error) {
	g, ok := c.run.(Generationer)
	if !ok {
		return 0, errNoGeneration
	}
	gen, err := g.Generation()
	if err != nil && !errors.Is(err, errNoGeneration) {
		c.log.Debug("cannot read the ruleset generation; reading the tables", "err", err)
	}
	return gen, err
}

// digest identifies a Config.
func digest(cfg Config) [sha256.Size]byte {
	h := sha256.New()
	var b []byte
	str := func(s string) {
		b = binary.AppendUvarint(b[:0], uint64(len(s)))
		h.Write(b)
		h.Write([]byte(s))
	}
	for _, ch := range cfg.Chains {
		str("chain")
		str(ch.Table)
		str(ch.Name)
		for _, r := range ch.Rules {
			str("rule")
			for _, tok := range r {
				str(tok)
			}
		}
	}
	for _, j := range cfg.Jumps {
		str("jump")
		str(j.Table)
		str(j.From)
		str(j.To)
		str(strconv.FormatBool(j.Insert))
	}
	return [sha256.Size]byte(h.Sum(nil))
}

// read saves and parses every table.
func (c *Controller) read() (map[string]*savedTable, error) {
	out, err := c.run.Save("")
	if err != nil {
		return nil, fmt.Errorf("reading %s iptables: %w", c.fam, err)
	}
	tables, err := parseSave(out, c.prefix)
	if err != nil {
		return nil, fmt.Errorf("parsing %s iptables-save output: %w", c.fam, err)
	}
	return tables, nil
}

func (c *Controller) hasOwned(st *savedTable) bool {
	for _, ch := range st.chains {
		if c.owned(ch) {
			return true
		}
	}
	return false
}

// expected returns how the kernel will print the desired rule r of table.
func (c *Controller) expected(table string, r []string) ruleKey {
	k := keyOf(r)
	if l, ok := c.learned[table][k]; ok {
		return l
	}
	return c.predict(r)
}

// predict returns canonRule's rendering of r, cached.
func (c *Controller) predict(r []string) ruleKey {
	k := keyOf(r)
	p, ok := c.predicted[k]
	if !ok {
		p = keyOf(canonRule(c.fam, r))
		c.predicted[k] = p
	}
	return p
}

// plan computes the restore input that makes table have equal want; nil when
// nothing differs. summary says what changes, for logs and errors. Steps:
// the chains to rewrite, the stale chains to remove, the jumps to delete
// and those to add; then one restore transaction in that order.
func (c *Controller) plan(table string, want *desiredTable, have *savedTable) (input []byte, summary string) {
	var p tablePlan
	c.planChains(&p, table, want, have)
	present := c.planJumpDeletes(&p, want, have)
	planJumpAdds(&p, want, present)
	if len(p.why) == 0 {
		return nil, ""
	}
	return p.render(table), strings.Join(p.why, "; ")
}

// tablePlan is the restore input of one table being built.
type tablePlan struct {
	declare, stale []string     // chains declared (flushed): rewritten, stale
	adds           bytes.Buffer // rules of the rewritten chains
	delLines       bytes.Buffer // jumps deleted
	jumpLines      bytes.Buffer // jumps added
	why            []string     // summary
}

// jumpKey is a jump from a chain meshd does not own into a meshd chain.
type jumpKey struct{ from, to string }

// planChains declares and refills the desired chains that differ, and
// declares the owned chains no longer desired for removal.
func (c *Controller) planChains(p *tablePlan, table string, want *desiredTable, have *savedTable) {
	for _, ch := range want.chains {
		if have.exists[ch.Name] && c.chainMatches(table, ch, have.rules[ch.Name]) {
			continue
		}
		p.declare = append(p.declare, ch.Name)
		for _, r := range ch.Rules {
			writeLine(&p.adds, []string{"-A", ch.Name}, r)
		}
	}
	if len(p.declare) > 0 {
		p.why = append(p.why, "rewrite "+strings.Join(p.declare, ","))
	}
	for _, name := range have.chains {
		if c.owned(name) && want.byName[name] == nil {
			p.stale = append(p.stale, name)
		}
	}
	if len(p.stale) > 0 {
		p.why = append(p.why, "remove "+strings.Join(p.stale, ","))
	}
}

// planJumpDeletes keeps one of every desired jump from chains meshd does not
// own into meshd chains and deletes the rest; it returns the jumps kept.
func (c *Controller) planJumpDeletes(p *tablePlan, want *desiredTable, have *savedTable) map[jumpKey]bool {
	present := map[jumpKey]bool{}
	var dels []string
	for _, from := range have.chains {
		if c.owned(from) {
			continue
		}
		for _, rk := range have.rules[from] {
			toks := rk.tokens()
			to := target(toks)
			if to == "" || !c.owned(to) {
				continue
			}
			jk := jumpKey{from, to}
			if len(toks) == 2 && toks[0] == "-j" && want.byName[to] != nil && wantsJump(want.jumps, from, to) && !present[jk] {
				present[jk] = true
				continue
			}
			writeLine(&p.delLines, []string{"-D", from}, toks)
			dels = append(dels, from+"->"+to)
		}
	}
	if len(dels) > 0 {
		p.why = append(p.why, "delete jumps "+strings.Join(dels, ","))
	}
	return present
}

// planJumpAdds adds the desired jumps that are not present: inserts in
// reverse so that the first configured ends up first, then appends.
func planJumpAdds(p *tablePlan, want *desiredTable, present map[jumpKey]bool) {
	var added []string
	for i := len(want.jumps) - 1; i >= 0; i-- {
		j := want.jumps[i]
		if !j.Insert || present[jumpKey{j.From, j.To}] {
			continue
		}
		writeLine(&p.jumpLines, []string{"-I", j.From, "1", "-j", j.To}, nil)
		added = append(added, j.From+"->"+j.To)
	}
	for _, j := range want.jumps {
		if j.Insert || present[jumpKey{j.From, j.To}] {
			continue
		}
		writeLine(&p.jumpLines, []string{"-A", j.From, "-j", j.To}, nil)
		added = append(added, j.From+"->"+j.To)
	}
	if len(added) > 0 {
		p.why = append(p.why, "add jumps "+strings.Join(added, ","))
	}
}

// render is the restore transaction: declare, delete jumps, fill chains,
// add jumps, delete the stale chains.
func (p *tablePlan) render(table string) []byte {
	var b bytes.Buffer
	b.WriteString("*" + table + "\n")
	for _, name := range append(p.declare, p.stale...) {
		b.WriteString(":" + name + " - [0:0]\n")
	}
	b.Write(p.delLines.Bytes())
	b.Write(p.adds.Bytes())
	b.Write(p.jumpLines.Bytes())
	for _, name := range p.stale {
		b.WriteString("-X " + name + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

func wantsJump(jumps []Jump, from, to string) bool {
	for _, j := range jumps {
		if j.From == from && j.To == to {
			return true
		}
	}
	return false
}

func (c *Controller) chainMatches(table string, ch Chain, have []ruleKey) bool {
	if len(have) != len(ch.Rules) {
		return false
	}
	for i, r := range ch.Rules {
		if c.expected(table, r) != have[i] {
			return false
		}
	}
	return true
}

// prune forgets renderings of rules that are no longer desired.
func (c *Controller) prune(desired map[string]*desiredTable) {
	all := map[ruleKey]bool{}
	for table, m := range c.learned {
		want := map[ruleKey]bool{}
		if d := desired[table]; d != nil {
			for _, ch := range d.chains {
				for _, r := range ch.Rules {
					want[keyOf(r)] = true
				}
			}
		}
		for k := range m {
			if !want[k] {
				delete(m, k)
			}
		}
		if len(m) == 0 {
			delete(c.learned, table)
		}
	}
	if len(c.predicted) == 0 {
		return
	}
	for _, d := range desired {
		for _, ch := range d.chains {
			for _, r := range ch.Rules {
				all[keyOf(r)] = true
			}
		}
	}
	for k := range c.predicted {
		if !all[k] {
			delete(c.predicted, k)
		}
	}
}

// learn reads back the tables just written and remembers how the kernel
// prints each desired rule, so the next Set compares against that.
func (c *Controller) learn(desired map[string]*desiredTable, written []string) error {
	kernel, err := c.read()
	if err != nil {
		return fmt.Errorf("reading back what was written: %w", err)
	}
	for _, table := range written {
		want, have := desired[table], kernel[table]
		if want == nil {
			continue
		}
		if have == nil {
			return fmt.Errorf("reading back %s table %s: it is missing after the write", c.fam, table)
		}
		for _, ch := range want.chains {
			got := have.rules[ch.Name]
			if len(got) != len(ch.Rules) {
				c.log.Warn("kernel shows a different number of rules than written", "table", table, "chain", ch.Name, "written", len(ch.Rules), "read", len(got))
				continue
			}
			for i, r := range ch.Rules {
				k := keyOf(r)
				if got[i] == c.predict(r) {
					if c.learned[table] != nil {
						delete(c.learned[table], k)
					}
					continue
				}
				if target(r) != target(got[i].tokens()) {
					c.log.Warn("kernel shows another rule than written", "table", table, "chain", ch.Name, "position", i+1, "written", strings.Join(r, " "), "read", strings.Join(got[i].tokens(), " "))
					continue
				}
				if c.learned[table] == nil {
					c.learned[table] = map[ruleKey]ruleKey{}
				}
				c.learned[table][k] = got[i]
			}
		}
	}
	return nil
}

// Cleanup removes every chain with the prefix and every rule that jumps to
// one, in all tables.
func (c *Controller) Cleanup() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.verified = false
	kernel, err := c.read()
	if err != nil {
		return err
	}
	c.learned = map[string]map[ruleKey]ruleKey{}
	var errs []error
	for _, table := range slices.Sorted(maps.Keys(kernel)) {
		input, summary := c.plan(table, &desiredTable{byName: map[string]*Chain{}}, kernel[table])
		if input == nil {
			continue
		}
		c.log.Info("cleaning up iptables", "table", table, "changes", summary)
		if err := c.restore(input); err != nil {
			errs = append(errs, fmt.Errorf("cleaning up %s table %s (%s): %w", c.fam, table, summary, err))
		}
	}
	return errors.Join(errs...)
}
