"""Provider metadata for Airflow's ProvidersManager (entry point ``apache_airflow_provider``).

List only what exists; each part adds its own entry here when it lands.

No ``connection-types`` entry on purpose: the hook uses the ``aws`` connection type users
already have (the Amazon provider registers it, with its UI form). Registering ``aws`` here
too would make the two providers fight over that type's form.
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt import __version__

INTEGRATION = "Checkpointed Spark Structured Streaming"


def get_provider_info() -> dict[str, Any]:
    """The provider-info dict (schema: ``airflow/provider_info.schema.json``)."""
    return {
        "package-name": "airflow-ckpt",
        "name": "Checkpointed Spark (airflow-ckpt)",
        "description": (
            "Flink-style checkpoints, savepoints and restart strategies for PySpark "
            "Structured Streaming jobs, supervised from Airflow."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://spark.apache.org/docs/latest/streaming/index.html",
                "tags": ["apache", "spark", "streaming"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_ckpt.hooks.checkpoint_store",
                                   "airflow_ckpt.hooks.spark_submit"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_ckpt.operators.checkpointed_spark_submit",
                    "airflow_ckpt.operators.savepoint",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_ckpt.sensors.checkpoint"],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_ckpt.triggers.checkpoint",
                                   "airflow_ckpt.triggers.supervision"],
            }
        ],
    }
