# Reactor-Fabric — every operation a user or developer needs, one target each.
#   make run              install everything (venv, Docker engine, images) and serve the bundled suite
#   make test             install everything and run the whole test suite (unit + real-engine)
#   make help             list the targets

SHELL := /bin/bash
PYTHON_BOOTSTRAP ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= claude-mcp-suite.yaml
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install docker images image-orchestrator run test test-unit test-integration lint format \
        validate-config test-onboarding clean bench bench-smoke lock-images eval-discovery \
        test-tools test-podman test-fast constraints

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON_BOOTSTRAP) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (set PYTHON_BOOTSTRAP=python3.X)")'
	$(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

install: $(VENV)/.installed ## create .venv with the package and its test/dev tools (the versions in constraints.txt)

constraints: ## refresh constraints.txt: the newest releases pyproject.toml allows, in a venv of their own (then run the tests)
	rm -rf .venv-constraints
	$(PYTHON_BOOTSTRAP) -m venv .venv-constraints
	.venv-constraints/bin/python -m pip install --quiet --upgrade pip
	.venv-constraints/bin/python -m pip install --quiet -e '.[dev]'
	{ sed -n '1,2p' constraints.txt; .venv-constraints/bin/python -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .venv-constraints

docker: ## make sure a Docker engine answers (installs and starts Debian's docker.io if needed), with gVisor's runsc registered where the machine allows
	scripts/ensure-docker
	scripts/ensure-gvisor

images: docker ## build the local MCP server images and the containers' stdio helper (a no-op when nothing changed)
	scripts/build-images
	scripts/build-stdio-helper

image-orchestrator: docker ## build the orchestrator's own image, for a cluster (deploy/kubernetes)
	scripts/build-images orchestrator

lock-images: ## rewrite the images' lock files (Debian, PyPI, npm hashes) after changing images/versions.env
	scripts/lock-images

run: install images ## serve the bundled suite on 127.0.0.1:8765 (CONFIG=..., or flags via ARGS=...)
	$(PY) -m reactor_fabric --config $(CONFIG) $(ARGS)

test: install images image-orchestrator test-tools ## all tests: unit, and integration against the real engine and images
	$(PY) -m pytest $(PYTEST_ARGS)

PODMAN_SOCKET ?= /run/podman/podman.sock
test-podman: install images image-orchestrator test-tools ## the real-engine tests of what differs between engines, against rootful Podman's Docker-compatible API (installs and starts it); tests/integration/engines.py names those that run on Docker only
	REACTOR_FABRIC_PODMAN_SOCKET=$(PODMAN_SOCKET) scripts/ensure-podman
	DOCKER_HOST=unix://$(PODMAN_SOCKET) $(PY) -m pytest tests/integration $(PYTEST_ARGS)

test-tools: ## what the observability tests need: headless Chromium and its driver, promtool (Debian)
	scripts/ensure-test-tools

test-unit: install ## unit tests only (no Docker needed)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-fast: install ## the quick loop: unit tests without the exhaustive explorations (< 2 min; CI runs them)
	$(PY) -m pytest tests/unit -m "not exhaustive" $(PYTEST_ARGS)

test-integration: install images image-orchestrator test-tools ## real-engine tests only
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

lint: install ## ruff (lint + format check) and mypy --strict
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install ## apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# make itself turns any failing recipe into exit status 2; the validator's own exit code
# (1 invalid, 2 unreadable) is printed, and is returned as is by scripts/validate-config.
validate-config: install ## check a suite file: make validate-config CONFIG=path.yaml
	@scripts/validate-config $(CONFIG) || { code=$$?; echo "validate-config: exit $$code ($$( [ $$code = 1 ] && echo invalid || echo unreadable))" >&2; exit $$code; }

test-onboarding: ## a fresh clone must reach a serving orchestrator (healthz 200) in < 10 min
	scripts/test-onboarding

clean: ## remove the virtual environment and caches (images stay; see images/README.md)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info

bench: install images ## benchmarks on the real engine (~75 min on 2 cores: the 100- and 200-client bursts with and without a pool, the pool, the lifecycles): bench/results.json, docs/BENCHMARKS.md
	$(PY) scripts/bench.py $(BENCH_ARGS)
	$(PY) scripts/bench-workspace.py
	$(PY) scripts/bench-worker.py

eval-discovery: install ## the discovery ranking on public servers' real tool lists (no Docker; ~1 min): docs/DISCOVERY.md
	$(PY) eval/discovery/evaluate.py $(EVAL_ARGS)

bench-smoke: install images ## the benchmark harnesses with tiny counts, no peers (< 1.5 min; no figure is judged)
	$(PY) scripts/bench.py --smoke $(BENCH_ARGS)
	$(PY) scripts/bench-audit.py --calls 30 --repeats 3 --json bench/tmp/audit-smoke.json
	$(PY) scripts/bench-workspace.py --files 200 --repeats 3 --engine-rounds 1 --json bench/tmp/workspace-smoke.json
	$(PY) scripts/bench-worker.py --rounds 1 --json bench/tmp/worker-smoke.json
