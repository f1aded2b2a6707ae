# Nodus — one entry point for people and CI. Everything it needs is installed here, nothing by hand.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
export PATH := $(abspath $(BIN)):$(PATH)
PYTEST_ARGS ?=

.PHONY: help venv system-deps test lint fmt run up down bench clean

help:
	@echo "make run     bring up the whole local stack and run an example Sweep"
	@echo "make test    the whole suite (lint, import layering, tests)"
	@echo "make up/down start/stop the local stack in the background"
	@echo "make lint    ruff + mypy strict on the libraries + import layering"
	@echo "make bench   benchmarks, written to docs/benchmarks.md"

# The virtual environment, from the one lock for the whole tree (uv workspace, ADR-001).
$(BIN)/.synced: uv.lock pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@test -x $(UV) || $(BIN)/pip install -q uv==0.13.8
	$(UV) sync --frozen --all-packages --quiet
	@touch $@

venv: $(BIN)/.synced

# Debian packages the real parts need: podman (Docker Engine API for the node agent's containers),
# runc (crun cannot set rlimits in this sandbox) and a static busybox to build local test images.
system-deps:
	@missing=""; for p in podman runc busybox-static shellcheck chromium chromium-driver fonts-dejavu-core; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing Debian packages:$$missing (install them with apt-get as root)"; exit 1; fi; \
	fi

lint: venv
	$(BIN)/ruff check libs services tests bench
	$(BIN)/ruff format --check libs services tests bench
	$(BIN)/mypy libs/nodus_schema/src libs/nodus_kit/src libs/nodus_testing/src libs/nodus_cli/src libs/nodus_sdk/src
	$(BIN)/lint-imports

fmt: venv
	$(BIN)/ruff format libs services tests bench
	$(BIN)/ruff check --fix libs services tests bench

test: venv system-deps lint
	$(BIN)/pytest $(PYTEST_ARGS)

bench: venv
	$(BIN)/python -m bench

# The whole stack in .nodus/run (apart from `make up`'s), the example Sweep through the real CLI, the
# cell table live until the Sweep ends, then everything stopped again, whatever happened.
RUN_ROOT := .nodus/run
run: venv system-deps
	@trap '$(BIN)/python -m nodus_testing.localstack down --root $(RUN_ROOT)' EXIT; \
	 $(BIN)/python -m nodus_testing.localstack up --fresh --root $(RUN_ROOT) && \
	 set -a && . $(RUN_ROOT)/local.env && set +a && \
	 $(BIN)/nodus apply -f examples/sweep.yaml && \
	 $(BIN)/nodus get sweep hash-bench --watch

up: venv system-deps
	$(BIN)/python -m nodus_testing.localstack up

down: venv
	$(BIN)/python -m nodus_testing.localstack down

clean: down
	rm -rf $(VENV) .nodus .mypy_cache .ruff_cache .pytest_cache
