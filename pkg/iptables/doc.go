// Package iptables keeps meshd's iptables (and ip6tables) rules in the kernel
// equal to a desired Config.
//
// meshd's rules live only in chains whose names start with a prefix
// ("MESHD-" by default); built-in chains such as POSTROUTING or FORWARD get
// one plain jump ("-j MESHD-...") each. Everything else in the tables — the
// rules of kube-proxy, of a CNI, of the administrator — is left untouched.
//
// A Controller works on one address family through a Runner, which has only
// two operations: read a table (iptables-save) and apply a batch
// (iptables-restore --noflush). Each Set reads the kernel once, compares the
// rules of meshd's chains with the desired ones, and writes everything that
// differs in one restore transaction per table: changed chains are declared
// (":CHAIN - [0:0]", which flushes just that chain) and refilled, missing
// jumps are added, duplicate or unwanted jumps are deleted, and MESHD- chains
// that are no longer desired (also those left by an earlier run) are unlinked,
// flushed and deleted. When the kernel already matches, Set makes no restore
// call at all. With the nf_tables backend, Set first asks the kernel for its
// ruleset generation (one netlink round trip); if neither it nor the Config
// changed since the kernel last matched, Set reads nothing either.
//
// iptables-save prints rules in a normalized form (it adds /32, inserts
// "-m tcp", renders marks in hex, ...). The Controller predicts that form for
// common rules and, after each write, learns the kernel's exact rendering of
// every rule it wrote, so a rule it cannot predict costs at most one extra
// write per process lifetime.
//
// NewExecRunner finds the iptables binaries of the family and backend and
// reads the iptables version through github.com/coreos/go-iptables, refusing
// a version whose iptables-restore lacks -w. go-iptables' rule operations run
// one iptables process per rule (about 100 s for 4,000 rules with the
// nf_tables backend, against 0.06 s for one restore), so chains and jumps are
// read from one iptables-save and written in the restore batch instead.
//
// Out of scope: which rules meshd wants (pkg/mesh plans them) and anything
// about Kubernetes or meshd's other executors; this package imports nothing of
// meshd or k8s.io.
package iptables
