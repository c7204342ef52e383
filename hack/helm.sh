#!/usr/bin/env bash
# Builds helm (HELM_VERSION, default v3.22.0) ONCE from the Go module proxy
# into ${MESHD_CACHE:-$HOME/.cache/meshd}/bin/helm, then lints the chart and
# renders it:
#
#   helm lint charts/meshd                      (default values)
#   helm lint charts/meshd --set <every option on>
#   helm template meshd charts/meshd -n meshd-system [ARGS...]   -> stdout
#
# Usage: hack/helm.sh [extra helm template args, e.g. --set userspaceSidecar=true]
#        hack/helm.sh --bin     # only build (if needed) and print the binary path
# Building takes several minutes of CPU the first time; later runs reuse it.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${MESHD_CACHE:-$HOME/.cache/meshd}/bin"
HELM="$BIN/helm"
# shellcheck source=hack/lib.sh
source "$ROOT/hack/lib.sh"

go_install_once "$BIN" helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"

if [[ "${1:-}" == "--bin" ]]; then
	echo "$HELM"
	exit 0
fi

cd "$ROOT"
# lint output goes to stderr so stdout is only the rendered YAML.
"$HELM" lint charts/meshd >&2
"$HELM" lint charts/meshd >&2 \
	--set userspaceSidecar=true,podMonitor.enabled=true,mirror.enabled=true,mcsCRDs.install=true,mcsDNS.enabled=true,namespace.create=true,clusterLinks.enabled=true \
	--set metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true,updateStrategy.maxUnavailable=10% \
	--set 'serviceCIDRs={10.96.0.0/12}' --set 'meshCIDRs={10.4.0.0/16,fd6d:6573:6864::/64}'
# The chart cannot read files outside its directory: its dashboard is a copy.
if ! cmp -s docs/grafana-dashboard.json charts/meshd/dashboards/meshd.json; then
	echo "hack/helm.sh: charts/meshd/dashboards/meshd.json differs from docs/grafana-dashboard.json;" >&2
	echo "  cp docs/grafana-dashboard.json charts/meshd/dashboards/meshd.json" >&2
	exit 1
fi
# The MCS CRDs of the chart (mcsCRDs.install) are copies of the component's.
for f in manifests/components/mcs-crds/*_*.yaml; do
	if ! cmp -s "$f" "charts/meshd/files/mcs-crds/$(basename "$f")"; then
		echo "hack/helm.sh: charts/meshd/files/mcs-crds/$(basename "$f") differs from $f;" >&2
		echo "  cp manifests/components/mcs-crds/*_*.yaml charts/meshd/files/mcs-crds/" >&2
		exit 1
	fi
done
# values.schema.json and the templates' checks refuse unknown keys and values
# meshd refuses (cmd/meshd TestChartRefusesWhatMeshdRefuses has more).
for bad in meshGranularity=locaton wireguard=kernal meshGranuarity=full mtu=1000 port=51821 interface=.. \
	'serviceCIDRs={999.1.1.1/8}' 'serviceCIDRs={10.4.0.0/16}' 'meshCIDRs={10.4.0.0/16,10.5.0.0/16}'; do
	if "$HELM" template meshd charts/meshd --kube-version "${KUBE_VERSION:-v1.36.3}" --set "$bad" >/dev/null 2>&1; then
		echo "hack/helm.sh: values.schema.json accepts --set $bad" >&2
		exit 1
	fi
done
# The chart has a kubeVersion; render for the testbed's Kubernetes.
"$HELM" template meshd charts/meshd --namespace meshd-system --kube-version "${KUBE_VERSION:-v1.36.3}" "$@"
