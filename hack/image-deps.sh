#!/usr/bin/env bash
# Install the Debian packages `make image` needs, if any is missing:
#
#   podman      builds the Dockerfile into the local container store (its
#               build is buildah's library; no Docker engine needed)
#   runc        podman's runtime here (crun fails on hybrid cgroups)
#   mmdebstrap  builds the runtime base image from Debian packages (no
#               registry can be reached)
#
# --no-install-recommends keeps them small. Idempotent and quick when
# everything is present.
set -euo pipefail

declare -A need=(
	[podman]=podman
	[runc]=runc
	[mmdebstrap]=mmdebstrap
)

missing=()
for cmd in "${!need[@]}"; do
	if ! command -v "$cmd" >/dev/null 2>&1 && [[ ! -x "/usr/sbin/$cmd" ]]; then
		missing+=("${need[$cmd]}")
	fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo ">> installing missing packages: ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
	echo "need root to install packages (or install them yourself: ${missing[*]})" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# apt's own lock serialises concurrent installs; wait for it rather than fail.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}"
