"""airflow-ckpt: Flink-style checkpoints for PySpark Structured Streaming, run from Airflow.

The package root imports nothing heavy: ``airflow_ckpt.runtime`` and
``airflow_ckpt.restart`` work without Airflow installed (they run inside the
Spark driver); the Airflow parts live in ``hooks``, ``operators``, ``sensors``,
``triggers`` and ``plugins``.
"""

__version__ = "0.1.0"
