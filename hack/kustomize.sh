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
# shellcheck source=hack/lib.sh
source "$ROOT/hack/lib.sh"

go_install_once "$BIN" kustomize "$KUSTOMIZE_VERSION" sigs.k8s.io/kustomize/kustomize/v5 "-s -w"

if [[ "${1:-}" == "--bin" ]]; then
	echo "$KUSTOMIZE"
	exit 0
fi

cd "$ROOT"
"$KUSTOMIZE" build "${1:-manifests/}"
