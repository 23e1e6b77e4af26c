"""What the example DAGs share: their settings from the environment and the DAG params
every example job has (its name, the storage, restore, the Spark master).

The DAGs import it from the installed package (``airflow-ckpt examples`` copies only the
DAG files), so the settings read the same variables in every Airflow component:
``$AIRFLOW_CKPT_STORAGE`` (default :data:`~airflow_ckpt.examples.DEFAULT_STORAGE`),
``$AIRFLOW_CKPT_CONN_ID`` (default ``aws_default``) and ``$AIRFLOW_CKPT_JOBS_DIR``
(default: ``spark_jobs`` beside the DAGs folder). Reading them does no I/O.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import Param

from airflow_ckpt.examples import DEFAULT_STORAGE
from airflow_ckpt.restart import restart_params_json_schema

#: where the example DAGs keep checkpoints
STORAGE = os.environ.get("AIRFLOW_CKPT_STORAGE", DEFAULT_STORAGE)
#: the Airflow connection of the storage (its credentials and endpoint)
CONN_ID = os.environ.get("AIRFLOW_CKPT_CONN_ID", "aws_default")
#: the prefix of the example jobs' own Spark settings
DEMO = "spark.airflow_ckpt.demo."
#: a job name: its directory in the storage
JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
#: the Spark settings every example submits with (small local runs, no UI port)
SPARK_CONF = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}


def jobs_dir(dag_file: str) -> Path:
    """The example Spark jobs: ``$AIRFLOW_CKPT_JOBS_DIR``, or ``spark_jobs`` beside the
    folder of ``dag_file`` (where ``airflow-ckpt examples`` copies them)."""
    return Path(os.environ.get("AIRFLOW_CKPT_JOBS_DIR",
                               Path(dag_file).resolve().parent.parent / "spark_jobs"))


def job_params(job_name: str, *, restore: str = "latest | none | a savepoint URI (the XCom "
               "of savepoint_manual) or checkpoint path") -> dict[str, Param]:
    """The params of an example job's run: ``job_name`` (default ``job_name``),
    ``storage``, ``restore`` (described by ``restore``) and ``master``."""
    return {
        "job_name": Param(job_name, type="string", pattern=JOB_NAME_PATTERN,
                          description="Job name: the job's directory in the storage."),
        "storage": Param(STORAGE, type="string", pattern=r"^(s3a?|file)://",
                         description="Checkpoint storage: s3://bucket/prefix or file:///path."),
        "restore": Param("latest", type="string", minLength=1, description=restore),
        "master": Param("local[2]", type="string",
                        description="Spark master; empty = the spark_default connection's"),
    }


def checkpoint_params(interval: str) -> dict[str, Param]:
    """``checkpoint_interval`` (default ``interval``) and ``num_retained`` (3)."""
    return {
        "checkpoint_interval": Param(interval, type="string",
                                     description="execution.checkpointing.interval"),
        "num_retained": Param(3, type="integer", minimum=1,
                              description="execution.checkpointing.num-retained"),
    }


def restart_param(delay: str) -> Param:
    """``restart_strategy``: fixed-delay, 3 attempts ``delay`` apart by default; the form
    validates it against the restart strategies' JSON schema (the parser's message)."""
    return Param(
        {"type": "fixed-delay", "fixed-delay.attempts": 3, "fixed-delay.delay": delay},
        description="Flink restart-strategy options (Flink option names; "
                    "'restart-strategy.' prefix optional).",
        schema=restart_params_json_schema(),
    )


def submit_args() -> dict[str, Any]:
    """The operator arguments of an example job's run, templated from :func:`job_params`,
    :func:`checkpoint_params` and :func:`restart_param`."""
    return {
        "restart_strategy": "{{ params.restart_strategy }}",
        "job_name": "{{ params.job_name }}",
        "checkpoint_storage": "{{ params.storage }}",
        "storage_conn_id": CONN_ID,
        "checkpoint_config": {
            "execution.checkpointing.interval": "{{ params.checkpoint_interval }}",
            "execution.checkpointing.num-retained": "{{ params.num_retained }}",
        },
        "restore": "{{ params.restore }}",
        "master": "{{ params.master }}",
        "driver_memory": "1g",
    }
