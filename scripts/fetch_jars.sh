#!/usr/bin/env bash
# Fetch the Kafka broker's and the Spark Kafka connector's jars once into
# ~/.cache/airflow-ckpt/jars/<artifact>/<version>/ (offline afterwards) and print where.
# Versions are pinned in airflow_ckpt/testing/jars.py; the connector's follows the
# installed pyspark. Needs Maven (mvn) and Maven Central the first time only.
#
# Usage: scripts/fetch_jars.sh [python]   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${1:-.venv/bin/python}" -m airflow_ckpt.testing.jars
