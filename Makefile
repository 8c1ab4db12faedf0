# squall: the same commands locally and in CI.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev-spark

.PHONY: run test lint typecheck bench soak clean chromium

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip

# dev tools and the spark extra (PySpark, run on Java 17+): the suite runs real SparkSessions
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $(STAMP)

## run: the example pipeline on Spark: `squall dev` (a master and 3 data nodes, data in
##      .squall/example), index the Python standard library in three stages, then keep the
##      cluster running until Ctrl-C (the dashboard URL is printed).
##      `make run ARGS=--once` stops the cluster at the end instead.
run: $(STAMP)
	$(BIN)/python examples/stdlib_index.py $(ARGS)

## test: lint, then the test suite except the slow soak tests (real servers on 127.0.0.1);
##       `make soak` runs the slow ones
test: $(STAMP) lint chromium
	$(BIN)/pytest -q -m "not slow"

# the dashboard's browser test drives Debian's chromium: installed here when missing and
# apt-get can (as root); otherwise that one test is skipped and says why
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get \
	  >/dev/null 2>&1 && apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -q chromium >/dev/null; } || echo "note: no chromium (apt-get \
	  install chromium); the dashboard's browser test will be skipped"

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy master common client datanode

## bench: every benchmark; results in bench/results/ (takes a while: run on a quiet machine)
bench: $(STAMP)
	$(BIN)/python -m bench.master_bench
	$(BIN)/python -m bench.admin_bench
	$(BIN)/python -m bench.datanode_bench
	$(BIN)/python -m bench.spark_bench
	$(BIN)/python -m bench.client_bench
	$(BIN)/python -m bench.dashboard_bench

## soak: long-running tests excluded from `make test`
soak: $(STAMP)
	$(BIN)/pytest -q -m slow

clean:
	rm -rf $(VENV) .squall build *.egg-info
