package archtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "meshd.io/meshd"

// pkg is what `go list -json` says about one package of the module.
type pkg struct {
	ImportPath string
	Dir        string
	Name       string
	GoFiles    []string
	Imports    []string // direct, non-test
	Deps       []string // transitive, non-test
	Error      *struct{ Err string }
}

var (
	listOnce sync.Once
	listed   []pkg
	listErr  error
)

// packages lists every package of the module: ./... and, with the e2e build
// tag, ./e2e/... (the testbed and its commands).
func packages(t *testing.T) []pkg {
	t.Helper()
	listOnce.Do(func() {
		seen := map[string]bool{}
		for _, args := range [][]string{{"./..."}, {"-tags", "e2e", "./e2e/..."}} {
			cmd := exec.Command("go", append([]string{"list", "-e", "-json=ImportPath,Dir,Name,GoFiles,Imports,Deps,Error"}, args...)...)
			cmd.Dir = "../.."
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				listErr = fmt.Errorf("go list %v: %w\n%s", args, err, stderr.String())
				return
			}
			dec := json.NewDecoder(bytes.NewReader(out))
			for dec.More() {
				var p pkg
				if err := dec.Decode(&p); err != nil {
					listErr = err
					return
				}
				if len(p.GoFiles) > 0 && !seen[p.ImportPath] {
					seen[p.ImportPath] = true
					listed = append(listed, p)
				}
			}
		}
	})
	if listErr != nil {
		t.Fatal(listErr)
	}
	if len(listed) < 5 {
		t.Fatalf("go list found %d packages; is the test run inside the module?", len(listed))
	}
	return listed
}

// under reports whether p is the package dir (relative to the module) or
// below it.
func (p pkg) under(dir string) bool {
	return p.ImportPath == module+"/"+dir || strings.HasPrefix(p.ImportPath, module+"/"+dir+"/")
}

// isStd reports whether an import path is in the standard library (its
// first element has no dot), as `go list` treats it.
func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// rule is one import rule: for the packages under one of dirs, every import
// for which forbidden returns a reason is a violation.
type rule struct {
	name       string
	dirs       []string
	transitive bool // check Deps, not only the direct Imports
	forbidden  func(imp string) (reason string, bad bool)
}

// kernelPackages are the libraries that touch the kernel (netlink, WireGuard
// devices, iptables); only the executors may import them.
var kernelPackages = []string{
	"github.com/vishvananda/netlink",
	"github.com/vishvananda/netns",
	"github.com/mdlayher/netlink",
	"github.com/coreos/go-iptables",
	"golang.zx2c4.com/wireguard/wgctrl",
	"golang.zx2c4.com/wireguard/device",
	"golang.zx2c4.com/wireguard/tun",
	"golang.zx2c4.com/wireguard/conn",
	"golang.zx2c4.com/wireguard/ipc",
}

const wgtypes = "golang.zx2c4.com/wireguard/wgctrl/wgtypes"

func hasPathPrefix(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

var executors = []string{"pkg/wg", "pkg/route", "pkg/iptables", "pkg/probe"}

// isExecutorInternal reports whether imp is an internal package of an
// executor (pkg/wg/internal/...), which only that executor can import.
func isExecutorInternal(imp string) bool {
	for _, e := range executors {
		if strings.HasPrefix(imp, module+"/"+e+"/internal/") {
			return true
		}
	}
	return false
}

var rules = []rule{{
	name: "pkg/mesh is a pure planner: it imports only the standard library and " + wgtypes,
	dirs: []string{"pkg/mesh"},
	forbidden: func(imp string) (string, bool) {
		if isStd(imp) || imp == wgtypes {
			return "", false
		}
		return "not the standard library or wgtypes", true
	},
}, {
	name:       "the executors import nothing of meshd or Kubernetes",
	dirs:       executors,
	transitive: true,
	forbidden: func(imp string) (string, bool) {
		switch {
		case isExecutorInternal(imp):
			return "", false // an executor's own parts: Go lets only its subtree import them
		case hasPathPrefix(imp, module):
			return "a meshd package", true
		case strings.HasPrefix(imp, "k8s.io/") || strings.HasPrefix(imp, "sigs.k8s.io/"):
			return "a Kubernetes package", true
		}
		return "", false
	},
}, {
	name:       "pkg/mirror uses no executor",
	dirs:       []string{"pkg/mirror"},
	transitive: true,
	forbidden: func(imp string) (string, bool) {
		for _, e := range executors {
			if hasPathPrefix(imp, module+"/"+e) {
				return "an executor", true
			}
		}
		return "", false
	},
}, {
	name:       "the Kubernetes layer (pkg/k8s/..., pkg/clusterlink, pkg/dnscache) uses no executor and no kernel package",
	dirs:       []string{"pkg/k8s", "pkg/clusterlink", "pkg/dnscache"},
	transitive: true,
	forbidden: func(imp string) (string, bool) {
		if imp == wgtypes {
			return "", false // key types, no kernel access
		}
		for _, e := range executors {
			if hasPathPrefix(imp, module+"/"+e) {
				return "an executor", true
			}
		}
		for _, k := range kernelPackages {
			if hasPathPrefix(imp, k) {
				return "a kernel package", true
			}
		}
		return "", false
	},
}, {
	name: "cmd/ is wiring: kernel calls live in the executors",
	dirs: []string{"cmd"},
	forbidden: func(imp string) (string, bool) {
		if imp == wgtypes {
			return "", false // key and config types, no kernel access
		}
		for _, k := range kernelPackages {
			if hasPathPrefix(imp, k) {
				return "a kernel package (move the call into pkg/wg, pkg/route or pkg/iptables)", true
			}
		}
		if imp == "golang.org/x/sys/unix" {
			return "raw system calls (move the call into an executor)", true
		}
		return "", false
	},
}, {
	name: "pkg/mcsdns (meshd dns) uses no other meshd package, and of CoreDNS only its server and plugin API: no bundled plugin, no coremain",
	dirs: []string{"pkg/mcsdns"},
	forbidden: func(imp string) (string, bool) {
		switch {
		case isExecutorInternal(imp):
			return "", false // an executor's own parts: Go lets only its subtree import them
		case hasPathPrefix(imp, module):
			return "a meshd package", true
		case imp == "github.com/coredns/coredns/core/dnsserver", imp == "github.com/coredns/coredns/plugin":
			return "", false
		case hasPathPrefix(imp, "github.com/coredns"):
			return "a CoreDNS package beyond core/dnsserver and plugin (every plugin imported grows the binary)", true
		}
		return "", false
	},
}, {
	name:       "nothing links CoreDNS's plugin bundle or its command line",
	dirs:       []string{"cmd", "pkg"},
	transitive: true,
	forbidden: func(imp string) (string, bool) {
		for _, p := range []string{"github.com/coredns/coredns/core/plugin", "github.com/coredns/coredns/coremain"} {
			if hasPathPrefix(imp, p) {
				return "CoreDNS's all-plugins bundle or coremain (import only the plugins used)", true
			}
		}
		return "", false
	},
}}

// TestImportRules checks the layering that docs/architecture.md describes.
func TestImportRules(t *testing.T) {
	pkgs := packages(t)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			matched := 0
			for _, p := range pkgs {
				if !slices.ContainsFunc(r.dirs, p.under) {
					continue
				}
				matched++
				imps, how := p.Imports, "imports"
				if r.transitive {
					imps, how = p.Deps, "depends on"
				}
				for _, imp := range imps {
					if reason, bad := r.forbidden(imp); bad {
						t.Errorf("%s %s %q: %s (rule: %s)", p.ImportPath, how, imp, reason, r.name)
					}
				}
			}
			if matched == 0 {
				t.Fatalf("no package under %v: the rule guards nothing (moved? update the rule)", r.dirs)
			}
		})
	}
}

// TestRulesCatch makes sure each rule rejects what it is meant to reject
// (and lets through what it allows), so a rule that silently matches
// nothing cannot pass TestImportRules.
func TestRulesCatch(t *testing.T) {
	cases := map[string]struct{ bad, good []string }{
		rules[0].name: {bad: []string{"github.com/vishvananda/netlink", "k8s.io/api/core/v1", module + "/pkg/k8s"}, good: []string{"net/netip", wgtypes}},
		rules[1].name: {bad: []string{module + "/pkg/mesh", "k8s.io/client-go/kubernetes", "sigs.k8s.io/yaml", module + "/pkg/k8s/internal/x", module + "/internal/x"}, good: []string{"github.com/vishvananda/netlink", "os/exec", module + "/pkg/wg/internal/initiation"}},
		rules[2].name: {bad: []string{module + "/pkg/wg", module + "/pkg/route", module + "/pkg/iptables"}, good: []string{module + "/pkg/k8s", module + "/pkg/routeX"}},
		rules[3].name: {bad: []string{module + "/pkg/wg", module + "/pkg/probe", "github.com/vishvananda/netlink", "golang.zx2c4.com/wireguard/device"}, good: []string{wgtypes, module + "/pkg/mesh", module + "/pkg/k8s/convert", "k8s.io/client-go/kubernetes"}},
		rules[4].name: {bad: []string{"github.com/vishvananda/netlink", "github.com/vishvananda/netlink/nl", "golang.zx2c4.com/wireguard/wgctrl", "golang.org/x/sys/unix", "github.com/coreos/go-iptables/iptables"}, good: []string{wgtypes, module + "/pkg/route"}},
		rules[5].name: {bad: []string{module + "/pkg/k8s", "github.com/coredns/coredns/plugin/forward", "github.com/coredns/coredns/core/plugin", "github.com/coredns/caddy"}, good: []string{"github.com/coredns/coredns/core/dnsserver", "github.com/coredns/coredns/plugin", "github.com/miekg/dns", "k8s.io/client-go/tools/cache"}},
		rules[6].name: {bad: []string{"github.com/coredns/coredns/core/plugin", "github.com/coredns/coredns/coremain"}, good: []string{"github.com/coredns/coredns/core/dnsserver", "github.com/coredns/coredns/core/pluginx"}},
	}
	if len(cases) != len(rules) {
		t.Fatalf("%d rules, %d checked here", len(rules), len(cases))
	}
	for _, r := range rules {
		c := cases[r.name]
		for _, imp := range c.bad {
			if _, bad := r.forbidden(imp); !bad {
				t.Errorf("rule %q lets %q through", r.name, imp)
			}
		}
		for _, imp := range c.good {
			if reason, bad := r.forbidden(imp); bad {
				t.Errorf("rule %q rejects %q: %s", r.name, imp, reason)
			}
		}
	}
}

// Package docs: every package's doc comment says what the package does
// (it starts "Package <name>", or "Command <name>" for a main package) and
// what it leaves to others, in a paragraph that starts "Out of scope:".
// Packages whose every file is generated (client-gen, deepcopy) are exempt.
const outOfScope = "Out of scope:"

// pendingDocs are packages whose doc is owned by a parallel change; each
// entry names it. The test fails once such a doc complies, so the entry is
// removed then.
var pendingDocs = map[string]string{}

func TestPackageDocs(t *testing.T) {
	for _, p := range packages(t) {
		doc, generated, err := packageDoc(p)
		if err != nil {
			t.Error(err)
			continue
		}
		if generated {
			continue
		}
		problem := docProblem(p, doc)
		if owner, ok := pendingDocs[p.ImportPath]; ok {
			if problem == "" {
				t.Errorf("%s: its doc now complies; remove it from pendingDocs", p.ImportPath)
			} else {
				t.Logf("%s: %s (pending: %s)", p.ImportPath, problem, owner)
			}
			continue
		}
		if problem != "" {
			t.Errorf("%s (%s): %s", p.ImportPath, p.Dir, problem)
		}
	}
}

// docProblem says what is missing from a package's doc, "" if nothing.
func docProblem(p pkg, doc string) string {
	want := "Package " + p.Name + " "
	if p.Name == "main" {
		want = "Command " + filepath.Base(p.ImportPath) + " "
	}
	switch {
	case doc == "":
		return fmt.Sprintf("no package doc comment; write one starting %q with a paragraph starting %q", want, outOfScope)
	case !strings.HasPrefix(doc, want):
		return fmt.Sprintf("the package doc starts %q, want %q", firstLine(doc), want)
	}
	for _, para := range strings.Split(doc, "\n\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(para), outOfScope); ok && strings.TrimSpace(rest) != "" {
			return ""
		}
	}
	return fmt.Sprintf("the package doc has no paragraph starting %q that says what the package leaves to others", outOfScope)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// packageDoc returns the package's doc comment (from whichever file has
// one; two are an error) and whether every file is generated.
func packageDoc(p pkg) (doc string, generated bool, err error) {
	fset := token.NewFileSet()
	generated = true
	var from string
	for _, name := range p.GoFiles {
		path := filepath.Join(p.Dir, name)
		f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return "", false, err
		}
		generated = generated && ast.IsGenerated(f)
		if f.Doc == nil {
			continue
		}
		if from != "" {
			return "", false, fmt.Errorf("%s: package doc in both %s and %s; keep one", p.ImportPath, from, name)
		}
		doc, from = f.Doc.Text(), name
	}
	return doc, generated, nil
}
