# The two commands for a new machine are `make run` and `make test` (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## Install and simulate the built-in default scenario (Llama-3-8B on one H100, chat traffic).
run: $(STAMP)
	$(BIN)/lastmile run

## Install and run the test suite.
test: $(STAMP)
	$(BIN)/python -m pytest

## The speed benchmark (an explicit command, never part of the tests).
bench: $(STAMP)
	$(BIN)/python benchmarks/llm_trace.py
	$(BIN)/python benchmarks/dit_pipefusion.py

clean:
	rm -rf $(VENV) runs .pytest_cache
