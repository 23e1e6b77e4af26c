"""The ``spark.airflow_ckpt.*`` Spark conf keys: how the Airflow operator configures a job.

The supervisor passes these with ``--conf``; a job can also set them itself. Secrets
are never passed as Spark conf (it shows in the Spark UI): S3 credentials travel in
the standard AWS environment variables.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from airflow_ckpt.errors import ConfigError, JobSettingsError
from airflow_ckpt.options import parse_bool, parse_int
from airflow_ckpt.restart.params import parse_restart_params
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.storage.layout import validate_job_name

T = TypeVar("T")

CONF_PREFIX = "spark.airflow_ckpt."

JOB = CONF_PREFIX + "job"  # job name (storage namespace)
STORAGE = CONF_PREFIX + "storage"  # s3://bucket/prefix or file:///path
ENDPOINT_URL = CONF_PREFIX + "storage.endpoint_url"  # S3-compatible endpoint
REGION_NAME = CONF_PREFIX + "storage.region_name"
CHECKPOINT_CONFIG = CONF_PREFIX + "checkpoint_config"  # JSON object, Flink option names
RESTART_STRATEGY = CONF_PREFIX + "restart_strategy"  # JSON object, Flink option names
RESTORE = CONF_PREFIX + "restore"  # latest | none | <checkpoint or savepoint path>
WORKDIR = CONF_PREFIX + "workdir"  # local working directory (Spark checkpointLocation)
RESCALE_PARTITIONS = CONF_PREFIX + "restore.state_partitions"  # rescale on restore
#: the most state partitions a rescale may ask for: Flink's upper bound of the max
#: parallelism (``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM``, 2^15); Spark's
#: offline repartitioning of 100000 ran for hours holding the lease, with no checkpoint
MAX_STATE_PARTITIONS = 1 << 15
# accept a restore whose sources read with other settings (runtime/sources/settings.py)
ALLOW_SOURCE_CHANGES = CONF_PREFIX + "restore.allow-source-changes"
ATTEMPT = CONF_PREFIX + "attempt"  # supervisor's submission attempt number (for logs)
RUN_ID = CONF_PREFIX + "run_id"  # supervisor run: restart-strategy state is scoped to it


@dataclass(frozen=True, slots=True)
class JobSettings:
    """One submission's ``spark.airflow_ckpt.*`` settings: the operator-driver contract.

    The operator builds one and passes :meth:`to_conf` with ``--conf``; the driver reads
    it back with :meth:`from_conf` (``CheckpointedJob`` arguments, when given, win over
    the confs). Every value is validated there: a bad one raises
    :class:`~airflow_ckpt.errors.JobSettingsError` naming every bad key, carrying the
    settings (bad values defaulted) when the job and storage are valid, so the driver
    can record it in that job's history.
    """

    job: str
    storage_uri: str | None = None
    endpoint_url: str | None = None
    region_name: str | None = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    #: the restart strategy's Flink-named options (validated; ``{}``: Flink's default)
    restart_strategy: Mapping[str, Any] = field(default_factory=dict)
    restore: str = "latest"
    workdir: str | None = None
    #: rescale keyed state to this many partitions on restore (None: keep)
    state_partitions: int | None = None
    #: accept a restore whose sources read with other settings than the checkpoint's
    allow_source_changes: bool = False
    attempt: int = 1
    run_id: str | None = None

    def to_conf(self) -> dict[str, str]:
        """The ``--conf`` values (unset ones left out)."""
        conf = {
            JOB: self.job,
            STORAGE: self.storage_uri,
            ENDPOINT_URL: self.endpoint_url,
            REGION_NAME: self.region_name,
            CHECKPOINT_CONFIG: json.dumps(self.checkpoint_config.to_dict()),
            RESTART_STRATEGY: json.dumps(dict(self.restart_strategy)),
            RESTORE: self.restore,
            WORKDIR: self.workdir,
            RESCALE_PARTITIONS: self.state_partitions,
            ALLOW_SOURCE_CHANGES: "true" if self.allow_source_changes else None,
            ATTEMPT: self.attempt,
            RUN_ID: self.run_id,
        }
        return {key: str(value) for key, value in conf.items() if value is not None}

    @classmethod
    def from_conf(cls, get: Callable[[str], str | None], **given: Any) -> JobSettings:
        """Read and validate the settings; ``given`` (field names) win over the confs.

        ``checkpoint_config`` and ``restart_strategy`` may be given as mappings (or a
        :class:`CheckpointConfig`), and are read from the confs as JSON objects.
        """
        raw = {name: given[name] if given.get(name) is not None else get(key)
               for name, key in _FIELD_KEYS.items()}
        problems: dict[str, str] = {}
        job = str(raw["job"] or "")
        try:
            validate_job_name(job)
        except ConfigError as exc:
            problems.update(exc.problems)
            job = ""
        storage_uri = raw["storage_uri"]
        if not storage_uri:
            problems[STORAGE] = "no checkpoint storage URI"

        def checked(what: str, parse: Callable[[Any], T], value: Any, fallback: T) -> T:
            try:
                return parse(value)
            except ConfigError as exc:
                problems.update({f"{what}.{k}": v for k, v in exc.problems.items()})
            except ValueError as exc:
                problems[what] = str(exc)
            return fallback

        settings = cls(
            job=job,
            storage_uri=storage_uri,
            endpoint_url=raw["endpoint_url"],
            region_name=raw["region_name"],
            checkpoint_config=checked("checkpoint_config", _checkpoint_config,
                                      raw["checkpoint_config"], CheckpointConfig()),
            restart_strategy=checked("restart_strategy", _restart_strategy,
                                     raw["restart_strategy"], {}),
            restore=str(raw["restore"] or "latest"),
            workdir=str(raw["workdir"]) if raw["workdir"] else None,
            state_partitions=checked(RESCALE_PARTITIONS, _state_partitions,
                                     raw["state_partitions"], None),
            allow_source_changes=checked(ALLOW_SOURCE_CHANGES, _flag,
                                         raw["allow_source_changes"], False),
            attempt=checked(ATTEMPT, lambda v: _optional_int(v) or 1, raw["attempt"], 1),
            run_id=raw["run_id"] or None,
        )
        if problems:
            recordable = bool(job) and STORAGE not in problems
            raise JobSettingsError(problems, settings=settings if recordable else None)
        return settings


_FIELD_KEYS = {
    "job": JOB, "storage_uri": STORAGE, "endpoint_url": ENDPOINT_URL,
    "region_name": REGION_NAME, "checkpoint_config": CHECKPOINT_CONFIG,
    "restart_strategy": RESTART_STRATEGY, "restore": RESTORE, "workdir": WORKDIR,
    "state_partitions": RESCALE_PARTITIONS,
    "allow_source_changes": ALLOW_SOURCE_CHANGES, "attempt": ATTEMPT, "run_id": RUN_ID,
}


def _json_object(raw: object, what: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(str(raw)) if str(raw).strip() else {}
    except ValueError as exc:
        raise ConfigError(what, {"<json>": f"not valid JSON: {exc}"}) from exc
    if not isinstance(value, dict):
        raise ConfigError(what, {"<json>": "must be a JSON object"})
    return value


def _checkpoint_config(raw: object) -> CheckpointConfig:
    if isinstance(raw, CheckpointConfig):
        return raw
    return CheckpointConfig.from_dict(_json_object(raw, "checkpoint config"))


def _restart_strategy(raw: object) -> dict[str, Any]:
    params = _json_object(raw, "restart strategy")
    parse_restart_params(params)  # ConfigError names every bad key
    return params


def _flag(value: object) -> bool:
    return False if value in (None, "") else parse_bool(value)


def _state_partitions(value: object) -> int | None:
    if value in (None, ""):
        return None
    return parse_int(value, minimum=1, maximum=MAX_STATE_PARTITIONS)


def _optional_int(value: object) -> int | None:
    if value in (None, ""):
        return None
    return parse_int(value, minimum=1)
