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
	$(BIN)/rloo demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint browser
	$(BIN)/pytest

# Debian's chromium for the headless-browser check of the HTML run report
# (tests/test_report_browser.py, skipped without it). Installs only as root or with
# password-less sudo; never fails the build, a fresh machine pays the apt install once.
.PHONY: browser
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "chromium not found: install it with your package manager; the browser test is skipped"; \
	elif [ "$$(id -u)" = 0 ] || (command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null); then \
		as=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$as env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$as env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
		echo "could not install chromium; the browser test is skipped"; \
	else \
		echo "chromium not found: run 'sudo apt-get install -y chromium'; the browser test is skipped"; \
	fi

test-slow: $(STAMP)
	$(BIN)/pytest -m slow
