#!/usr/bin/env bash
# make demo / make demo-down.
#
#   hack/demo.sh up     ensure Debian packages and the kube binaries, then
#                       start the e2e testbed (prefix mdemo-, state in
#                       ${MESHD_DEMO_DIR:-/tmp/meshd-demo}) with 3 nodes in 2
#                       locations running meshd, show it working, and leave it
#                       running in the background.
#   hack/demo.sh down   stop and remove it.
#
# Both reuse the Go testbed of the e2e tests (e2e/cmd/testbed). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -ne 0 ]]; then
	echo "demo: needs root (network namespaces)" >&2
	exit 1
fi

case "${1:-}" in
up)
	hack/ensure-deps.sh
	hack/kube-binaries.sh kube-apiserver kubectl >/dev/null
	exec go run -tags e2e ./e2e/cmd/testbed up
	;;
down)
	exec go run -tags e2e ./e2e/cmd/testbed down
	;;
*)
	echo "usage: $0 up|down" >&2
	exit 2
	;;
esac
