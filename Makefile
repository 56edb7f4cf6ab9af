# The two commands of the README:
#   make run   - set up a virtualenv, pull the small CPU models and the benchmark data, run the main job locally
#   make test  - set up a virtualenv with the dev tools and run the linters and the test suite
# Both are idempotent; everything lives in .venv (torch 2.13.0 CPU build).
# torch uses one thread per core (faster on an idle machine); on a machine busy with other work, run
# `OMP_NUM_THREADS=1 make run`.

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: run test setup setup-dev clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) --upgrade pip

setup: $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e .

setup-dev: $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"

run: setup
	$(BIN)/lemon models pull
	$(BIN)/lemon data pull --config configs/local-cpu.yaml
	$(BIN)/lemon pipeline run --local --config configs/local-cpu.yaml

test: setup-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache
