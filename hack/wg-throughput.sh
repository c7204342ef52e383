#!/usr/bin/env bash
# Measures TCP throughput (iperf3) through two in-process meshd WireGuard
# devices versus two standalone wireguard-go processes, alternating rounds in
# the same run, over two fresh network namespaces joined by a veth
# (198.51.100.1/2, tunnel 10.77.0.1/2). Needs root, /dev/net/tun and iperf3.
# Everything it creates (namespaces, processes, sockets) is removed when it
# ends. Tune with SECONDS_PER_RUN (default 5) and ROUNDS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v iperf3 >/dev/null || { echo "iperf3 is required (apt-get install -y --no-install-recommends iperf3)" >&2; exit 1; }
MESHD_WG_THROUGHPUT=1 \
MESHD_WG_THROUGHPUT_SECONDS="${SECONDS_PER_RUN:-5}" \
MESHD_WG_THROUGHPUT_ROUNDS="${ROUNDS:-3}" \
	go test -count=1 -run '^TestThroughput$' -v ./pkg/wg | grep -E 'Gbit/s|ratio|^(--- |ok|FAIL|PASS)'
