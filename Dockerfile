# syntax=docker/dockerfile:1
#
# meshd image: the node daemon (meshd) and the CLI (meshctl), plus the tools
# an operator uses inside the pod: wg, ip, iptables/ip6tables (both the nft
# and the legacy backend; meshd --iptables-backend picks one).
#
# Build it with `make image IMAGE=REF` (see docs/install.md, "Building the
# image"). Without a registry (the default), make builds the runtime base
# from Debian packages with mmdebstrap, the binaries with the host's Go, and
# this file with podman using the "local" stages below. With a registry, the
# same file builds everywhere with its defaults, for example multi-arch:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ) \
#     -t REGISTRY/meshd:TAG --push .
#
# (`make image IMAGE=REF PLATFORMS=linux/amd64,linux/arm64 PUSH=1` runs
# exactly that, with docker buildx or podman.)
#
# The image runs as root on purpose: meshd needs CAP_NET_ADMIN/CAP_NET_RAW in
# the host network namespace. Kubernetes grants added capabilities to a
# non-root user only through file capabilities (no ambient capabilities),
# and those are ignored under `allowPrivilegeEscalation: false`, so non-root
# would need privilege escalation instead. The manifests run root with every
# other capability dropped (see docs/install.md).

ARG GO_VERSION=1.26
# The runtime base. The default is pulled from a registry and gets the
# packages installed below ("runtime-apt"); `make image` passes a base built
# from Debian packages that has them already ("runtime-local").
ARG BASE_IMAGE=debian:bookworm-slim
ARG RUNTIME=runtime-apt
# Where the binaries come from: "build" (the Go stage below) or "prebuilt"
# (built by `make image` on the host with the same command, into
# _output/image/OS-ARCH/).
ARG BINARIES=build

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
# -tags=grpcnotrace keeps html/template (via gRPC, via CoreDNS) out of meshd:
# half its size (see the Makefile's GOTAGS).
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -tags=grpcnotrace"
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/meshd ./cmd/meshctl

FROM scratch AS prebuilt
ARG TARGETOS=linux
ARG TARGETARCH
# (make image removes this intermediate image after the build)
LABEL io.meshd.image.stage=prebuilt
COPY _output/image/${TARGETOS}-${TARGETARCH}/meshd _output/image/${TARGETOS}-${TARGETARCH}/meshctl /out/

FROM ${BINARIES} AS binaries

FROM ${BASE_IMAGE} AS runtime-apt
# iptables ships iptables-nft and iptables-legacy (and ip6tables*); the
# default alternative is nft. --no-install-recommends keeps systemd and a
# kernel image out (wireguard-tools recommends them).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      iptables wireguard-tools iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/*/[!c]* \
      /usr/share/man /usr/share/info /usr/share/locale /usr/share/lintian

FROM ${BASE_IMAGE} AS runtime-local

FROM ${RUNTIME}
COPY --from=binaries /out/meshd /out/meshctl /usr/local/bin/
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=https://github.com/meshd/meshd
LABEL org.opencontainers.image.title="meshd" \
      org.opencontainers.image.description="A WireGuard mesh between Kubernetes nodes: the meshd node daemon and meshctl" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.url="https://meshd.io" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/meshd"]
