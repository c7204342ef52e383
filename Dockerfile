# syntax=docker/dockerfile:1
#
# meshd image: the node daemon (meshd) and the CLI (meshctl), plus the tools
# an operator uses inside the pod: wg, ip, iptables/ip6tables (both the nft
# and the legacy backend; meshd --iptables-backend picks one).
#
#   docker build -t ghcr.io/meshd/meshd:0.1.0 --build-arg VERSION=0.1.0 .
#
# The image runs as root on purpose: meshd needs CAP_NET_ADMIN/CAP_NET_RAW in
# the host network namespace. Kubernetes grants added capabilities to a
# non-root user only through file capabilities (no ambient capabilities),
# and those are ignored under `allowPrivilegeEscalation: false`, so non-root
# would need privilege escalation instead. The manifests run root with every
# other capability dropped (see docs/install.md).

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/meshd ./cmd/meshctl

FROM debian:trixie-slim
# iptables ships iptables-nft and iptables-legacy (and ip6tables*); the
# default alternative is nft. --no-install-recommends keeps systemd and a
# kernel image out (wireguard-tools recommends them).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      iptables wireguard-tools iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/meshd /out/meshctl /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/meshd"]
