# squall: the same commands locally and in CI.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev-server-spark

.PHONY: run test lint typecheck bench bench-small bench-floor bench-sqs bench-ha flow-bench profile profile-lease soak clean chromium etcd k8s-dev-keys postgresql

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip

# everything: the dev tools, the server extra (the master and the data node) and the spark
# extra (PySpark, run on Java 17+): the suite runs real servers and SparkSessions
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,server,spark]'
	touch $(STAMP)

## run: the example pipeline on Spark: `squall dev` (a master and 3 data nodes, data in
##      .squall/example), index the Python standard library in three stages, then keep the
##      cluster running until Ctrl-C (the dashboard URL is printed).
##      `make run ARGS=--once` stops the cluster at the end instead.
run: $(STAMP)
	$(BIN)/python examples/stdlib_index.py $(ARGS)

# Hypothesis runs one fixed, printed seed in `make test` (reproducible CI); `make soak`
# runs MODEL_SEEDS random ones. Replay any seed: make test HYPOTHESIS_SEED=<n>
HYPOTHESIS_SEED ?= 20261122
MODEL_SEEDS ?= 200
# pytest-xdist workers, each given whole test files (a module's cluster starts once);
# TEST_WORKERS=0 runs the suite in this one process
TEST_WORKERS ?= 2

## test: lint and typecheck, then the test suite (real servers on 127.0.0.1; a short chaos
##       soak and the model test on one seed) on $(TEST_WORKERS) workers; `make soak` runs
##       the long ones
test: $(STAMP) lint typecheck chromium etcd
	@echo "hypothesis seed: $(HYPOTHESIS_SEED)"
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --hypothesis-seed=$(HYPOTHESIS_SEED)

# the dashboard's browser test drives Debian's chromium: installed here when missing and
# apt-get can (as root); otherwise that one test is skipped and says why
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get \
	  >/dev/null 2>&1 && apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -q chromium >/dev/null; } || echo "note: no chromium (apt-get \
	  install chromium); the dashboard's browser test will be skipped"

# the etcd elector's tests run a real etcd (Debian's etcd-server): installed here when
# missing and apt-get can (as root); otherwise those tests are skipped and say why
etcd:
	@command -v etcd >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get \
	  >/dev/null 2>&1 && apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -q etcd-server >/dev/null; } || echo "note: no etcd (apt-get \
	  install etcd-server); the etcd elector's tests will be skipped"

# lint-imports: the rooms' boundaries, [tool.importlinter] in pyproject.toml
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# mypy reads the four packages under their installed names (squall.master, ...) through a
# tree of links in build/typecheck: it cannot see the editable install's import hook, and
# checking master/ as `master` would type every `squall.*` import as Any. Strictness per
# module is in pyproject.toml ([tool.mypy]).
TYPECHECK_PATH := build/typecheck
typecheck: $(STAMP)
	@mkdir -p $(TYPECHECK_PATH)/squall
	@for d in master datanode client common; do ln -sfn ../../../$$d $(TYPECHECK_PATH)/squall/$$d; done
	MYPYPATH=$(TYPECHECK_PATH) $(BIN)/mypy -p squall.master -p squall.datanode -p squall.client \
	  -p squall.common -p bench

## bench: every benchmark; results in bench/results/ (takes a while: run on a quiet machine)
bench: $(STAMP) postgresql
	$(BIN)/python -m bench.master_bench
	$(BIN)/python -m bench.admin_bench
	$(BIN)/python -m bench.datanode_bench
	$(BIN)/python -m bench.spark_bench
	$(BIN)/python -m bench.client_bench
	$(BIN)/python -m bench.dashboard_bench
	$(BIN)/python -m bench.flow_bench
	$(BIN)/python -m bench.sqs_bench
	$(BIN)/python -m bench.small_tasks
	$(BIN)/python -m bench.ha_bench

## bench-small: small tasks (1 KiB) on squall and a throwaway PostgreSQL (SKIP LOCKED, fsync
##              on) in one run, each figure as a ratio to PostgreSQL;
##              bench/results/small-tasks.md (`ARGS=--quick` for 2,000 tasks per workload)
bench-small: $(STAMP) postgresql
	$(BIN)/python -m bench.small_tasks $(ARGS)

## bench-floor: A.put's shape with no work in it (three bare Python services, the same
##              fsyncs) against squall's A.put and PostgreSQL's, one run;
##              bench/results/put-floor.md
bench-floor: $(STAMP) postgresql
	$(BIN)/python -m bench.put_floor $(ARGS)

# the small-task benchmark's baseline runs Debian's PostgreSQL server: installed here when
# missing and apt-get can (as root); otherwise the benchmark runs squall alone and says why
postgresql:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -q \
	  >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql \
	  >/dev/null; } || echo "note: no PostgreSQL server (apt-get install postgresql); the \
	  small-task benchmark will run without its baseline"

## flow-bench: lease throughput with flow control (limits, fairness; 10,000 keys) against
##             the same queue without; bench/results/flow.md
flow-bench: $(STAMP)
	$(BIN)/python -m bench.flow_bench

## bench-sqs: the SQS endpoint through boto3 against squall's own client, same cluster and
##            run; prints messages/s and the ratios (recorded in bench/results/sqs-endpoint.md)
bench-sqs: $(STAMP)
	$(BIN)/python -m bench.sqs_bench


## bench-ha: a master set of three vs one master (batched put, lease+ack) and failover
##           times over 10 kills; bench/results/master-set.md
bench-ha: $(STAMP)
	$(BIN)/python -m bench.ha_bench

## profile: where the client workloads that miss their targets (A.put, B.put, D) spend
##          their time: CPU per task by process and thread, and py-spy samples by
##          category; bench/results/client-profile.md (py-spy needs root or ptrace rights)
profile: $(STAMP)
	$(BIN)/pip install -q 'py-spy>=0.4'
	$(BIN)/python -m bench.client_profile

## profile-lease: the same for the lease side (A.lease_done: lease(1, payloads, done=previous)
##                one at a time; B.lease_done: batches(100)); bench/results/lease-profile.md
profile-lease: $(STAMP)
	$(BIN)/python -m pip install -q 'py-spy>=0.4'
	$(BIN)/python -m bench.client_profile --only L,R --stem lease-profile

## soak: the master's model test on MODEL_SEEDS random seeds (each printed; a failure
##       stops with its seed), the flow-control rate run, a master killed -9 under load
##       50 times (tests/test_crash.py; `make test`: 10), then the chaos soak: SOAK_MINUTES
##       of seeded faults against a master and 5 data nodes, checked against a ledger
##       (docs/testing.md; replay with `$(BIN)/python -m bench.soak --seed N`), the same
##       against a master set of SOAK_MASTERS (0: not run) with its own faults in the
##       schedule (the leader killed -9, SIGSTOPped past its lease, cut off from the
##       elector (etcd) or from the other members, a standby wiped and re-added), then a
##       master set's leader killed 50 times under load, checked against a ledger.
##       SOAK_ARGS go to both soaks (e.g. "--seed N"; one soak alone:
##       `$(BIN)/python -m bench.soak --masters 3 --kinds ...`)
SOAK_MINUTES ?= 10
SOAK_MASTERS ?= 3
SOAK_ARGS ?=
soak: $(STAMP) etcd
	@for i in $$(seq 1 $(MODEL_SEEDS)); do \
	  seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
	  echo "model test $$i/$(MODEL_SEEDS): --hypothesis-seed=$$seed"; \
	  SQUALL_MODEL_EXAMPLES=10 $(BIN)/pytest -q -x -p no:cacheprovider tests/test_model.py \
	    --hypothesis-seed=$$seed > .model-seed.log 2>&1 || { tail -40 .model-seed.log; \
	    echo "FAILED: SQUALL_MODEL_EXAMPLES=10 $(BIN)/pytest tests/test_model.py --hypothesis-seed=$$seed replays it"; exit 1; }; \
	done; rm -f .model-seed.log
	SQUALL_FLOW_SOAK=1 $(BIN)/pytest -q -x -p no:cacheprovider tests/test_flow_e2e.py
	SQUALL_CRASH_KILLS=50 $(BIN)/pytest -q -x -p no:cacheprovider tests/test_crash.py \
	  -k kill9_under_load
	$(BIN)/python -m bench.soak --minutes $(SOAK_MINUTES) $(SOAK_ARGS)
	[ "$(SOAK_MASTERS)" = 0 ] || $(BIN)/python -m bench.soak --minutes $(SOAK_MINUTES) \
	  --masters $(SOAK_MASTERS) $(SOAK_ARGS)
	SQUALL_HA_KILLS=50 $(BIN)/pytest -q -x -p no:cacheprovider tests/test_ha_failover.py \
	  -k kill_the_leader

## k8s-dev-keys: the dev overlay's keys and credentials, made for this install (never
##      committed) into deploy/k8s/overlays/dev/keys/ (kubectl apply -k needs them)
k8s-dev-keys: $(STAMP)
	SQUALL=$(BIN)/squall sh deploy/k8s/make-keys.sh

clean:
	rm -rf $(VENV) .squall build *.egg-info
