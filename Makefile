# Set-up and everyday commands. Every target installs what it needs into .venv first.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# CPU build of torch by default; a GPU user installs the CUDA build into .venv first
# (see README), and this pin is then already satisfied or can be overridden.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-slow lint bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rloo bandit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

test-slow: $(STAMP)
	$(BIN)/pytest -m slow
