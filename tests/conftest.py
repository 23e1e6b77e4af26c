"""Shared pytest setup. Fixtures live in tests/fixtures/ (one module per concern)."""

import logging

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest closed the captured streams; at INFO that prints a logging traceback.
logging.getLogger("py4j").setLevel(logging.WARNING)

pytest_plugins = [
    "tests.fixtures.isolation",
    "tests.fixtures.s3",
    "tests.fixtures.faults",
    "tests.fixtures.spark",
    "tests.fixtures.airflow_env",
    "tests.fixtures.spark_standalone",
    "tests.fixtures.metrics",
    "tests.fixtures.kafka",
    "tests.fixtures.hdfs",
    "tests.fixtures.wheel",
]
