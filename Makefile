# galactic-node: build, test and measure.
#
# `make test` is the one command that runs everything, privileged tests
# included; it must run as root (CI does). `make test-unit` runs what needs
# no privileges.

GO              ?= go
# An execution count, not a duration: go1.26's fuzz coordinator can report a
# spurious "context deadline exceeded" when a duration runs out (golang/go
# issue 75804, fixed in go1.27).
FUZZTIME        ?= 300000x
PKGS            := ./...
# e2e runs on a node of its own (make e2e), after the rest.
TESTPKGS        = $(shell $(GO) list ./... | grep -v -e /e2e$$ -e /integration/freshclone$$)
VERSION         ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: release robustness demo all build images pin-images test test-unit test-fresh-clone test-privileged testbin e2e e2e-run e2ebin fuzz bench bench-fleet lint fmt-check vet generate

all: build

build:
	$(GO) build $(PKGS)
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/galactic-node ./cmd/galactic-node
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/galactic-hubctl ./cmd/galactic-hubctl
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o bin/galactic-tap ./cmd/galactic-tap

# Container images as OCI archives under $(IMAGE_DIR), for `podman load -i`
# or `podman run oci-archive:...`, written by hack/imagebuild with no
# registry and no base image. The same sources give the same digests: static
# binaries with no build paths or VCS stamp, and the version, revision and
# every timestamp those of IMAGE_COMMIT, the last commit that changed what
# goes into an image (IMAGE_SOURCES; SOURCE_DATE_EPOCH overrides its time).
# A commit that changes only manifests or docs, such as the one that pins
# deploy/base to these digests, builds the same images, so the pin can name
# what its own tree builds (integration/install_test.go checks it).
IMAGE_DIR         ?= bin
IMAGE_REPO        ?= ghcr.io/datum-cloud
IMAGE_SOURCE      ?= https://github.com/datum-cloud/galactic-node
IMAGE_SOURCES     := go.mod go.sum Makefile LICENSE cmd node ebpf admin hubctl internal hack/imagebuild hack/sbom deploy/node/seccomp \
	':(exclude,glob)**/*_test.go' ':(exclude,glob)**/testdata/**'
IMAGE_COMMIT      ?= $(shell git log -1 --format=%H -- $(IMAGE_SOURCES) 2>/dev/null || echo unknown)
IMAGE_DIRTY       := $(shell git diff --quiet HEAD -- $(IMAGE_SOURCES) 2>/dev/null || echo -dirty)
IMAGE_VERSION     ?= $(shell git describe --always --abbrev=12 $(IMAGE_COMMIT) 2>/dev/null || echo dev)$(IMAGE_DIRTY)
REVISION          ?= $(IMAGE_COMMIT)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct $(IMAGE_COMMIT) 2>/dev/null || echo 0)
STATIC_BUILD      := CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false
# The CNI plugin ships without its symbol table and DWARF (-s -w): it is
# copied to every node and exec'd by the runtime for each attachment, and
# must stay under 9 MB (cmd/galactic-tap's TestThePluginStaysUnder9MB).
# Its panics still name functions and lines: Go's tracebacks read pclntab,
# which stripping keeps; only debuggers lose DWARF.
TAP_LDFLAGS       := -s -w
IMAGE_BUILD       = $(GO) run ./hack/imagebuild -epoch $(SOURCE_DATE_EPOCH) \
	-label org.opencontainers.image.source=$(IMAGE_SOURCE) \
	-label org.opencontainers.image.revision=$(REVISION) \
	-label org.opencontainers.image.version=$(IMAGE_VERSION) \
	-label org.opencontainers.image.licenses=Apache-2.0 \
	-add LICENSE=/usr/share/doc/galactic/LICENSE
# Each image's SBOM (hack/sbom): the modules its binaries were built with,
# read from the binaries themselves; the image carries it, and `make
# release` publishes it beside the archives.
SBOM              = $(GO) run ./hack/sbom -epoch $(SOURCE_DATE_EPOCH) -version $(IMAGE_VERSION)

images:
	@mkdir -p $(IMAGE_DIR)/static
	$(STATIC_BUILD) -ldflags "-X main.version=$(IMAGE_VERSION)" -o $(IMAGE_DIR)/static/galactic-node ./cmd/galactic-node
	$(STATIC_BUILD) -ldflags "-X main.version=$(IMAGE_VERSION)" -o $(IMAGE_DIR)/static/galactic-hubctl ./cmd/galactic-hubctl
	$(STATIC_BUILD) -ldflags "$(TAP_LDFLAGS) -X main.buildVersion=$(IMAGE_VERSION)" -o $(IMAGE_DIR)/static/galactic-tap ./cmd/galactic-tap
	$(SBOM) -image $(IMAGE_REPO)/galactic-node -out $(IMAGE_DIR)/galactic-node.cdx.json \
		$(IMAGE_DIR)/static/galactic-node=/usr/local/bin/galactic-node $(IMAGE_DIR)/static/galactic-tap=/usr/local/bin/galactic-tap
	$(SBOM) -image $(IMAGE_REPO)/galactic-hubctl -out $(IMAGE_DIR)/galactic-hubctl.cdx.json \
		$(IMAGE_DIR)/static/galactic-hubctl=/usr/local/bin/galactic-hubctl
	$(IMAGE_BUILD) -ref $(IMAGE_REPO)/galactic-node:$(IMAGE_VERSION) \
		-add $(IMAGE_DIR)/galactic-node.cdx.json=/usr/share/sbom/galactic-node.cdx.json \
		-add $(IMAGE_DIR)/static/galactic-node=/usr/local/bin/galactic-node \
		-add $(IMAGE_DIR)/static/galactic-tap=/usr/local/bin/galactic-tap \
		-add deploy/node/seccomp/galactic-node.json=/etc/galactic/seccomp/galactic-node.json \
		-entrypoint /usr/local/bin/galactic-node \
		-out $(IMAGE_DIR)/galactic-node.oci.tar -digest-file $(IMAGE_DIR)/galactic-node.digest
	$(IMAGE_BUILD) -ref $(IMAGE_REPO)/galactic-hubctl:$(IMAGE_VERSION) \
		-add $(IMAGE_DIR)/galactic-hubctl.cdx.json=/usr/share/sbom/galactic-hubctl.cdx.json \
		-add $(IMAGE_DIR)/static/galactic-hubctl=/usr/local/bin/galactic-hubctl \
		-entrypoint /usr/local/bin/galactic-hubctl -user 65532:65532 \
		-out $(IMAGE_DIR)/galactic-hubctl.oci.tar -digest-file $(IMAGE_DIR)/galactic-hubctl.digest

# Pins the default install (deploy/base) to the images just built, by
# digest: run after pushing them with their digests kept (README, "Images").
pin-images:
	@for img in galactic-node galactic-hubctl; do \
		d=$$(cat $(IMAGE_DIR)/$$img.digest) || exit 1; \
		sed -i "/name: $(subst /,\/,$(IMAGE_REPO))\/$$img\$$/{n;s/digest: .*/digest: $$d/}" deploy/base/kustomization.yaml; \
		echo "pinned $(IMAGE_REPO)/$$img@$$d"; \
	done

# A versioned release under $(DIST) (hack/release.sh, docs/release.md): from
# a clean tree at the tag VERSION, the two images as OCI archives, their
# SBOMs, galactic.yaml pinned to their digests under IMAGE_REPO, and
# SHA256SUMS. `make release VERSION=v1.2.3 IMAGE_REPO=registry.example.com/galactic`
# renders the manifests for the registry you will push to.
DIST ?= dist
release:
	@if [ "$(origin VERSION)" != "command line" ] && [ "$(origin VERSION)" != "environment" ]; then \
		echo "make release: say which: make release VERSION=vX.Y.Z (the tag at HEAD)"; exit 1; fi
	VERSION=$(VERSION) IMAGE_REPO=$(IMAGE_REPO) DIST=$(DIST) MAKE="$(MAKE)" GO="$(GO)" hack/release.sh

# The README's first command: the whole job in a private network namespace.
demo: build
	hack/demo.sh

# The fuzz targets run beside the e2e, which mostly waits on its nodes'
# kubelets and the daemon's passes; each one's output is printed whole
# when it ends.
test: fmt-check vet alert-test test-privileged testbin e2ebin images
	@$(MAKE) --no-print-directory -j3 --output-sync=target fuzz e2e-run test-fresh-clone

# make test-unit on a fresh clone, as a user that is not root
# (integration/freshclone): it compiles the whole tree from nothing, the
# longest single step of make test, so it runs beside the e2e, which
# mostly waits, with a bound of its own.
test-fresh-clone:
	@if [ "$$(id -u)" != 0 ]; then echo "make test-fresh-clone changes users: run it as root"; exit 1; fi
	$(GO) test -count=1 -timeout 50m ./integration/freshclone

# The real kube-apiserver and etcd, built once per machine (hack/testbin.sh).
testbin:
	@hack/testbin.sh >/dev/null

# A real one-node cluster in namespaces of its own (e2e/, docs/e2e.md):
# kubelet, kube-controller-manager, kube-scheduler, containerd, the
# reference CNI plugins and Multus, built once per machine
# (hack/e2ebin.sh), with the testbin's kube-apiserver and etcd and the
# images `make images` builds.
e2ebin:
	@hack/e2ebin.sh >/dev/null

e2e: testbin e2ebin images
	@$(MAKE) --no-print-directory e2e-run

# The e2e on parts already built (make e2e builds them first). Race-enabled
# like the other tests, so that its packages come out of their build.
e2e-run:
	@if [ "$$(id -u)" != 0 ]; then echo "make e2e runs a kubelet and containerd: run it as root"; exit 1; fi
	GALACTICTEST_E2EBIN=$$(hack/e2ebin.sh) KUBEBUILDER_ASSETS=$$(hack/testbin.sh) $(GO) test -race -count=1 -timeout 30m -v ./e2e

# The container tests (integration/container_test.go) run the images
# `make images` writes, in podman. -p 4 on two cores: go test counts a
# running test binary against -p as it counts a compile, and the longest
# packages (integration, node/reclaim) run for minutes, partly waiting on
# the kernel, the API server and their own timers; at -p 2 each held a
# compile slot for as long.
test-privileged: testbin images
	@if [ "$$(id -u)" != 0 ]; then echo "make test runs privileged tests: run it as root (sudo make test), or use make test-unit"; exit 1; fi
	KUBEBUILDER_ASSETS=$$(hack/testbin.sh) $(GO) test -race -p 4 -count=1 -timeout 30m $(TESTPKGS)

# The alert rules' unit tests (deploy/alerts/tests), run by promtool at the
# Prometheus version go.mod requires, built once per machine (hack/promtool.sh).
.PHONY: alert-test monitoring
alert-test:
	@promtool=$$(hack/promtool.sh) && $$promtool check rules deploy/alerts/galactic.rules.yaml && \
		$$promtool test rules deploy/alerts/tests/*.yaml

# Rewrites the monitoring component's PrometheusRule from the rule file, the
# one source of the rules; a test fails while they differ.
monitoring:
	hack/monitoring.sh

# -short skips what needs parts an earlier target builds (the images and
# their digests, `make images`) or builds them itself (the images, the
# plugin at its shipped size): test-unit runs on a fresh clone, as any
# user, with nothing built before it (integration/freshclone checks).
# The timeouts, here and above, are several times a run's length on two
# loaded cores, so that only a hang reaches them.
test-unit:
	GALACTICTEST_SKIP_PRIVILEGED=1 $(GO) test -short -count=1 -timeout 20m $(TESTPKGS)

# Each fuzz target runs a bounded number of executions on top of its
# committed corpus (testdata/fuzz). FUZZTARGETS: "<target> <package> <execs>".
FUZZTARGETS := \
	"FuzzTenantName ./node/identity $(FUZZTIME)" \
	"FuzzTunDecode ./node/link/driver 200000x" \
	"FuzzParseObjects ./node/inventory 30000x" \
	"FuzzAdminRequests ./admin 10000x" \
	"FuzzParse ./node/cnitap 30000x"
fuzz:
	@for t in $(FUZZTARGETS); do set -- $$t; \
		echo "fuzz $$1 ($$2, $$3)"; \
		$(GO) test -run='^$$' -fuzz="^$$1\$$" -fuzztime=$$3 -timeout 20m $$2 || exit 1; \
	done

# The robustness run (test/robustness, docs/robustness.md) for DURATION of
# random work and faults, where make test runs it for 90 s: the node's, and
# the hub's against both address-service models. A failure names its seed
# and keeps its history. As root.
DURATION ?= 1h
robustness: testbin
	@if [ "$$(id -u)" != 0 ]; then echo "make robustness runs the daemon in namespaces of its own: run it as root"; exit 1; fi
	GALACTICTEST_ROBUSTNESS_DURATION=$(DURATION) KUBEBUILDER_ASSETS=$$(hack/testbin.sh) $(GO) test -count=1 -timeout 0 -v ./test/robustness/...

# Every benchmark, as root; writes bench/RESULTS.md.
bench: testbin
	hack/bench.sh

# The fleet simulation at its large sizes (200 nodes, 100,000 objects, as far
# as the machine holds); writes bench/FLEET.md. `make bench` runs its small
# sizes. docs/scale.md builds on both.
bench-fleet: testbin
	hack/bench-fleet.sh

# The pinned golangci-lint (.golangci.yml), built once per machine
# (hack/golangci-lint.sh); .ci/run runs it before make test. It loads its
# packages' type information from the go command's compile of them; with
# -race that compile is vet's, just done, where its own non-race one took
# 4 min 55 s of a cold run here (47 s with -race).
lint: fmt-check vet
	GOFLAGS=-race $$(hack/golangci-lint.sh) run $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# -race: vet compiles every package it checks, and their dependencies, for
# their type information; built as the race-enabled tests build them, that
# compile is the tests' too, instead of a second one of the whole tree.
vet:
	$(GO) vet -race $(PKGS)

# Regenerates the eBPF object and bindings from ebpf/datapath/bpf/*.c, and
# records the source's hash so that `make test` fails on a stale object.
# The compiler is pinned (ebpf/datapath/gen.go calls clang-14; bpf2go strips
# with llvm-strip-14): the committed object is clang $(BPF_CLANG_VERSION)'s,
# and another version emits another object, so it is refused here.
BPF_CLANG_VERSION := 14.0.6
generate:
	@command -v clang-14 >/dev/null && command -v llvm-strip-14 >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-14 llvm-14 libbpf-dev; }
	@test -f /usr/include/bpf/bpf_helpers.h || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libbpf-dev; }
	@v=$$(clang-14 --version | sed -n '1s/.*clang version \([0-9.]*\).*/\1/p'); \
	if [ "$$v" != "$(BPF_CLANG_VERSION)" ]; then \
		echo "make generate: clang-14 is clang $$v, not $(BPF_CLANG_VERSION) (Debian bookworm's clang-14), which built the committed object; another version would emit another object" >&2; exit 1; \
	fi
	$(GO) generate ./ebpf/...
	sha256sum ebpf/datapath/bpf/datapath.c | cut -d' ' -f1 > ebpf/datapath/bpf/datapath.c.sha256
