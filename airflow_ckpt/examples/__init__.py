"""The example DAGs and Spark jobs, shipped in the package, and ``airflow-ckpt examples``.

``dags/`` and ``spark_jobs/`` beside this file are the examples themselves (package data
in the wheel; the repository's top-level ``dags`` and ``spark_jobs`` are links to them).
The main one is the DAG ``streaming_rate_counts``: Spark's rate source, running counts in
Spark's state, exactly-once output, until a stop-with-savepoint ends it.

``airflow-ckpt [--storage URI] examples <dags folder>`` puts them into an Airflow
deployment: :func:`prepare_storage` checks the storage (and creates the bucket when
asked), :func:`copy_examples` copies the DAGs into the DAGs folder and the jobs beside it,
and :func:`settings` says what every Airflow component's environment must hold for the
DAGs to find the jobs and the storage (:func:`report` prints all of it).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from airflow_ckpt import __version__
from airflow_ckpt.errors import AirflowCkptError, BucketNotFoundError
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.runtime.storage.s3 import S3Storage

DAGS_DIR = Path(__file__).resolve().parent / "dags"
JOBS_DIR = Path(__file__).resolve().parent / "spark_jobs"
#: the example DAGs' storage when ``$AIRFLOW_CKPT_STORAGE`` is not set
DEFAULT_STORAGE = "file:///tmp/airflow-ckpt/checkpoints"
MAIN_DAG = "streaming_rate_counts"
MAIN_JOB = "rate-counts"


class ExamplesError(AirflowCkptError):
    """The examples could not be put in place (nothing was copied)."""


def default_jobs_dir(dags_folder: Path) -> Path:
    """``spark_jobs`` beside the DAGs folder: where the example DAGs look by default."""
    return dags_folder.parent / "spark_jobs"


@dataclass(frozen=True, slots=True)
class CopiedFile:
    """One shipped file and what :func:`copy_examples` did with it."""

    source: Path
    target: Path
    #: ``copied`` (new), ``replaced`` (differed; ``force``) or ``unchanged`` (identical)
    action: Literal["copied", "replaced", "unchanged"]


def copy_examples(dags_folder: Path, jobs_dir: Path, *, force: bool = False
                  ) -> list[CopiedFile]:
    """Copy the example DAGs into ``dags_folder`` and the Spark jobs into ``jobs_dir``.

    A target identical to the shipped file is left alone; a different one is replaced
    only with ``force``. Every target is checked before anything is written, so a refusal
    (``ExamplesError`` naming every conflicting file) copies nothing. Each file is
    written to a temporary name and renamed, so Airflow's DAG processor never parses half
    a file. Creates the folders if needed.
    """
    plan: list[CopiedFile] = []
    conflicts: list[str] = []
    for source_dir, target_dir in ((DAGS_DIR, dags_folder), (JOBS_DIR, jobs_dir)):
        for source in sorted(source_dir.glob("*.py")):
            target = target_dir / source.name
            if not target.exists():
                plan.append(CopiedFile(source, target, "copied"))
            elif not target.is_file():
                conflicts.append(f"{target} (not a file)")
            elif target.read_bytes() == source.read_bytes():
                plan.append(CopiedFile(source, target, "unchanged"))
            elif force:
                plan.append(CopiedFile(source, target, "replaced"))
            else:
                conflicts.append(str(target))
    if conflicts:
        raise ExamplesError(
            "refusing to replace files that differ from the shipped examples (--force "
            "replaces them): " + ", ".join(conflicts))
    for item in plan:
        if item.action == "unchanged":
            continue
        item.target.parent.mkdir(parents=True, exist_ok=True)
        tmp = item.target.with_name(f".{item.target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(item.source.read_bytes())
        os.replace(tmp, item.target)
    return plan


def prepare_storage(storage: CheckpointStorage, *, create_bucket: bool) -> str:
    """Check that the jobs can use ``storage``; return a sentence saying what was found.

    S3: the bucket must exist and accept the credentials (``HeadBucket``). A missing
    bucket is created when ``create_bucket`` is true and is an ``ExamplesError``
    otherwise. ``file://``: nothing to check (the first write creates the directory).
    """
    if not isinstance(storage, S3Storage):
        return (f"{storage.uri}: local storage; the jobs create it on their first write "
                "(every Airflow worker and Spark driver must see this path)")
    try:
        storage.check()
    except BucketNotFoundError as exc:
        if not create_bucket:
            raise ExamplesError(f"{exc}; pass --create-bucket to create it") from exc
        storage.create_bucket()
        return f"created bucket {storage.bucket!r} at {storage.endpoint_url}"
    return f"bucket {storage.bucket!r} exists at {storage.endpoint_url}"


@dataclass(frozen=True, slots=True)
class Setting:
    """An environment variable the Airflow components need, and why."""

    name: str
    value: str
    why: str

    def export_line(self) -> str:
        return f"export {self.name}={shlex.quote(self.value)}"


def settings(storage_uri: str, jobs_dir: Path, *, conn_id: str | None = None,
             endpoint_url: str | None = None, region_name: str | None = None,
             ) -> list[Setting]:
    """The environment of every Airflow component for the copied example DAGs.

    The storage and the jobs' folder always; for S3 the storage connection too: the
    named ``conn_id`` if one is given (it must exist in Airflow), else ``aws_default``
    as an ``AIRFLOW_CONN_*`` variable holding the endpoint and region (no secrets: the
    credentials come from the AWS environment).
    """
    found = [
        Setting("AIRFLOW_CKPT_STORAGE", storage_uri, "the example DAGs' checkpoint storage"),
        Setting("AIRFLOW_CKPT_JOBS_DIR", str(jobs_dir), "where the example DAGs find the "
                "Spark jobs (spark-submit's application)"),
    ]
    if not storage_uri.startswith(("s3://", "s3a://")):
        return found
    if conn_id:
        found.append(Setting("AIRFLOW_CKPT_CONN_ID", conn_id,
                             "the aws connection the example DAGs reach the storage with"))
        return found
    extra = {k: v for k, v in (("endpoint_url", endpoint_url), ("region_name", region_name))
             if v}
    if extra:
        found.append(Setting(
            "AIRFLOW_CONN_AWS_DEFAULT",
            json.dumps({"conn_type": "aws", "extra": extra}, sort_keys=True),
            "the storage connection (aws_default): endpoint and region, no secrets"))
    return found


def report(copied: list[CopiedFile], storage_note: str, env: list[Setting]) -> str:
    """What ``airflow-ckpt examples`` prints: the files, the storage, the settings and the
    next step."""
    width = max(len(c.action) for c in copied)
    lines = [f"airflow-ckpt {__version__} examples:"]
    lines += [f"  {c.action.ljust(width)}  {c.target}" for c in copied]
    lines += ["", f"storage: {storage_note}", "",
              "Set these in the environment of every Airflow component (scheduler, "
              "dag-processor, triggerer, api-server, workers; also of `airflow dags test`) "
              "before starting it:", ""]
    for setting in env:
        lines += [f"# {setting.why}", setting.export_line()]
    s3 = env[0].value.startswith(("s3://", "s3a://"))
    if s3 and not any(s.name == "AIRFLOW_CKPT_CONN_ID" for s in env):
        lines += ["# credentials: the AWS environment of Airflow and the Spark drivers "
                  "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance "
                  "role)"]
    lines += ["", "Then start the streaming example (it runs until stopped with a savepoint):",
              f"  airflow dags test {MAIN_DAG} -c '{{\"rows_per_second\": 10}}'"
              "     # or trigger it in the UI",
              "(keep rows_per_second when you restore: the rate source numbers its rows by "
              "elapsed seconds times the rate)",
              "and follow the README, \"Use it from Airflow\": take a savepoint "
              "(savepoint_manual), stop with a savepoint (stop=true), restore from it."]
    return "\n".join(lines) + "\n"
