# squall: the same commands locally and in CI.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench soak clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

## run: start a local master on 127.0.0.1:7070 (data in .squall/)
run: $(STAMP)
	$(BIN)/squall master --data-dir .squall/master --port 7070

## test: lint, then the whole test suite (real servers on 127.0.0.1)
test: $(STAMP) lint
	$(BIN)/pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy master common client datanode

## bench: the benchmarks; results in bench/results/
bench: $(STAMP)
	$(BIN)/python -m bench.master_bench

## soak: long-running tests excluded from `make test`
soak: $(STAMP)
	$(BIN)/pytest -q -m slow

clean:
	rm -rf $(VENV) .squall build *.egg-info
