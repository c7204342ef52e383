package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// Current reads the kernel's rules now and returns, in iptables-save form,
// what concerns meshd: each table header with meshd's chains, their rules
// and every jump into them. It is for diagnostics (meshd's debug endpoint)
// and changes nothing; the reconcile never calls it.
func (c *Controller) Current() ([]string, error) {
	out, err := c.run.Save("")
	if err != nil {
		return nil, fmt.Errorf("reading %s iptables: %w", c.fam, err)
	}
	var lines []string
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "*"):
			table = l
		case strings.HasPrefix(l, ":"+c.prefix),
			strings.HasPrefix(l, "-A "+c.prefix),
			strings.HasPrefix(l, "-A ") && (strings.Contains(l, " -j "+c.prefix) || strings.Contains(l, " -g "+c.prefix)):
			if table != "" {
				lines = append(lines, table)
				table = ""
			}
			lines = append(lines, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s iptables-save output: %w", c.fam, err)
	}
	return lines, nil
}
