"""Shared pytest setup. Fixtures live in tests/fixtures/ (one module per concern)."""

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.spark",
    "tests.fixtures.airflow_env",
    "tests.fixtures.spark_standalone",
]
