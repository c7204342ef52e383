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

missing=()
for cmd in "${!need[@]}"; do
	if ! command -v "$cmd" >/dev/null 2>&1 && [[ ! -x "/usr/sbin/$cmd" && ! -x "/sbin/$cmd" ]]; then
		missing+=("${need[$cmd]}")
	fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi

# de-duplicate
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo ">> installing missing packages: ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
	echo "need root to install packages" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
