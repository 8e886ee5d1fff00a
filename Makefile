# Set-up and checks for cri-probe-shim. On a fresh Debian 12 machine as root,
# `make test` and `make run` install everything they need first.
PYTHON ?= python3
APT_PACKAGES := iproute2 openssl containerd runc containernetworking-plugins busybox-static
STAMP := .deps-installed

.PHONY: deps test run demo bench protos clean

$(STAMP): pyproject.toml
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
		if [ -n "$$missing" ]; then \
			echo "apt-get install:$$missing"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
		fi; \
	else echo "not root or no apt-get: skipping Debian packages ($(APT_PACKAGES))"; fi
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

deps: $(STAMP)

# pytest exits 5 when it collected no test; that is not a failure of the code.
test: $(STAMP)
	$(PYTHON) -m pytest -q -ra $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

# The daemon on its embedded default: no container runtime, a pod sandbox id is the
# name of a network namespace under /var/run/netns (create one with `ip netns add`).
run: $(STAMP)
	probe-shim serve --runtime-endpoint none --state-dir /var/lib/probe-shim

# The engine alone: a throwaway netns with HTTP/TCP/gRPC servers, probed by one worker.
demo: $(STAMP)
	$(PYTHON) bench/probe_latency.py --count 5 --verbose

bench: $(STAMP)
	$(PYTHON) bench/probe_latency.py --count 500

protos:
	$(PYTHON) -m cri_proto.generate

clean:
	rm -f $(STAMP)
