# kvnet developer entry points. `make help` lists them.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin
LAB_DIR ?= .local

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install the system packages the lab and tests use, when missing (apt)
	hack/install-deps.sh

.PHONY: guest-image
guest-image: deps ## Build the lab's QEMU guest image into .cache/guest (Debian kernel + busybox; cached)
	hack/guest/build.sh

.PHONY: tools
tools: ## Build etcd, kube-apiserver and kube-controller-manager into .cache/bin (cached)
	hack/build-tools.sh

.PHONY: build
build: ## Build kvnet binaries into bin/
	$(GO) build -o $(BIN)/ ./cmd/... github.com/containernetworking/plugins/plugins/main/macvlan github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/ipam/host-local

REGISTRY ?= ghcr.io/kvnet
TAG ?= dev
PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: images
images: ## Build the kvnet-controller and kvnet-node images into _out/images (OCI layouts + docker-save tarballs; no daemon). REGISTRY, TAG, PLATFORMS
	$(GO) run ./hack/images --out _out/images --registry $(REGISTRY) --tag $(TAG) --platforms $(PLATFORMS)

.PHONY: install
install: build ## Install kvnet into the current kubectl context's cluster with images $(REGISTRY)/<name>:$(TAG); then run: bin/kvnet check
	$(BIN)/kvnet install --registry $(REGISTRY) --tag $(TAG)

.PHONY: generate
generate: ## Regenerate deepcopy code and CRDs from api/, the Helm chart from config/
	hack/update-codegen.sh

.PHONY: verify
verify: ## Fail if generated files are stale or code is unformatted
	hack/verify.sh

.PHONY: chaos
chaos: deps tools build ## Chaos run: 10,000 operations while killing kvnet-controller, kvnet-node, the API server; then audit (root)
	$(BIN)/kvnet-lab chaos --ops $${OPS:-10000} --seed $${SEED:-1}

# The scale lab (docs/scale.md). As root, SCALE_REAL_NODES real kvnet-node
# processes join the KWOK nodes.
SCALE_NODES ?= 100
SCALE_REAL_NODES ?= $(if $(filter 0,$(shell id -u)),1,0)
SCALE_UDNS ?= 100
SCALE_PODS ?= 5000
SCALE_VMS ?= 500
SCALE_CHURN ?= 30s
SCALE_CHURN_RATE ?= 20
SCALE_POD_SCOPE ?= cluster
SCALE_RESTART_RESERVE ?= 0
SCALE_OUT ?= _out/scale

.PHONY: scale
scale: tools build $(if $(filter 0,$(shell id -u)),deps) ## Scale lab: KWOK nodes, pods, VMs, UDNs, churn; prints the table, writes $(SCALE_OUT)/summary.json. SCALE_NODES, SCALE_PODS, ...
	$(BIN)/kvnet-lab scale --nodes $(SCALE_NODES) --real-nodes $(SCALE_REAL_NODES) --udns $(SCALE_UDNS) \
		--pods $(SCALE_PODS) --vms $(SCALE_VMS) --churn $(SCALE_CHURN) --churn-rate $(SCALE_CHURN_RATE) --pod-scope $(SCALE_POD_SCOPE) \
		--restart-reserve $(SCALE_RESTART_RESERVE) --dir $(SCALE_OUT)/lab --summary $(SCALE_OUT)/summary.json

.PHONY: lint
lint: ## Run golangci-lint with the import boundaries (installs the pinned version into .cache/bin)
	hack/lint.sh

# The system packages and the guest image serve only the privileged tests
# (cluster-deps: the real-cluster e2e's containerd, runc, ...): as any other
# user make test runs the unit tests without them.
PRIVILEGED_TEST_DEPS := $(if $(filter 0,$(shell id -u)),deps guest-image cluster-deps kubevirt-deps)

.PHONY: test
test: tools $(PRIVILEGED_TEST_DEPS) ## Run the whole test suite (real apiserver; as root, also the datapath, lab, QEMU and real-cluster tests)
	GO=$(GO) hack/test.sh -race -count=1 -timeout 40m

.PHONY: bench
bench: tools ## Run the benchmarks
	$(GO) test -run '^$$' -bench . -benchtime 1x ./...

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 60s; FUZZ=<regexp> picks targets)
	GO=$(GO) hack/fuzz.sh

# The real cluster (docs/cluster.md): real kubelets and containerd in node
# namespaces, a registry of its own. Builds are cached in $(KVNET_CACHE).
CLUSTER_DIR ?= .cluster
CLUSTER_NODES ?= 3
# The variant (docs/cluster.md): flannel, bridge or ptp32; thick, thin or none.
CLUSTER_NETWORK ?= flannel
CLUSTER_IP_FAMILY ?= ipv4
CLUSTER_MULTUS ?= thick
# CLUSTER_KUBEVIRT=true also installs KubeVirt (docs/kubevirt-images.md; its first build takes long).
CLUSTER_KUBEVIRT ?= false
export KVNET_CACHE ?= /var/cache/kvnet

.PHONY: cluster-deps
cluster-deps: ## Install the Debian packages the real cluster needs (containerd, runc, ...), when missing
	hack/install-deps.sh --cluster

.PHONY: kubevirt-deps
kubevirt-deps: ## Install the Debian packages KubeVirt's images are built with (gcc, libvirt-dev, debootstrap, ...), when missing
	hack/install-deps.sh --kubevirt

.PHONY: cluster-up
cluster-up: cluster-deps $(if $(filter true,$(CLUSTER_KUBEVIRT)),kubevirt-deps) tools build ## Build (cached) and start the real cluster in the background: $(CLUSTER_DIR)/kubeconfig, $(CLUSTER_DIR)/env (root)
	$(BIN)/kvnet-lab cluster up --dir $(CLUSTER_DIR) --nodes $(CLUSTER_NODES) --default-network $(CLUSTER_NETWORK) --ip-family $(CLUSTER_IP_FAMILY) --multus $(CLUSTER_MULTUS) --kubevirt=$(CLUSTER_KUBEVIRT) --bin-dir "$$(hack/build-cluster-tools.sh)"

.PHONY: cluster-down
cluster-down: ## Stop the real cluster and remove everything it made
	@if [ -x $(BIN)/kvnet-lab ]; then $(BIN)/kvnet-lab cluster down --dir $(CLUSTER_DIR); fi

.PHONY: cluster-demo
cluster-demo: build ## Run the pod scenarios on the cluster of make cluster-up (installs kvnet first if needed); one PASS/FAIL line each
	$(BIN)/kvnet-lab cluster demo --dir $(CLUSTER_DIR)

# make test runs it too (as root, after the rest).
.PHONY: cluster-test
cluster-test: cluster-deps tools ## Run only the real-cluster test (root; builds kubelet & co. on its first run, cached after)
	hack/build-cluster-tools.sh >/dev/null
	KVNET_REQUIRE_PRIVILEGED=1 CGO_ENABLED=0 $(GO) test -trimpath -tags cluster -count=1 -timeout 30m -v -run TestCluster ./internal/lab/cluster/

.PHONY: cluster-bench
cluster-bench: cluster-deps tools ## Run the real-cluster benchmarks (root; docs/cluster.md, "Benchmarks")
	hack/build-cluster-tools.sh >/dev/null
	KVNET_REQUIRE_PRIVILEGED=1 CGO_ENABLED=0 $(GO) test -trimpath -tags cluster -count=1 -timeout 60m -run '^$$' -bench BenchmarkCluster -benchtime 1x ./internal/lab/cluster/

.PHONY: kubevirt-test
kubevirt-test: cluster-deps kubevirt-deps tools ## Run the real-KubeVirt e2e (root): KubeVirt v1.8.4 built (cached) and installed on the real cluster, the VM scenarios, a drain, a rollback and upgrade of kvnet
	hack/build-cluster-tools.sh >/dev/null
	KVNET_REQUIRE_PRIVILEGED=1 CGO_ENABLED=0 $(GO) test -trimpath -tags cluster,kubevirt -count=1 -timeout 60m -v -run '^TestClusterKubeVirt$$' ./internal/lab/cluster/

.PHONY: kubevirt-images-test
kubevirt-images-test: ## Build KubeVirt and its images, and the guest containerDisk, and test them (root; the first run takes long, cached after; docs/kubevirt-images.md)
	hack/install-deps.sh --kubevirt
	KVNET_REQUIRE_PRIVILEGED=1 $(GO) test -tags kubevirt -count=1 -timeout 150m -v -run TestRealImages ./internal/lab/kvimages/

.PHONY: local-up
local-up: deps tools guest-image build ## Start the lab (control plane + kvnet) in the background
	$(BIN)/kvnet-lab up --dir $(LAB_DIR)

.PHONY: local-down
local-down: ## Stop the lab
	@if [ -x $(BIN)/kvnet-lab ]; then $(BIN)/kvnet-lab down --dir $(LAB_DIR); fi

.PHONY: local-clean
local-clean: build ## Stop the lab and remove its state (etcd data, logs, kubeconfig): the next local-up starts from a clean slate
	$(BIN)/kvnet-lab down --purge --dir $(LAB_DIR)

.PHONY: demo
demo: local-up ## Start the lab, apply examples/ and show the result
	$(BIN)/kvnet-lab demo --kubeconfig $(LAB_DIR)/kubeconfig --examples examples
	@echo; echo "The lab keeps running: KUBECONFIG=$(LAB_DIR)/kubeconfig; stop it with: make local-down"
