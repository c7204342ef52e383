#!/usr/bin/env bash
# Builds kustomize (KUSTOMIZE_VERSION, default v5.8.0) ONCE from the Go module
# proxy into ${MESHD_CACHE:-$HOME/.cache/meshd}/bin/kustomize, then renders
# the install:
#
#   kustomize build manifests/      -> stdout
#
# Usage: hack/kustomize.sh [DIR]   # DIR defaults to manifests/ (e.g. an overlay)
#        hack/kustomize.sh --bin   # only build (if needed) and print the binary path
# Building takes a few minutes of CPU the first time; later runs reuse it.
set -euo pipefail

KUSTOMIZE_VERSION=${KUSTOMIZE_VERSION:-v5.8.0}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${MESHD_CACHE:-$HOME/.cache/meshd}/bin"
KUSTOMIZE="$BIN/kustomize"
STAMP="$BIN/.kustomize-$KUSTOMIZE_VERSION"

build() {
	mkdir -p "$BIN"
	exec 9>"$BIN/.kustomize.lock"
	flock 9
	if [[ -x "$KUSTOMIZE" && -f "$STAMP" ]]; then
		return
	fi
	echo ">> building kustomize $KUSTOMIZE_VERSION into $KUSTOMIZE (once)" >&2
	rm -f "$BIN"/.kustomize-v*
	(cd "$BIN" && GOWORK=off GOFLAGS= GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0 GOBIN="$BIN" \
		go install -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION")
	touch "$STAMP"
}

if [[ ! -x "$KUSTOMIZE" || ! -f "$STAMP" ]]; then
	build
fi

if [[ "${1:-}" == "--bin" ]]; then
	echo "$KUSTOMIZE"
	exit 0
fi

cd "$ROOT"
"$KUSTOMIZE" build "${1:-manifests/}"
