# The two commands a newcomer needs: `make demo` and `make test`.
# Both build .venv from nothing on first use.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv jars kafka kafka-e2e test test-seaweedfs lint unit unit-matrix demo bench bench-scale bench-hdfs bench-s3a clean chromium crash-points soak simulate faults mutants

venv: $(STAMP)

$(STAMP): pyproject.toml
	@bash scripts/check_java.sh
	@command -v $(PYTHON) >/dev/null || { echo "ERROR: $(PYTHON) not found (Python 3.10-3.13 is required; PYTHON=python3.12 make ... picks another)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	@# no reinstall step: the `spark` extra pins pyspark and pyspark-client to the same
	@# version, whose shared files are identical; this checks the tree is whole.
	$(PY) -c 'from airflow_ckpt.runtime.job.spark_features import check_pyspark_install as c; c()'
	touch $(STAMP)

# The JVM parts the tests run, fetched once with Maven into
# ~/.cache/airflow-ckpt/jars/<artifact>/<version>/ (nothing afterwards; Maven is installed
# with apt-get when missing): the Kafka broker's and the Spark Kafka connector's jars (the
# Kafka tests, make kafka; ~18 s and ~55 MB; versions in airflow_ckpt/testing/jars.py)
# and Hadoop's mini cluster (the HDFS tests, make bench-hdfs; ~14 s and ~104 MB; versions
# in scripts/fetch_hadoop_jars.sh, matched to the Hadoop client pyspark ships).
jars: venv
	@if ! command -v mvn >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing maven to fetch the Kafka and Hadoop jars"; \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq maven >/dev/null; } \
	  || echo "WARNING: maven could not be installed" >&2; \
	fi
	@bash scripts/fetch_jars.sh $(PY)
	@bash scripts/fetch_hadoop_jars.sh >/dev/null

# A real single-node Kafka broker (KRaft) on 127.0.0.1:$(KAFKA_PORT) until Ctrl-C, to try
# the Kafka example (airflow_ckpt/examples/spark_jobs/kafka_counts.py) against.
KAFKA_PORT ?= 9092
kafka: jars
	$(PY) -m airflow_ckpt.testing.kafka_broker --port $(KAFKA_PORT)

# The Kafka example from the built wheel in a real Airflow (tests/e2e/
# test_kafka_example_from_wheel.py: its own broker, trigger, savepoint,
# stop-with-savepoint, restore; Spark resolves the connector's `packages` through Ivy
# from ~/.m2, cache in ~/.cache/airflow-ckpt/ivy). Left out of make test (marker soak):
# it takes longer than the 3 minutes it could add there (801 s at load average ~20).
kafka-e2e: jars
	$(VENV)/bin/pytest -m soak tests/e2e/test_kafka_example_from_wheel.py

lint: venv
	$(VENV)/bin/ruff check airflow_ckpt dags spark_jobs tests bench
	$(VENV)/bin/mypy

# Two pytest-xdist workers, each test module whole on one worker (module-scoped
# SparkSessions, servers and DAG runs stay shared within a module), in collection order
# (the long e2e and integration modules first, the many short unit modules fill the end).
# PYTEST_WORKERS=0 runs it in this process, serially.
PYTEST_WORKERS ?= 2
test: venv jars lint chromium
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The S3 legs again on a second real S3-compatible server, SeaweedFS (`weed mini` on
# 127.0.0.1, one per pytest worker): the storage contract, check-storage, the real-Spark
# kill/restore tests and the demo. The binary is built once into
# ~/.cache/airflow-ckpt/seaweedfs/<version>/ by scripts/build_seaweedfs.sh (needs Go;
# ~7 min on 2 cores and ~2 GB of Go build cache the first time, nothing afterwards).
# AIRFLOW_CKPT_TEST_S3=seaweedfs|external runs any S3 test module the same way
# (tests/fixtures/s3.py).
SEAWEEDFS_TESTS ?= tests/integration/test_storage_contract.py \
  tests/integration/test_check_storage.py tests/integration/test_kill_restore.py
test-seaweedfs: venv
	@bash scripts/build_seaweedfs.sh >/dev/null
	AIRFLOW_CKPT_TEST_S3=seaweedfs $(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder $(SEAWEEDFS_TESTS)
	AIRFLOW_CKPT_TEST_S3=seaweedfs $(PY) -m airflow_ckpt.demo

# Headless Chromium for the browser tests (tests/e2e/test_history_ui.py), installed only
# when missing and apt-get exists; without it those tests skip and say why.
chromium:
	@if [ ! -x /usr/bin/chromium ] && ! command -v chromium >/dev/null 2>&1 \
	    && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium for the browser tests"; \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq chromium >/dev/null; } \
	  || echo "WARNING: chromium could not be installed; browser tests will be skipped" >&2; \
	fi

unit: venv
	$(VENV)/bin/pytest tests/unit

# The longer real-Spark kill and crash variants that make test leaves out (pytest -m soak:
# HDFS-state random kills, a second driver of the same job, the kill test through a worker
# on "another host", the blocking operator's crash recovery, ParquetSink kills on file://,
# the Kafka example from the wheel (make kafka-e2e); about 8 minutes on 2 cores before it).
# SOAK_ROUNDS=n repeats them, each round with fresh random kill seeds.
SOAK_ROUNDS ?= 1
soak: venv
	@for i in $$(seq $(SOAK_ROUNDS)); do echo "== soak round $$i of $(SOAK_ROUNDS)"; \
	  $(VENV)/bin/pytest -m soak || exit 1; done

# Crash before and after every storage mutation of a scripted driver life (make test
# explores every 7th); prints the number of crash points explored.
crash-points: venv
	$(PY) -m airflow_ckpt.testing.crashpoints

# The deterministic whole-system simulation (docs/architecture.md, "Deterministic
# simulation"): SIM_SEEDS seeds, each a schedule in every world (history, sinks,
# sinks-late, savepoints, job; make test runs 200 in tests/unit/test_simulation.py);
# prints "N simulated
# schedules explored, K violations", the first failing seed of each invariant and its
# trace, then its coverage per world (fault sites fired, schedules with a second lease
# holder, writes of deposed drivers, cut-offs). Replay one:
# $(PY) -m airflow_ckpt.testing.simulation --seed S --world W --trace
SIM_SEEDS ?= 2000
SIM_START ?= 0
simulate: venv
	$(PY) -m airflow_ckpt.testing.simulation --seeds $(SIM_SEEDS) --start $(SIM_START) --coverage

# The mutation score of the simulation (docs/architecture.md, "Mutation score"): plants
# one-line bugs in the real runtime, one at a time, in a temporary copy of the package,
# runs make test's 200 seeds in every world against each (2 niced processes) and prints
# killed/survived per mutant and "N of M mutants killed". MUTANTS_ARGS="--only NAME" runs one.
MUTANTS_ARGS ?=
mutants: venv
	$(PY) -m airflow_ckpt.testing.mutants $(MUTANTS_ARGS)

# Real drivers of the example job through a fault-injecting S3 proxy at 2 %, 10 % and
# 30 % faulty requests and through a 2-minute outage (each run: a SIGKILL, a restore, to
# the end); prints false failures (must be 0), output exact and restore exact per rate.
# About 10 minutes on 2 cores. FAULTS_ARGS="--runs 3" runs more stories per rate.
FAULTS_ARGS ?=
faults: venv
	$(PY) -m airflow_ckpt.testing.faults_run $(FAULTS_ARGS)

# The unit tests under every Python that Airflow 3 supports and this package accepts
# (3.10-3.13), each in its own .venv-<version>; a version that is not installed is skipped
# with a message. UNIT_PYTHONS=3.12 make unit-matrix runs one.
UNIT_PYTHONS ?= 3.10 3.11 3.12 3.13
unit-matrix:
	@status=0; for v in $(UNIT_PYTHONS); do \
	  py=python$$v; $$py -c '' 2>/dev/null \
	    || py=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v 2>/dev/null | tail -1); \
	  if [ -z "$$py" ] || ! $$py -c '' 2>/dev/null; then \
	    echo "== python$$v: not installed, skipped"; continue; fi; \
	  echo "== python$$v ($$py)"; \
	  $(MAKE) --no-print-directory PYTHON=$$py VENV=.venv-$$v venv >/dev/null || { status=1; continue; }; \
	  .venv-$$v/bin/pytest -q -p no:cacheprovider tests/unit || status=1; \
	done; exit $$status

demo: venv
	$(PY) -m airflow_ckpt.demo

bench: venv
	$(PY) -m bench

bench-scale: venv
	$(PY) -m bench.scale

# Capture and restore with the working directory on HDFS (Hadoop's mini cluster, jars
# fetched once by scripts/fetch_hadoop_jars.sh) vs on the local disk, as ratios.
bench-hdfs: venv
	$(PY) -m bench.hdfs

# Spark's working directory on s3a:// (moto's S3 server) vs local: time and S3 requests
# per batch, and a checkpoint's capture by S3A GETs vs by server-side COPY. Needs
# hadoop-aws and the AWS SDK v2 bundle (~690 MB, fetched once by Maven into
# ~/.cache/airflow-ckpt/jars/hadoop-aws/; never by `make jars` or the tests).
bench-s3a: venv
	$(PY) -m airflow_ckpt.testing.jars --s3a
	$(PY) -m bench.s3a

clean:
	rm -rf $(VENV) .venv-3.* .pytest_cache .mypy_cache .ruff_cache build *.egg-info
