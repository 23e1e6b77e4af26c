"""The checkpointing arguments of :class:`CheckpointedSparkSubmitOperator`, validated.

:func:`validate_arguments` checks every argument at once and raises one
:class:`CheckpointedJobConfigError` naming every bad key (prefixed with the argument,
e.g. ``restart_strategy.fixed-delay.attempts``); it touches no storage.
:func:`check_restore_target` resolves an explicit restore path against the catalog.
:meth:`ValidatedArgs.spark_conf` is the ``spark.airflow_ckpt.*`` conf of one submission.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_ckpt.errors import AirflowCkptError, ConfigError, InvalidStorageUriError
from airflow_ckpt.restart import RestartStrategy, restart_strategy_from_params
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.sparkconf import JobSettings
from airflow_ckpt.runtime.storage.factory import parse_storage_uri
from airflow_ckpt.runtime.storage.layout import validate_job_name
from airflow_ckpt.supervision import RESTORE_LATEST, RESTORE_NONE

ARGUMENTS = "CheckpointedSparkSubmitOperator arguments"


class CheckpointedJobConfigError(ConfigError, AirflowFailException):
    """Invalid operator arguments; raised before anything is submitted (never retried)."""


@dataclass(frozen=True, slots=True)
class ValidatedArgs:
    """The operator's checkpointing arguments after validation."""

    job: str
    storage_uri: str
    checkpoint_config: CheckpointConfig
    restart_params: dict[str, Any]  # canonical: ``strategy.options()``
    strategy: RestartStrategy
    restore: str

    def spark_conf(self, *, restore: str, attempt: int, run_id: str,
                   storage_conf: Mapping[str, str], workdir: str | None) -> dict[str, str]:
        """The ``spark.airflow_ckpt.*`` confs of one submission (``storage_conf``: the
        storage connection's endpoint and region, never its credentials)."""
        settings = JobSettings(
            job=self.job, storage_uri=self.storage_uri, checkpoint_config=self.checkpoint_config,
            restart_strategy=self.restart_params, restore=restore,
            workdir=str(workdir) if workdir else None, attempt=attempt, run_id=run_id)
        return {**settings.to_conf(), **storage_conf}


def validate_arguments(
    *, job_name: Any, checkpoint_storage: Any, checkpoint_config: Any,
    restart_strategy: Any, restore: Any,
) -> ValidatedArgs:
    """Check every checkpointing argument; one :class:`CheckpointedJobConfigError` names
    every bad key. The canonical restart options (every default filled in) are what the
    driver gets, so the runtime's in-process restarts and the supervisor run the very
    same strategy."""
    problems: dict[str, str] = {}

    def collect(argument: str, exc: ConfigError) -> None:
        for key, message in exc.problems.items():
            problems[f"{argument}.{key}" if key != argument else key] = message

    job = str(job_name or "")
    try:
        validate_job_name(job)
    except ConfigError as exc:
        problems["job_name"] = next(iter(exc.problems.values()))
    storage_uri = str(checkpoint_storage or "")
    try:
        storage_uri = parse_storage_uri(storage_uri).uri
    except InvalidStorageUriError as exc:
        problems["checkpoint_storage"] = str(exc)
    config = CheckpointConfig()
    try:
        config = CheckpointConfig.from_dict(as_mapping(checkpoint_config, "checkpoint_config"))
    except ConfigError as exc:
        collect("checkpoint_config", exc)
    strategy: RestartStrategy | None = None
    try:
        strategy = restart_strategy_from_params(
            dict(as_mapping(restart_strategy, "restart_strategy")))
    except ConfigError as exc:
        collect("restart_strategy", exc)
    target = str(restore or "").strip() or RESTORE_LATEST  # "" = a blank param
    if problems or strategy is None:
        raise CheckpointedJobConfigError(ARGUMENTS, problems)
    return ValidatedArgs(job, storage_uri, config, strategy.options(), strategy, target)


def check_restore_target(catalog: CheckpointCatalog, restore: str) -> str:
    """``latest`` / ``none``, or the URI of the completed checkpoint / savepoint of this
    storage that the path ``restore`` names (else :class:`CheckpointedJobConfigError`)."""
    if restore.lower() in (RESTORE_LATEST, RESTORE_NONE):
        return restore.lower()
    try:
        ref = catalog.resolve(restore)
        catalog.read(ref)
    except AirflowCkptError as exc:
        raise CheckpointedJobConfigError(ARGUMENTS, {"restore": str(exc)}) from exc
    return catalog.uri_of(ref)


def as_mapping(value: Any, argument: str) -> Mapping[str, Any]:
    """A dict argument given as a dict, JSON text, or a Python dict literal (templating)."""
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            try:  # "{{ params.x }}" rendered without native objects gives a Python repr
                parsed = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise ConfigError(argument, {argument: f"not a JSON object: {value!r}"}) from None
        if isinstance(parsed, Mapping):
            return parsed
    raise ConfigError(argument, {argument: f"must be a dict of options, got {value!r}"})
