# Two commands: `make run` and `make test`. Both set up .venv on a fresh machine first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NPM ?= npm
# configurable-http-proxy, the hub's proxy: npm installs it (package.json) into node_modules/
NODE_STAMP := node_modules/.installed
# pytest-xdist workers of `make test` (tests/conftest.py says how the suite is shared out)
TEST_WORKERS ?= 2

.PHONY: install run test lint bench clean k8s-build k8s-up k8s-down

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[k8s,train,test]'
	touch $(STAMP)

$(NODE_STAMP): package.json
	$(NPM) install --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

install: $(STAMP) $(NODE_STAMP)

# JupyterHub on http://127.0.0.1:8000 with the wmla service (jupyterhub_config.py); runtime
# state in var/ ($$WMLA_VAR). Ctrl-C stops the hub, which stops the proxy and the service.
# An account that cannot execute the venv's interpreter (a .venv made by another account over a
# Python under its 0700 home, e.g. root's pyenv) runs the system Python of the venv's version
# over the venv's packages instead (docs/spawner.md, "Local, hub not root").
VENV_PY = $(shell sed -n 's/^version *= *\([0-9]*\.[0-9]*\).*/\1/p' $(VENV)/pyvenv.cfg 2>/dev/null)
run: install
	@if $(BIN)/python -c '' 2>/dev/null; then \
	  PATH="$(abspath $(BIN)):$$PATH" exec $(BIN)/jupyterhub -f jupyterhub_config.py; \
	fi; \
	py=$$(command -v python$(VENV_PY)) || { echo "make run: $$(id -un) cannot execute \
	$(BIN)/python and there is no python$(VENV_PY) on PATH" >&2; exit 1; }; \
	var="$${WMLA_VAR:-$(CURDIR)/var}"; \
	if [ -e "$$var" ] && [ ! -w "$$var" ]; then echo "make run: $$var is not writable by \
	$$(id -un); set WMLA_VAR to a folder of its own" >&2; exit 1; fi; \
	echo "make run: $$(id -un) cannot execute $(BIN)/python; running $$py over the venv's \
	packages" >&2; \
	PYTHONPATH="$(abspath $(VENV))/lib/python$(VENV_PY)/site-packages:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" \
	  exec "$$py" -m jupyterhub -f jupyterhub_config.py

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# The Kubernetes tests' binaries, built once per version (cold: about 8 min on 2 cores).
	@# A failed build does not stop the suite: those tests fail with the build's reason.
	-$(BIN)/python -m devcluster build
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --no-loadscope-reorder; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

lint: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# each benchmark prints its figures and compares with a baseline measured in the same run
bench: install
	$(BIN)/python benchmarks/bench_scheduler.py
	$(BIN)/python benchmarks/bench_usage.py
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_confine.py
	$(BIN)/python benchmarks/bench_storage.py
	$(BIN)/python benchmarks/bench_vs_slurm.py
	$(BIN)/python benchmarks/bench_spawn.py
	$(BIN)/python benchmarks/bench_first_log.py
	$(BIN)/python benchmarks/bench_trace.py
	$(BIN)/python benchmarks/bench_service.py
	$(BIN)/python benchmarks/bench_fairness.py
	$(BIN)/python benchmarks/bench_estimate.py

# A local Kubernetes on loopback (docs/kubernetes.md): kube-apiserver, controller manager and
# scheduler, etcd, Volcano, the training operator and KWOK GPU nodes ($$WMLA_DEVICE_LAYOUT, e.g.
# 4x8), built from Go modules into .cache/k8s/ when missing; admin kubeconfig var/k8s/kubeconfig,
# the service's var/k8s/wmla-service.kubeconfig. Idempotent; k8s-down stops it by PID.
# WMLA_K8S_REAL_NODE=1 k8s-up adds a real node (kubelet + Debian's containerd, as root):
# real pods with the images built here; k8s-down stops it and cleans what it mounted and made.
k8s-build: install
	$(BIN)/python -m devcluster build

k8s-up: install
	$(BIN)/python -m devcluster up

k8s-down: install
	$(BIN)/python -m devcluster down

clean:
	rm -rf $(VENV) build *.egg-info node_modules
