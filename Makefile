# meshd — see README.md. `make demo` starts a live mesh, `make test` runs everything.
SHELL        := /bin/bash
GO           ?= go
BIN          := bin
KUBE_VERSION ?= v1.36.3
export MESHD_CACHE ?= $(HOME)/.cache/meshd
export KUBE_VERSION
# The version linked into meshd and meshctl (meshd --version, meshctl version)
# and stamped on the image.
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS      := -X main.version=$(VERSION)
# make image IMAGE=REF [PLATFORMS=linux/amd64,linux/arm64] [PUSH=1] (see hack/image.sh)
IMAGE        ?= localhost/meshd:$(VERSION)

.PHONY: all build image test charts unit vet fmt-check root e2e bench generate verify-generated demo demo-down deps kube-binaries clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/meshd ./cmd/meshd
	@if [ -d cmd/meshctl ]; then $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/meshctl ./cmd/meshctl; fi

## image: build the Dockerfile into the local container store (podman; no registry needed).
image:
	IMAGE='$(IMAGE)' VERSION='$(VERSION)' PLATFORMS='$(PLATFORMS)' PUSH='$(PUSH)' GO='$(GO)' ./hack/image.sh

## unit: the fast target — unit tests on fakes, no kernel namespaces, no API server.
unit:
	$(GO) test -short ./pkg/... ./cmd/...

vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## root: every package test with the race detector; namespace tests run when root.
root:
	$(GO) test -race -count=1 ./pkg/... ./cmd/...

## e2e: real kube-apiserver + etcd, namespace nodes, real traffic.
e2e: deps kube-binaries
	$(GO) test -tags e2e -count=1 -timeout 40m -v ./e2e/...

## charts: helm lint and helm template of charts/meshd (helm is built once into $(MESHD_CACHE)).
charts:
	./hack/helm.sh > /dev/null

## test: everything CI runs.
test: deps fmt-check vet root charts e2e

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/...

deps:
	./hack/ensure-deps.sh

kube-binaries:
	./hack/kube-binaries.sh

generate:
	./hack/update-codegen.sh

demo: deps kube-binaries
	./hack/demo.sh up

demo-down:
	./hack/demo.sh down

clean:
	rm -rf $(BIN)
