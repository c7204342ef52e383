package iptables

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"
)

// ruleKey is a rule's arguments joined by "\x00": a comparable form of a
// token list. Tokens never contain NUL (validate rejects it).
type ruleKey string

func keyOf(toks []string) ruleKey { return ruleKey(strings.Join(toks, "\x00")) }

func (k ruleKey) tokens() []string {
	if k == "" {
		return nil
	}
	return strings.Split(string(k), "\x00")
}

// savedTable is one table as iptables-save printed it.
type savedTable struct {
	chains []string // in the order printed
	exists map[string]bool
	rules  map[string][]ruleKey
}

func newSavedTable() *savedTable {
	return &savedTable{exists: map[string]bool{}, rules: map[string][]ruleKey{}}
}

func (t *savedTable) addChain(name string) {
	if !t.exists[name] {
		t.exists[name] = true
		t.chains = append(t.chains, name)
	}
}

// parseSave parses iptables-save output into tables. With a prefix, it keeps
// of the chains that do not start with it only the rules that mention it:
// the rest (kube-proxy's thousands of rules, say) is never of interest.
func parseSave(data []byte, prefix string) (map[string]*savedTable, error) {
	tables := map[string]*savedTable{}
	var cur *savedTable
	n := 0
	for len(data) > 0 {
		n++
		var raw []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			raw, data = data[:i], data[i+1:]
		} else {
			raw, data = data, nil
		}
		line := bytes.TrimSpace(raw)
		switch {
		case len(line) == 0 || line[0] == '#':
		case line[0] == '*':
			name := string(line[1:])
			cur = tables[name]
			if cur == nil {
				cur = newSavedTable()
				tables[name] = cur
			}
		case string(line) == "COMMIT":
			cur = nil
		case cur == nil:
			return nil, fmt.Errorf("line %d: %q outside a table", n, line)
		case line[0] == ':':
			name, _, _ := bytes.Cut(line[1:], []byte(" "))
			cur.addChain(string(name))
		case bytes.HasPrefix(line, []byte("-A ")):
			chain, spec, _ := bytes.Cut(line[3:], []byte(" "))
			if prefix != "" && !bytes.HasPrefix(chain, []byte(prefix)) && !bytes.Contains(spec, []byte(prefix)) {
				continue
			}
			key, err := specKey(spec)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			c := string(chain)
			cur.addChain(c)
			cur.rules[c] = append(cur.rules[c], key)
		default:
			return nil, fmt.Errorf("line %d: unexpected %q", n, line)
		}
	}
	return tables, nil
}

// specKey returns the key of a rule as iptables-save prints it.
func specKey(spec []byte) (ruleKey, error) {
	if !bytes.ContainsAny(spec, "\"\\\t") && !bytes.Contains(spec, []byte("  ")) {
		return ruleKey(bytes.ReplaceAll(bytes.TrimSpace(spec), []byte(" "), []byte("\x00"))), nil
	}
	toks, err := splitLine(string(spec))
	if err != nil {
		return "", err
	}
	return keyOf(toks), nil
}

// splitLine splits a line like iptables-restore does: on blanks, with
// double-quoted parts and backslash escapes inside quotes.
func splitLine(line string) ([]string, error) {
	var toks []string
	var b strings.Builder
	inTok, quoted, escaped := false, false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case escaped:
			b.WriteByte(c)
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
			inTok = true
		case !quoted && (c == ' ' || c == '\t'):
			if inTok {
				toks = append(toks, b.String())
				b.Reset()
				inTok = false
			}
		default:
			b.WriteByte(c)
			inTok = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if inTok {
		toks = append(toks, b.String())
	}
	return toks, nil
}

// quote renders one token for iptables-restore input. Any white space is
// quoted: a bare token ending in, say, "\r" would be trimmed off its line.
func quote(tok string) string {
	if tok != "" && !strings.ContainsAny(tok, "\"'\\") && !strings.ContainsFunc(tok, unicode.IsSpace) {
		return tok
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(tok) + `"`
}

// writeLine appends one restore line: the words, then the rule's tokens.
func writeLine(b *bytes.Buffer, words []string, toks []string) {
	for i, w := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(w)
	}
	for _, t := range toks {
		b.WriteByte(' ')
		b.WriteString(quote(t))
	}
	b.WriteByte('\n')
}
