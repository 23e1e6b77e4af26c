"""Helpers for tests and the demo: a real S3-compatible endpoint on 127.0.0.1.

Nothing here imports Airflow; moto (a dev/demo dependency) is imported only when a
server is started.
"""

from airflow_ckpt.testing.s3_server import S3Endpoint, local_s3_server

__all__ = ["S3Endpoint", "local_s3_server"]
