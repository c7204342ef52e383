#!/usr/bin/env bash
# Install the Debian packages the e2e testbed and `make demo` need, if any is
# missing. Idempotent and quick when everything is present.
#
#   iptables wireguard-tools etcd-server iproute2 iputils-ping curl iperf3
#   bind9-dnsutils (dig: meshd dns answers queried from a pod)
#
# --no-install-recommends matters: without it wireguard-tools pulls in systemd
# and a kernel image.
set -euo pipefail

# command -> package
declare -A need=(
	[iptables]=iptables
	[wg]=wireguard-tools
	[etcd]=etcd-server
	[ip]=iproute2
	[bridge]=iproute2
	[ping]=iputils-ping
	[curl]=curl
	[iperf3]=iperf3
	[dig]=bind9-dnsutils
	[unshare]=util-linux
	[nsenter]=util-linux
	[flock]=util-linux
)

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
install_missing need
