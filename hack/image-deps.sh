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

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
install_missing need
