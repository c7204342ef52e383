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
# grpcnotrace: CoreDNS's server (meshd dns) links gRPC, whose
# golang.org/x/net/trace pulls in html/template; its reflection keeps every
# exported method in the binary (34.6 MB -> 67.2 MB stripped). With the tag:
# 36.2 MB. See docs/mcs-dns.md.
GOTAGS       ?= grpcnotrace
# make image IMAGE=REF [PLATFORMS=linux/amd64,linux/arm64] [PUSH=1] (see hack/image.sh)
IMAGE        ?= localhost/meshd:$(VERSION)

.PHONY: all build image test charts unit vet fmt-check lint root e2e e2e-kernel flake bench bench-scale generate verify-generated demo demo-down deps kube-binaries clean

all: build

build:
	$(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/meshd ./cmd/meshd
	@if [ -d cmd/meshctl ]; then $(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/meshctl ./cmd/meshctl; fi

## image: build the Dockerfile into the local container store (podman; no registry needed).
image:
	IMAGE='$(IMAGE)' VERSION='$(VERSION)' PLATFORMS='$(PLATFORMS)' PUSH='$(PUSH)' GO='$(GO)' ./hack/image.sh

## unit: the fast target — unit tests on fakes, no kernel namespaces, no API server.
unit:
	$(GO) test -short ./pkg/... ./cmd/... ./internal/...

vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## lint: golangci-lint (.golangci.yml: staticcheck incl. unused, errorlint, govet,
## funlen on the reconcile path), pinned in tools/go.mod so meshd's go.mod stays lean;
## with the e2e tag, so the e2e scenarios and their testbed are linted too.
lint:
	$(GO) tool -modfile=tools/go.mod golangci-lint run --build-tags e2e ./...

## root: every package test with the race detector; namespace tests run when root.
root:
	$(GO) test -race -count=1 ./pkg/... ./cmd/... ./internal/...

## e2e: real kube-apiserver + etcd, namespace nodes, real traffic. meshd, meshctl and
## e2etool are built with -race, except for the timing scenarios (E2E_TIMING): the race
## detector slows meshd's restart to ready 3-8x (TestRestart lost 18-26 pings in 3 race
## runs against 2-4 without; the outage tests count the loss across a restart too), so
## those run in a second pass with E2E_RACE=0.
E2E_TIMING := ^(TestRestart|TestScaleColdStart|TestScaleBurst|TestScaleRestart|TestOutageAPIServerHung|TestOutageLinkedClusterRestart)$$
E2E_RUN     = $(GO) test -tags e2e -count=1 -timeout 40m -v -skip '$(E2E_TIMING)' ./e2e/... && \
	E2E_RACE=0 $(GO) test -tags e2e -count=1 -timeout 40m -v -run '$(E2E_TIMING)' ./e2e/...
e2e: deps kube-binaries
	$(E2E_RUN)

## flake: the repeat run that hunts flakes and races before they reach CI: every
## package test with -race -count=5 (one package at a time, so a shared machine
## is not swamped), then the whole e2e suite three times, as make e2e runs it
## (-race, but for the timing scenarios). A flake here is a red build.
flake: deps kube-binaries
	for p in $$($(GO) list ./pkg/... ./cmd/... ./internal/...); do $(GO) test -race -count=5 $$p || exit 1; done
	for i in 1 2 3; do $(E2E_RUN) || exit 1; done

## e2e-kernel: kernel WireGuard on a real kernel (Debian's 6.1) booted in qemu: pkg/wg kernel tests,
## throughput kernel/userspace, e2e scenarios with --wireguard kernel (hack/e2e-kernel.sh).
e2e-kernel: deps kube-binaries
	E2E_KERNEL_VM=1 $(GO) test -tags e2e -count=1 -timeout 45m -v ./e2e/kernelvm/

## charts: helm lint and helm template of charts/meshd (helm is built once into $(MESHD_CACHE)).
charts:
	./hack/helm.sh > /dev/null

## test: everything CI runs. charts comes before root: the unit tests render the
## chart with the helm it builds (cmd/meshd TestChartArgs). fuzz runs each fuzz
## target for 5 s beyond its seed corpus.
test: deps fmt-check vet lint charts root fuzz e2e e2e-kernel

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/...

## bench-scale: the scale benchmark (not part of test): 1,000 Nodes with live
## heartbeats, 3 real daemons, full and location mesh; reports figures (see
## docs/scale.md). BENCH_NODES, BENCH_STEADY, BENCH_MODES, ... tune it. meshd is
## built without the race detector (E2E_RACE=0): it would measure the detector.
bench-scale: deps kube-binaries
	E2E_RACE=$(or $(E2E_RACE),0) BENCH_SCALE=1 $(GO) test -tags e2e -count=1 -timeout 180m -v -run '^TestBenchScale$$' ./e2e/

## bench-links: the cluster-link benchmark (not part of test): the linked API
## server's own counts of watches and read requests, 50 nodes each watching
## it (before the link controller) against one link controller (docs/scale.md).
.PHONY: bench-links
bench-links: deps kube-binaries
	BENCH_LINKS=1 $(GO) test -tags e2e -count=1 -timeout 60m -v -run '^TestBenchLinks$$' ./e2e/

## fuzz: every Go fuzz target for FUZZTIME each (default 5s; FUZZTIME=5m make fuzz for longer).
.PHONY: fuzz
fuzz:
	FUZZTIME=$(or $(FUZZTIME),5s) ./hack/fuzz.sh

deps:
	./hack/ensure-deps.sh

kube-binaries:
	./hack/kube-binaries.sh

generate:
	./hack/update-codegen.sh

## verify-generated: regenerate (make generate) and fail if that changed or added
## anything under pkg/k8s or manifests/crds (commit what generate wrote).
verify-generated: generate
	@out=$$(git status --porcelain -- pkg/k8s manifests/crds); if [ -n "$$out" ]; then echo "generated code is stale (make generate changed):"; echo "$$out"; exit 1; fi

demo: deps kube-binaries
	./hack/demo.sh up

demo-down:
	./hack/demo.sh down

clean:
	rm -rf $(BIN)
