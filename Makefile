# DSpark Lab — two entry points for a fresh clone: `make demo` and `make check` (what CI runs:
# lint, format check, type check, then `make test`).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast lint format typecheck check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[real,dev,postgres,bench]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dspark demo

# every test, on 2 workers (pytest-xdist; an idle worker takes tests queued for the other):
# first control/'s own tests under the coverage gate on control/ (coverage's line tracer on
# Python 3.11 doubles the time of every simulation that runs a controller, so the rest of the
# suite runs without it), then all the others, the 15 slowest named
test: $(STAMP)
	$(VENV)/bin/pytest -n 2 --dist worksteal -rs tests/control --cov=control --cov-branch --cov-report=term --cov-fail-under=95
	$(VENV)/bin/pytest -n 2 --dist worksteal -rs --durations=15 --ignore=tests/control

# the edit loop: the tests not marked slow (tests/conftest.py says which are), no coverage
test-fast: $(STAMP)
	$(VENV)/bin/pytest -n 2 --dist worksteal -m "not slow" -p no:cacheprovider

# ruff and mypy are pinned in pyproject's dev extra; their settings live there too.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# what CI runs: lint, format check and type check first, then the tests
check: lint typecheck test

clean:
	rm -rf $(VENV) runs .pytest_cache .coverage
