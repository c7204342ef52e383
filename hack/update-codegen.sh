#!/usr/bin/env bash
# Regenerates everything derived from pkg/k8s/apis: deepcopy functions, the
# CRD manifests in manifests/crds, and the typed clientset, listers and
# informers in pkg/k8s/client. Run from anywhere: ./hack/update-codegen.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

MODULE="meshd.io/meshd"
APIS_PKG="${MODULE}/pkg/k8s/apis"
CLIENT_PKG="${MODULE}/pkg/k8s/client"
CLIENT_DIR="pkg/k8s/client"
GROUP_VERSIONS=("meshd/v1alpha1")
HEADER=/dev/null

echo "deepcopy (controller-gen object)"
go tool controller-gen object paths=./pkg/k8s/apis/...

echo "CRDs (controller-gen crd) -> manifests/crds"
rm -f manifests/crds/meshd.io_*.yaml
go tool controller-gen crd paths=./pkg/k8s/apis/... output:crd:dir=manifests/crds

inputs=()
for gv in "${GROUP_VERSIONS[@]}"; do
  inputs+=("${APIS_PKG}/${gv}")
done

rm -rf "${CLIENT_DIR}"

echo "clientset (client-gen) -> ${CLIENT_DIR}/clientset"
go tool client-gen \
  --go-header-file "${HEADER}" \
  --clientset-name versioned \
  --input-base "${APIS_PKG}" \
  --input "$(IFS=,; echo "${GROUP_VERSIONS[*]}")" \
  --output-dir "${CLIENT_DIR}/clientset" \
  --output-pkg "${CLIENT_PKG}/clientset"

echo "listers (lister-gen) -> ${CLIENT_DIR}/listers"
go tool lister-gen \
  --go-header-file "${HEADER}" \
  --output-dir "${CLIENT_DIR}/listers" \
  --output-pkg "${CLIENT_PKG}/listers" \
  "${inputs[@]}"

echo "informers (informer-gen) -> ${CLIENT_DIR}/informers"
go tool informer-gen \
  --go-header-file "${HEADER}" \
  --versioned-clientset-package "${CLIENT_PKG}/clientset/versioned" \
  --listers-package "${CLIENT_PKG}/listers" \
  --output-dir "${CLIENT_DIR}/informers" \
  --output-pkg "${CLIENT_PKG}/informers" \
  "${inputs[@]}"

gofmt -s -w pkg/k8s/apis "${CLIENT_DIR}"
echo "done"
