# Set-up and checks for cri-probe-shim. On a fresh Debian 12 machine, `make test` and
# `make run` do all the set-up they need: a virtualenv in .venv, the project installed
# in it, and (as root) the Debian packages the tests use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := iproute2 openssl systemd containerd runc containernetworking-plugins busybox-static patch
PYTEST_ARGS ?=

# Root can use the real paths; anyone else gets a local ./run directory.
ifeq ($(shell [ -w /run ] && [ -w /var/lib ] && echo yes),yes)
  RUN_SOCKET := /run/probe-shim/probe-shim.sock
  RUN_STATE := /var/lib/probe-shim
else
  RUN_SOCKET := $(CURDIR)/run/probe-shim.sock
  RUN_STATE := $(CURDIR)/run/state
endif

.PHONY: system-deps test e2e run demo bench bench-full protos clean k8s containerd go-binaries test-matrix control-plane \
	kubelet-delegating delegation

# Kubernetes binaries (hack/build-kubernetes.sh) and containerd 2.x (hack/build-containerd.sh) from the Go module
# proxy, cached outside the work tree by version. The tests run kubelet K8S_VERSION on containerd CONTAINERD_VERSION
# (and the containerd tests on Debian's 1.6 too).
K8S_VERSION ?= 1.37.2
K8S_BINARIES ?= kubelet crictl kube-apiserver kube-controller-manager kube-scheduler kubectl
ETCD_VERSION ?= 3.7.0
CONTAINERD_VERSION ?= 2.4.2
export K8S_VERSION CONTAINERD_VERSION ETCD_VERSION

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check -e .
	@touch $@

# The tests' extra, and the [otlp] one: tests/unit/test_tracing.py runs the OTLP exporter against a collector stand-in.
$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,otlp]'
	@touch $@ $(VENV)/.installed

system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
		if [ -n "$$missing" ]; then \
			echo "apt-get install:$$missing"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
		fi; \
	else echo "not root or no apt-get: not installing $(APT_PACKAGES); tests that need them skip"; fi

# What the tests run that only Go builds: kubelet, crictl and the control plane (K8S_VERSION), containerd
# (CONTAINERD_VERSION), etcd, the reference prober (kubelet 1.37.2's pkg/probe, tests/reference/kubelet_prober), the
# test workloads and the delegating kubelet (kubelet/: the patch series on 1.37.2), each
# built once into its cache when Go is here; without Go the tests that need them skip and say why.
go-binaries:
	@if command -v go >/dev/null; then hack/build-kubernetes.sh $(K8S_VERSION) $(K8S_BINARIES) >/dev/null && \
		hack/build-containerd.sh $(CONTAINERD_VERSION) >/dev/null && hack/build-kubelet-prober.sh >/dev/null && \
		hack/build-etcd.sh $(ETCD_VERSION) >/dev/null && hack/build-test-workloads.sh >/dev/null && \
		hack/build-kubelet-delegating.sh >/dev/null; \
	else echo "no Go: not building kubelet $(K8S_VERSION) nor containerd $(CONTAINERD_VERSION); tests that need them skip"; fi

# pytest exits 5 when it collected no test; that is not a failure of the code.
test: system-deps $(VENV)/.installed-test go-binaries
	$(PY) -m pytest -q -ra $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

e2e: system-deps $(VENV)/.installed-test go-binaries
	$(PY) -m pytest -q -ra -m e2e tests/e2e $(PYTEST_ARGS)

# The daemon in the foreground on its embedded default: no container runtime, a pod
# sandbox id is the name of a network namespace under /var/run/netns.
run: $(VENV)/.installed
	@mkdir -p $(dir $(RUN_SOCKET)) $(RUN_STATE)
	@echo "probe-shim: serving unix://$(RUN_SOCKET) (state in $(RUN_STATE)); try, in another shell:"
	@echo "  ip netns add demo && ip -n demo link set lo up"
	@echo "  $(VENV)/bin/probectl -r unix://$(RUN_SOCKET) run --pod demo --container app --type readiness --tcp 8080"
	@echo "  $(VENV)/bin/probectl -r unix://$(RUN_SOCKET) ps"
	@echo "  $(VENV)/bin/probectl -r unix://$(RUN_SOCKET) exec --pod demo --http-get :8080/healthz"
	$(VENV)/bin/probe-shim serve --runtime-endpoint none --listen unix://$(RUN_SOCKET) --state-dir $(RUN_STATE)

# A probectl session in a throwaway netns: apply examples/pod.yaml, ps, exec with its waterfall.
demo: $(VENV)/.installed-test
	$(PY) examples/demo.py

# Every figure of the benchmark in one run (so ratios are fair on a noisy machine): a table on stdout,
# JSON and PNG plots under bench/results/. `bench` is the quick mode (under 2 minutes), `bench-full`
# the reference run. Needs root (network namespaces) and, for the ExecSync and proxy parts, containerd.
$(VENV)/.installed-bench: pyproject.toml | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,otlp,bench]'
	@touch $@ $(VENV)/.installed $(VENV)/.installed-test

bench: system-deps $(VENV)/.installed-bench go-binaries
	$(PY) bench/suite.py --mode quick

bench-full: system-deps $(VENV)/.installed-bench go-binaries
	$(PY) bench/suite.py --mode full

k8s:
	hack/build-kubernetes.sh $(K8S_VERSION) $(K8S_BINARIES)

containerd:
	hack/build-containerd.sh $(CONTAINERD_VERSION)

# The one-machine cluster's tests alone (tests/e2e/test_control_plane.py; also part of `make test`).
control-plane: system-deps $(VENV)/.installed-test go-binaries
	$(PY) -m pytest -q -ra tests/e2e/test_control_plane.py $(PYTEST_ARGS)

# The delegating kubelet (kubelet/: the patch series on $(K8S_VERSION), gate CRIProbeDelegation), its unit tests,
# and the tests that run it through the shim (all also part of `make test`).
kubelet-delegating:
	hack/build-kubelet-delegating.sh

delegation: system-deps $(VENV)/.installed-test go-binaries
	$(PY) -m pytest -q -ra tests/system/test_kubelet_series.py tests/e2e/test_kubelet_delegation.py \
		tests/e2e/test_delegated_probes.py $(PYTEST_ARGS)

# The real-kubelet tests against every supported kubelet, each on the runtimes it supports (not part of `make test`:
# it builds two more kubelets and runs the tests four times); prints one table, test x version.
test-matrix: system-deps $(VENV)/.installed-test
	hack/build-containerd.sh $(CONTAINERD_VERSION) >/dev/null
	$(PY) hack/test_matrix.py --containerd $(CONTAINERD_VERSION) $(PYTEST_ARGS)

protos: $(VENV)/.installed-test
	$(PY) -m cri_proto.generate

clean:
	rm -rf $(VENV) run
