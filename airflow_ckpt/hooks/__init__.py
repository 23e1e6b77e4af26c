"""Hooks: the checkpoint store (S3-compatible or ``file://``) and spark-submit.

This package module stays import-free so light modules (the UI plugin) can share its
constants without loading a hook.
"""

DEFAULT_CONN_ID = "aws_default"
"""The Airflow connection storage is reached with unless a task names another."""
