// Package archtest holds the tests that enforce meshd's architecture, so
// docs/architecture.md stays true: the import rules of the layers (the
// planner imports only the standard library and wgtypes; the executors
// import nothing of meshd or Kubernetes; the mirror and the Kubernetes
// layer use no executor; cmd/ makes no kernel calls itself) and the rule
// that every package states in its doc what it does and what it leaves to
// others.
//
// Out of scope: style and complexity rules (golangci-lint, .golangci.yml)
// and behaviour (the packages' own tests and e2e/).
package archtest
