#!/usr/bin/env bash
# Build Kubernetes binaries (default: kube-apiserver and kubectl) ONCE into a
# cache directory outside the repository, keyed by version:
#
#   ${MESHD_CACHE:-$HOME/.cache/meshd}/kube-${KUBE_VERSION}/<binary>
#
# They are built from a throw-away wrapper module in that cache directory that
# requires k8s.io/kubernetes and replaces every ./staging module with its
# published v0.X.Y version (see /work/shared/TESTBED.md). Nothing is written
# into the repository. Safe to run concurrently (flock).
#
# Usage: hack/kube-binaries.sh [kube-apiserver] [kubectl] [kube-proxy] ...
#        hack/kube-binaries.sh --print-dir    # only print the cache dir
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
CACHE=${MESHD_CACHE:-$HOME/.cache/meshd}
DIR="$CACHE/kube-$KUBE_VERSION"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "$DIR"
	exit 0
fi

BINS=("$@")
if [[ ${#BINS[@]} -eq 0 ]]; then
	BINS=(kube-apiserver kubectl)
fi

# all_built sets missing to the BINS not built yet; it is true when none is.
all_built() {
	local b
	missing=()
	for b in "${BINS[@]}"; do
		[[ -x "$DIR/$b" ]] || missing+=("$b")
	done
	[[ ${#missing[@]} -eq 0 ]]
}

if all_built; then
	echo "$DIR"
	exit 0
fi

mkdir -p "$DIR/src"
exec 9>"$DIR/.lock"
flock 9

# Re-check after taking the lock: another run may have built them meanwhile.
if all_built; then
	echo "$DIR"
	exit 0
fi

export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=${GOTOOLCHAIN:-local}
staging="v0.${KUBE_VERSION#v1.}"
src="$DIR/src"

if [[ ! -f "$src/go.sum" ]]; then
	echo ">> preparing wrapper module for k8s.io/kubernetes $KUBE_VERSION in $src" >&2
	kgomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	[[ -f "$kgomod" ]] || { echo "cannot find go.mod of k8s.io/kubernetes@$KUBE_VERSION" >&2; exit 1; }
	{
		echo "module meshd.io/kube-binaries"
		echo
		echo "go 1.26"
		echo
		echo "require k8s.io/kubernetes $KUBE_VERSION"
		echo
		echo "replace ("
		# lines like: k8s.io/api => ./staging/src/k8s.io/api
		awk '$2 == "=>" && $3 ~ /^\.\/staging\// { printf "\t%s => %s '"$staging"'\n", $1, $1 }' "$kgomod"
		echo ")"
	} >"$src/go.mod.tmp"
	mv "$src/go.mod.tmp" "$src/go.mod"
	n=$(grep -c '=>' "$src/go.mod" || true)
	echo ">> $n staging replaces" >&2
	[[ "$n" -gt 10 ]] || { echo "too few staging replaces parsed from $kgomod" >&2; exit 1; }
fi

# One tools file importing every command we may build, so `go mod tidy`
# records all their dependencies once.
cat >"$src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO

cd "$src"
if [[ ! -f go.sum ]] || ! grep -q 'k8s.io/kubernetes' go.sum; then
	echo ">> go mod tidy" >&2
	go mod tidy
fi
for b in "${missing[@]}"; do
	echo ">> building $b ($KUBE_VERSION) -> $DIR/$b" >&2
	start=$(date +%s)
	go build -trimpath -ldflags "-s -w" -o "$DIR/$b.tmp" "k8s.io/kubernetes/cmd/$b"
	mv "$DIR/$b.tmp" "$DIR/$b"
	echo ">> built $b in $(( $(date +%s) - start ))s" >&2
done
echo "$DIR"
