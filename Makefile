# The README's quick start: `make demo` and `make test`, each from a fresh checkout.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: setup demo test lint browser clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,parity,environments]'
	touch $(STAMP)

setup: $(STAMP)

# Browser tests drive Debian's Chromium; Playwright's own browser download is never used.
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; \
	  else \
	    echo "browser tests need $(CHROMIUM): run 'sudo apt-get install chromium'" >&2; exit 1; \
	  fi; \
	fi

demo: setup
	$(VENV)/bin/tandem up --demo

# ruff, then the dependency rules between packages ([tool.importlinter] in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	PYTHONPATH=platform $(VENV)/bin/lint-imports

test: setup browser lint
	$(VENV)/bin/pytest

clean:
	rm -rf var .pytest_cache
