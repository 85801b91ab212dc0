# The two commands for a new machine are `make run` and `make test` (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run test test-slow bench bench-series venv clean bytecode

# What running needs (the package and its dependencies), and what the tests need on top (the dev extra).
$(RUN_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## The package's bytecode, as a regular (non-editable) install has it: where PYTHONDONTWRITEBYTECODE is set,
## an editable source tree is otherwise recompiled by every process that imports it (~0.2 s per `lastmile`
## process, the CLI tests' subprocesses included). Only files changed since the last call are compiled.
bytecode: $(RUN_STAMP)
	$(BIN)/python -m compileall -q simulator

## Install and simulate the built-in default scenario (Llama-3-8B on one H100, chat traffic).
run: $(RUN_STAMP) bytecode
	$(BIN)/lastmile run

## Install and run the test suite, on every core (pytest-xdist: the tests share no files or state; the
## slow suite's validation families already run a process per core, so it stays in one).
test: $(STAMP) bytecode
	$(BIN)/python -m pytest -n auto

## The slow tests the default run leaves out (every validation family, the notebooks, the report's suite);
## CI runs them after `make test`.
test-slow: $(STAMP) bytecode
	$(BIN)/python -m pytest -m slow

## The speed benchmark (an explicit command, never part of the tests): `lastmile run` of the 10k-request
## trace scenario as a whole process, spans off and on, in seconds, MiB and reference units (1M SimPy
## timeouts timed in the same invocation). Records go to runs/bench/results.jsonl (ignored by git);
## `make bench BENCH_ARGS=--record` also appends them to the tracked benchmarks/results.jsonl.
bench: $(STAMP) bytecode
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/dit_pipefusion.py

## The same measurement at 1k, 10k, 100k and 1M requests (long: the 1M run takes many minutes per round).
## Stop early with `make bench-series MAX_REQUESTS=100000`; fewer rounds with BENCH_ARGS="--repeats 1".
bench-series: $(STAMP) bytecode
	$(BIN)/python benchmarks/run.py --series $(if $(MAX_REQUESTS),--max-requests $(MAX_REQUESTS)) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
