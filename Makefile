# The two commands a newcomer needs: `make demo` and `make test`.
# Both build .venv from nothing on first use.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test lint unit demo bench bench-scale clean chromium

venv: $(STAMP)

$(STAMP): pyproject.toml
	@bash scripts/check_java.sh
	@command -v $(PYTHON) >/dev/null || { echo "ERROR: $(PYTHON) not found (Python 3.11 is required)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	@# pyspark-client (from the Spark provider) and pyspark share the `pyspark` package;
	@# reinstall the full pyspark last so its Python files match its jars.
	$(PY) -m pip install -q --force-reinstall --no-deps "pyspark==$$($(PY) -c 'import importlib.metadata as m; print(m.version("pyspark"))')"
	touch $(STAMP)

lint: venv
	$(VENV)/bin/ruff check airflow_ckpt dags spark_jobs tests bench
	$(VENV)/bin/mypy

test: venv lint chromium
	$(VENV)/bin/pytest

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

demo: venv
	$(PY) -m airflow_ckpt.demo

bench: venv
	$(PY) -m bench

bench-scale: venv
	$(PY) -m bench.scale

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
