"""CheckpointedSparkSubmitOperator: submit a checkpointed PySpark job and supervise it.

The operator is a :class:`SparkSubmitOperator` (every spark-submit option keeps working:
connection, conf, py_files, deploy mode, env_vars, ...) that adds the checkpointing
arguments and a supervision loop:

1. **Validate before submitting.** ``job_name``, ``checkpoint_storage``,
   ``checkpoint_config`` (Flink option names), ``restart_strategy`` (Flink option
   names) and ``restore`` are validated first; a bad value fails the task with one
   message naming every bad key, and nothing is submitted. This failure is
   :class:`CheckpointedJobConfigError`, an ``AirflowFailException``: Airflow does not
   retry it (a retry could not fix the arguments).
2. **Submit** with ``spark.airflow_ckpt.*`` confs (job, storage, endpoint, config,
   restart strategy, restore target, attempt, run id), the storage connection's
   credentials as ``AWS_*`` environment variables (never as conf), and the runtime
   shipped as a ``--py-files`` zip (see :func:`runtime_py_files`). A ``JOB_SUBMITTED``
   event is written per submit.
3. **Supervise.** When the driver exits non-zero, a ``FAILURE`` (level ``driver``,
   exit code, last error lines) and a ``RESTART`` decision are appended to the job's
   history through :class:`~airflow_ckpt.runtime.restart_log.RestartLog`, the
   operator waits the strategy's delay and resubmits with ``restore=latest``. The
   strategy state lives in the history, shared with the runtime's in-process (query
   level) restarts and with later tries of this task, so Flink's window and backoff
   hold across both levels and across worker restarts.
4. **End.** Exit 0 (clean finish or stop-with-savepoint) ends the task successfully and
   returns (XCom) the last completed checkpoint: ``{"job", "checkpoint_id",
   "checkpoint_path", ...}``. When the strategy declines a restart (or the runtime's
   in-process strategy already gave up), ``JOB_FAILED`` is written and the task fails
   with :class:`CheckpointedJobFailedError` carrying the job's last error and the
   restart history. That error is an ``AirflowFailException`` as well: the restart
   strategy *is* the retry policy, and Airflow retries on top would double-count
   failures. Airflow ``retries`` still matter for what the strategy cannot see - a
   worker that died mid-supervision: the retried task continues the same supervision
   (same run id, same strategy state, next attempt number).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import socket
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from airflow.configuration import conf
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_ckpt.driver_output import summarize_driver_output
from airflow_ckpt.errors import (
    AirflowCkptError,
    ConfigError,
    InvalidStorageUriError,
    RestartsExhaustedError,
)
from airflow_ckpt.health import DEFAULT_MULTIPLE
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.hooks.spark_submit import (
    CheckpointedSparkSubmitHook,
    log_tail,
    secret_values,
)
from airflow_ckpt.restart import RestartStrategy, restart_strategy_from_params
from airflow_ckpt.runtime import sparkconf
from airflow_ckpt.runtime.catalog import CheckpointCatalog
from airflow_ckpt.runtime.config import CheckpointConfig
from airflow_ckpt.runtime.history import (
    JOB_FAILED,
    JOB_STOPPED,
    JOB_SUBMITTED,
    HistoryEvent,
    JobHistory,
)
from airflow_ckpt.runtime.layout import validate_job_name
from airflow_ckpt.runtime.lease import lease_epochs, read_lease
from airflow_ckpt.runtime.restart_log import RestartLog, format_restart_history
from airflow_ckpt.runtime.storage.factory import parse_storage_uri
from airflow_ckpt.shipping import runtime_py_files
from airflow_ckpt.supervision import RunCheckpoints, Verdict, resubmit_restore
from airflow_ckpt.triggers.supervision import DriverSupervisionTrigger, kill_detached

RESTORE_LATEST = "latest"
RESTORE_NONE = "none"


class CheckpointedJobConfigError(ConfigError, AirflowFailException):
    """Invalid operator arguments; raised before anything is submitted (never retried)."""


class CheckpointedJobFailedError(RestartsExhaustedError, AirflowFailException):
    """The restart strategy declined another restart; the message has the last error."""


@dataclass(frozen=True, slots=True)
class ValidatedArgs:
    """The operator's checkpointing arguments after validation."""

    job: str
    storage_uri: str
    checkpoint_config: CheckpointConfig
    restart_params: dict[str, Any]  # canonical: ``strategy.options()``
    strategy: RestartStrategy
    restore: str


@dataclass(frozen=True, slots=True)
class _Supervision:
    """One supervision step's collaborators, rebuilt on every (re)entry of the task."""

    args: ValidatedArgs
    store: CheckpointStoreHook
    catalog: CheckpointCatalog
    history: JobHistory
    run_id: str
    restart_log: RestartLog
    run_checkpoints: RunCheckpoints
    first_restore: str


@dataclass(frozen=True, slots=True)
class DriverFailure:
    """One non-zero end of a submission: exit code (None if unknown), cause, error lines."""

    attempt: int
    exit_code: int | None
    cause: str
    error_lines: list[str]


class CheckpointedSparkSubmitOperator(SparkSubmitOperator):
    """Submit a PySpark job that uses the airflow-ckpt runtime and supervise it.

    All :class:`SparkSubmitOperator` arguments are accepted unchanged. Added arguments:

    :param job_name: the job's name in the checkpoint storage (templated)
    :param checkpoint_storage: ``s3://bucket/prefix`` or ``file:///path`` (templated)
    :param checkpoint_config: Flink checkpointing options, e.g.
        ``{"execution.checkpointing.interval": "10 s", "num-retained": 3}``; a dict or
        its JSON (templated)
    :param restart_strategy: Flink restart-strategy options, e.g.
        ``{"type": "fixed-delay", "fixed-delay.attempts": 3, "fixed-delay.delay": "10 s"}``;
        a dict, its JSON, or ``"{{ params.restart_strategy }}"`` with
        ``render_template_as_native_obj=True`` (templated). Default: Flink's default
        without checkpointing-specific tuning, i.e. ``exponential-delay``.
    :param restore: where the *first* submission starts: ``latest`` (newest retained
        checkpoint, if any), ``none`` (fresh state) or a checkpoint / savepoint path.
        Resubmissions after a driver death always use ``latest`` (templated)
    :param storage_conn_id: ``aws``-type connection for the storage (login = access key
        id, password = secret, extra ``endpoint_url`` / ``region_name``)
    :param workdir: the driver's local working directory (Spark's checkpointLocation);
        by default the runtime picks one (templated)
    :param master: overrides the Spark connection's master, e.g. ``local[*]`` or
        ``spark://host:7077`` (templated; empty = use the connection)
    :param ship_runtime: add a zip of the installed ``airflow_ckpt`` package to
        ``--py-files`` (default True), so the driver and executors import the same
        runtime version as this operator, wherever they run
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "job_name",
        "checkpoint_storage",
        "checkpoint_config",
        "restart_strategy",
        "restore",
        "workdir",
        "master",
    )
    template_fields_renderers = {
        "checkpoint_config": "json",
        "restart_strategy": "json",
        "conf": "json",
    }
    ui_color = "#f4a460"
    # per-execution state: never deep-copied (a threading.Event cannot be), see __deepcopy__
    shallow_copy_attrs: Sequence[str] = (*SparkSubmitOperator.shallow_copy_attrs, "_killed",
                                         "_hook")

    def __init__(
        self,
        *,
        application: str,
        job_name: str,
        checkpoint_storage: str,
        checkpoint_config: Mapping[str, Any] | str | None = None,
        restart_strategy: Mapping[str, Any] | str | None = None,
        restore: str = RESTORE_LATEST,
        storage_conn_id: str | None = CheckpointStoreHook.default_conn_name,
        workdir: str | None = None,
        master: str | None = None,
        ship_runtime: bool = True,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        startup_timeout_s: float = 300.0,
        stop_timeout_s: float = 120.0,
        driver_log_dir: str | None = None,
        checkpoint_progress_multiple: float | None = None,
        restart_on_stale_checkpoints: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", job_name)
        super().__init__(application=application, **kwargs)
        self.job_name = job_name
        self.checkpoint_storage = checkpoint_storage
        self.checkpoint_config = checkpoint_config
        self.restart_strategy = restart_strategy
        self.restore = restore
        self.storage_conn_id = storage_conn_id
        self.workdir = workdir
        self.master = master
        self.ship_runtime = ship_runtime
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.driver_log_dir = driver_log_dir
        self.checkpoint_progress_multiple = checkpoint_progress_multiple
        self.restart_on_stale_checkpoints = restart_on_stale_checkpoints
        if restart_on_stale_checkpoints and checkpoint_progress_multiple is None:
            self.checkpoint_progress_multiple = DEFAULT_MULTIPLE
        self._killed = threading.Event()
        # the user's conf / env_vars / py_files, kept while an attempt's are set
        self._user_conf: dict[str, Any] | None = None
        self._user_env: dict[str, Any] | None = None
        self._user_py_files: str | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> CheckpointedSparkSubmitOperator:
        """A copy with its own (fresh) execution state: ``partial_subset`` and similar
        paths deep-copy tasks, and a ``threading.Event`` cannot be deep-copied."""
        copied = super().__deepcopy__(memo)
        copied._killed = threading.Event()
        copied._hook = None
        return copied

    # ================================================================ validation

    def validate_arguments(self) -> ValidatedArgs:
        """Check every checkpointing argument; one error names every bad key.

        Raises :class:`CheckpointedJobConfigError` (keys are prefixed with the argument
        name, e.g. ``restart_strategy.fixed-delay.attempts``). Touches no storage.
        """
        problems: dict[str, str] = {}

        def collect(argument: str, exc: ConfigError) -> None:
            for key, message in exc.problems.items():
                problems[f"{argument}.{key}" if key != argument else key] = message

        job = str(self.job_name or "")
        try:
            validate_job_name(job)
        except ConfigError as exc:
            problems["job_name"] = next(iter(exc.problems.values()))
        storage_uri = str(self.checkpoint_storage or "")
        try:
            storage_uri = parse_storage_uri(storage_uri).uri
        except InvalidStorageUriError as exc:
            problems["checkpoint_storage"] = str(exc)

        config = CheckpointConfig()
        try:
            config = CheckpointConfig.from_dict(
                _as_mapping(self.checkpoint_config, "checkpoint_config")
            )
        except ConfigError as exc:
            collect("checkpoint_config", exc)
        params: dict[str, Any] = {}
        strategy: RestartStrategy | None = None
        try:
            params = dict(_as_mapping(self.restart_strategy, "restart_strategy"))
            strategy = restart_strategy_from_params(params)
        except ConfigError as exc:
            collect("restart_strategy", exc)

        restore = str(self.restore or "").strip() or RESTORE_LATEST  # "" = a blank param
        if problems or strategy is None:
            raise CheckpointedJobConfigError("CheckpointedSparkSubmitOperator arguments",
                                             problems)
        # The canonical options (every default filled in) go to the driver, so the
        # runtime's in-process restarts and this supervisor run the very same strategy.
        return ValidatedArgs(job, storage_uri, config, strategy.options(), strategy, restore)

    def _check_restore_target(self, catalog: CheckpointCatalog, restore: str) -> str:
        """A path must name a completed checkpoint/savepoint of this storage; returns a URI."""
        if restore.lower() in (RESTORE_LATEST, RESTORE_NONE):
            return restore.lower()
        try:
            ref = catalog.resolve(restore)
            catalog.read(ref)
        except AirflowCkptError as exc:
            raise CheckpointedJobConfigError(
                "CheckpointedSparkSubmitOperator arguments", {"restore": str(exc)}
            ) from exc
        return catalog.uri_of(ref)

    # ================================================================ execution

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        """Validate, submit, then supervise: blocking, or deferred on the triggerer."""
        sup = self._supervision(context)
        if self.deferrable:
            attempt = sup.restart_log.last_submit_attempt() + 1
            if attempt > 1:
                self._reattach(sup, attempt - 1)
                self.log.info("continuing supervision %s at submission attempt %d",
                              sup.run_id, attempt)
            self._submit_and_defer(context, sup, attempt)
        return self._supervise_blocking(context, sup)

    def _reattach(self, sup: _Supervision, attempt: int) -> None:
        """A retried deferrable task whose driver still holds the lease: watch it again.

        (The task was retried - e.g. its worker died while resuming - but the detached
        driver of ``attempt`` kept running: resubmitting would start a second driver,
        which the lease refuses as final.) Returns when there is nothing to re-attach to.
        """
        record = read_lease(sup.store.storage, sup.args.job)
        if record is None or record.released or record.owner != sup.run_id:
            return
        submits = [e for e in sup.history.events([JOB_SUBMITTED])
                   if e.data.get("run_id") == sup.run_id and e.data.get("attempt") == attempt]
        if not submits:
            return
        submitted = submits[-1]
        self.log.info("the driver of attempt %d still holds the job's lease (epoch %d): "
                      "watching it again instead of resubmitting", attempt, record.epoch)
        driver_log = submitted.data.get("driver_log")
        self.defer(trigger=DriverSupervisionTrigger(
            storage_uri=sup.args.storage_uri, job=sup.args.job, run_id=sup.run_id,
            submitted_key=submitted.key, lease_epoch_before=record.epoch - 1,
            conn_id=self.storage_conn_id, driver_pid=None,
            driver_host=submitted.data.get("driver_host"),
            exit_path=f"{driver_log}.exit" if driver_log else None,
            health=self._health_kwargs(sup.args), poll_interval=float(self.poll_interval),
            startup_timeout_s=float(self.startup_timeout_s),
            stop_timeout_s=float(self.stop_timeout_s), attempt=attempt, driver_log=driver_log,
        ), method_name="execute_complete")

    def _supervision(self, context: Context) -> _Supervision:
        """Everything one supervision step needs, rebuilt from arguments and storage.

        Both paths start here, and the deferrable path after every resume: nothing is
        kept in the operator between deferrals, so a worker restart loses nothing.
        """
        args = self.validate_arguments()
        store = CheckpointStoreHook(args.storage_uri, conn_id=self.storage_conn_id)
        history = store.history(args.job)
        run_id = supervision_id(context)
        sup = _Supervision(
            args=args, store=store, catalog=store.catalog(args.job), history=history,
            run_id=run_id, restart_log=RestartLog(history, args.restart_params, run_id),
            run_checkpoints=RunCheckpoints(history, run_id),
            first_restore=self._check_restore_target(store.catalog(args.job), args.restore),
        )
        self.log.info(
            "job %r, storage %s, checkpointing %s, restart strategy %s, restore %s%s",
            args.job, args.storage_uri, args.checkpoint_config.to_dict(),
            args.strategy.describe(), args.restore, " (deferrable)" if self.deferrable else "",
        )
        return sup

    def _restore_for(self, sup: _Supervision, attempt: int) -> str:
        return sup.first_restore if attempt == 1 else self._resubmit_restore(
            sup.run_checkpoints, sup.first_restore)

    def _supervise_blocking(self, context: Context, sup: _Supervision) -> dict[str, Any]:
        attempt = sup.restart_log.last_submit_attempt() + 1
        if attempt > 1:
            self.log.info("continuing supervision %s at submission attempt %d "
                          "(earlier attempts are in the job's history)", sup.run_id, attempt)
        while True:
            restore = self._restore_for(sup, attempt)
            before = sup.restart_log.refresh()
            restored_before, terminal_before = len(before.restored), before.last_terminal
            failure = self._submit(context, sup, attempt, restore)
            state = sup.restart_log.refresh()
            for event in state.restored[restored_before:]:
                self.log.info("attempt %d restored from %s %s (batch %s)", attempt,
                              event.data.get("kind", "checkpoint"), event.data.get("path"),
                              event.data.get("batch_id"))
            if failure is None:
                return self._result(sup.catalog, sup.args.job, attempt, state.last_terminal)
            if self._killed.is_set():
                raise AirflowException(f"job {sup.args.job}: killed while attempt {attempt} ran")
            terminal = state.last_terminal
            final = (terminal is not None and terminal is not terminal_before
                     and terminal.type == JOB_FAILED and terminal.data.get("run_id") == sup.run_id)
            delay_s = self._after_failure(
                sup, failure, final_cause=terminal.data.get("cause") if final and terminal
                else None)
            if self._killed.wait(delay_s):
                raise AirflowException(f"job {sup.args.job}: killed while waiting to restart")
            attempt += 1

    def _after_failure(
        self, sup: _Supervision, failure: DriverFailure, *, final_cause: str | None
    ) -> float:
        """The one supervision decision both paths use: the restart delay, or raise.

        ``final_cause``: the driver itself declared the failure final (``job_failed`` of
        this run: invalid settings, state that does not fit the query, another driver
        owns the job, or its in-process strategy gave up) - resubmitting cannot help.
        """
        if final_cause is not None:
            restart, delay_s, by_runtime = False, 0.0, True
            reason = f"the job failed for good: {final_cause}"
        else:
            restart, delay_s, reason, by_runtime = self._decide(sup.restart_log, failure)
        if not restart:
            self._fail(sup.history, sup.restart_log, sup.args, failure, failure.attempt,
                       reason, write_job_failed=not by_runtime)
        self.log.info(
            "job %s attempt %d failed (%s); restarting in %.3f s (%s)",
            sup.args.job, failure.attempt, failure.cause, delay_s, reason,
        )
        return delay_s

    # ---------------------------------------------------------------- deferrable path

    def _submit_and_defer(self, context: Context, sup: _Supervision, attempt: int) -> NoReturn:
        """Submit attempt ``attempt`` detached and defer on its supervision trigger."""
        restore = self._restore_for(sup, attempt)
        hook = self._prepare(sup, attempt, restore)
        if hook.is_yarn_or_kubernetes and hook.is_cluster_mode:
            self.log.info("cluster deploy mode: the driver runs in the cluster; the local "
                          "spark-submit client is detached as well")
        epochs = lease_epochs(sup.store.storage, sup.args.job)
        log_dir = Path(str(self.driver_log_dir)) if self.driver_log_dir else \
            Path(tempfile.gettempdir()) / "airflow-ckpt-drivers"
        safe_run = re.sub(r"[^A-Za-z0-9_.-]+", "_", sup.run_id)
        log_path = log_dir / f"{sup.args.job}-{safe_run}-{attempt}.log"
        host = socket.gethostname()
        submitted = self._record_submit(context, sup, hook, attempt, restore,
                                        driver_log=str(log_path), driver_host=host,
                                        detached=True)
        try:
            driver = hook.submit_detached(self.application, log_path)
        finally:
            self._restore_user_args()
        self.log.info("job %s attempt %d submitted detached (pid %d, log %s); deferring",
                      sup.args.job, attempt, driver.pid, driver.log_path)
        trigger = DriverSupervisionTrigger(
            storage_uri=sup.args.storage_uri, job=sup.args.job, run_id=sup.run_id,
            submitted_key=submitted.key, lease_epoch_before=epochs[-1] if epochs else 0,
            conn_id=self.storage_conn_id, driver_pid=driver.pid, driver_host=host,
            exit_path=driver.exit_path, health=self._health_kwargs(sup.args),
            poll_interval=float(self.poll_interval),
            startup_timeout_s=float(self.startup_timeout_s),
            stop_timeout_s=float(self.stop_timeout_s), attempt=attempt,
            driver_log=driver.log_path,
        )
        # the event carries the submission (attempt, pid, host, log): no resume kwargs
        self.defer(trigger=trigger, method_name="execute_complete")

    def _health_kwargs(self, args: ValidatedArgs) -> dict[str, Any] | None:
        if self.checkpoint_progress_multiple is None:
            return None
        return {"interval_s": args.checkpoint_config.interval_s,
                "multiple": float(self.checkpoint_progress_multiple),
                "restart": bool(self.restart_on_stale_checkpoints)}

    def execute_complete(
        self, context: Context, event: dict[str, Any], **kwargs: Any
    ) -> dict[str, Any]:
        """Resumed by the supervision trigger: end, give up, or restart (deferred again)."""
        sup = self._supervision(context)
        verdict = Verdict.from_payload(event)
        attempt = int(event.get("attempt") or sup.restart_log.last_submit_attempt())
        driver_pid, driver_host = event.get("driver_pid"), event.get("driver_host")
        driver_log = event.get("driver_log")
        if verdict.kind == "finished":
            return self._result(sup.catalog, sup.args.job, attempt,
                                sup.restart_log.refresh().last_terminal)
        local = driver_host == socket.gethostname()
        if verdict.kind == "stale" and local:
            self.log.warning("job %s: %s; killing the stuck driver to restart it",
                             sup.args.job, verdict.cause)
            kill_detached(driver_pid)
        lines = log_tail(driver_log) if local else []
        cause, error_lines = summarize_driver_output(lines, verdict.exit_code)
        if verdict.kind != "failed" and (not lines or verdict.exit_code is None):
            cause = verdict.cause
        failure = DriverFailure(attempt, verdict.exit_code, cause, error_lines)
        delay_s = self._after_failure(
            sup, failure, final_cause=verdict.cause if verdict.kind == "failed" else None)
        if delay_s > 0:
            # wait deferred as well: no sleeping in a worker
            self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=delay_s)),
                       method_name="resubmit")
        return self._submit_and_defer(context, sup, attempt + 1)

    def resubmit(self, context: Context, event: Any = None, **kwargs: Any) -> NoReturn:
        """Resumed after the restart delay: resubmit (the next attempt, from history)."""
        sup = self._supervision(context)
        self._submit_and_defer(context, sup, sup.restart_log.last_submit_attempt() + 1)

    # ---------------------------------------------------------------- submission

    def _prepare(
        self, sup: _Supervision, attempt: int, restore: str
    ) -> CheckpointedSparkSubmitHook:
        """Set this attempt's conf/env/py_files and build its hook."""
        user_conf = dict(self._user_conf if self._user_conf is not None else self.conf or {})
        user_env = dict(self._user_env if self._user_env is not None else self.env_vars or {})
        if self._user_conf is None:
            self._user_conf, self._user_env, self._user_py_files = (
                user_conf, user_env, self.py_files)
        self.conf = {**user_conf, **self._job_conf(sup.args, sup.store, restore, attempt,
                                                   sup.run_id)}
        self.py_files = _join_csv(runtime_py_files() if self.ship_runtime else None,
                                  self._user_py_files)
        self.env_vars = {}
        probe = self._get_hook()
        if probe.is_standalone_cluster_mode:
            raise CheckpointedJobConfigError(
                "CheckpointedSparkSubmitOperator arguments",
                {"deploy_mode": "standalone cluster deploy mode cannot run Python "
                                "applications (Spark refuses it): use client mode, or YARN / "
                                "Kubernetes cluster mode"})
        self.env_vars = self._job_env(probe, sup.store, user_conf, user_env)
        self._hook = None
        hook = self._get_hook()
        self._hook = hook
        hook.clear_output()
        return hook

    def _record_submit(
        self, context: Context, sup: _Supervision, hook: CheckpointedSparkSubmitHook,
        attempt: int, restore: str, **extra: Any,
    ) -> HistoryEvent:
        self.log.info("submitting job %s, attempt %d, restore=%s, master %s", sup.args.job,
                      attempt, restore, hook.master)
        return sup.history.append(
            JOB_SUBMITTED, run_id=sup.run_id, attempt=attempt, restore=restore,
            master=hook.master, deploy_mode=hook.deploy_mode, application=self.application,
            airflow=_airflow_ids(context), **extra,
        )

    def _submit(
        self, context: Context, sup: _Supervision, attempt: int, restore: str
    ) -> DriverFailure | None:
        """Run one spark-submit (blocking); None on exit 0, else what went wrong.

        Errors that are not a driver failure (spark-submit missing, bad connection, ...)
        propagate unchanged.
        """
        try:
            hook = self._prepare(sup, attempt, restore)
            # Recorded when spark-submit really runs: a durable (YARN/K8s) task retry that
            # reconnects to the driver it submitted before submits nothing.
            hook.before_submit = partial(self._record_submit, context, sup, hook, attempt,
                                         restore)
            try:
                super().execute(context)
            except (AirflowException, RuntimeError) as exc:
                failure = self._driver_failure(hook, exc, attempt)
                if failure is None:
                    raise
                return failure
            return None
        finally:
            self._restore_user_args()

    def _restore_user_args(self) -> None:
        if self._user_conf is not None:
            self.conf, self.env_vars, self.py_files = (
                self._user_conf, self._user_env, self._user_py_files)

    def _driver_failure(
        self, hook: CheckpointedSparkSubmitHook, exc: BaseException, attempt: int
    ) -> DriverFailure | None:
        """Classify an exception of one submission: a driver failure, or None (re-raise)."""
        exit_code = hook.exit_code
        driver_status = hook.driver_status
        if exit_code in (None, 0) and not (hook.tracks_driver and isinstance(exc, RuntimeError)) \
                and driver_status not in ("FAILED", "ERROR", "KILLED", "UNKNOWN"):
            return None
        cause, error_lines = summarize_driver_output(hook.output_tail, exit_code)
        if driver_status and driver_status != "FINISHED":
            cause = f"{cause} (driver status {driver_status})"
        return DriverFailure(attempt, exit_code, cause, error_lines)

    def _decide(
        self, restart_log: RestartLog, failure: DriverFailure
    ) -> tuple[bool, float, str, bool]:
        """Record the driver failure and ask the strategy - unless the runtime already gave up.

        Returns (restart, delay_s, reason, decided_by_runtime). When the driver exited
        because its in-process (query-level) strategy declined a restart, that decision
        stands: the failure was already counted and must not be counted twice.
        """
        last = restart_log.refresh().last_restart
        if last is not None and last.get("level") == "query" and not last.get("restart"):
            self.log.info("the runtime's in-process restart strategy already gave up: %s",
                          last.get("cause"))
            return False, 0.0, f"in-process restart declined ({last.get('cause')})", True
        decision = restart_log.record_failure(
            "driver",
            failure.cause,
            exit_code=failure.exit_code,
            error_lines=failure.error_lines,
            submit_attempt=failure.attempt,
        )
        return decision.restart, decision.delay_s, decision.reason or "", False

    def _fail(
        self,
        history: JobHistory,
        restart_log: RestartLog,
        args: ValidatedArgs,
        failure: DriverFailure,
        attempt: int,
        reason: str,
        *,
        write_job_failed: bool,
    ) -> None:
        restarts = restart_log.restarts()
        if write_job_failed:
            history.append(
                JOB_FAILED, run_id=restart_log.run_id, cause=failure.cause,
                exit_code=failure.exit_code, attempts=attempt, reason=reason,
            )
        message = (
            f"job {args.job} failed after {attempt} submission(s): {reason}\n"
            f"last error (exit code {failure.exit_code}): {failure.cause}\n"
            + "\n".join(f"    {line}" for line in failure.error_lines)
            + f"\nrestart history ({args.strategy.describe()}):\n"
            + format_restart_history(restarts)
        )
        self.log.error("%s", message)
        raise CheckpointedJobFailedError(message)

    def _resubmit_restore(self, run_checkpoints: RunCheckpoints, first_restore: str) -> str:
        """``latest`` once *this run* has a checkpoint; before that, the original target.

        (Issue 8, defect 4: an older run's checkpoints in the catalog do not count.)
        """
        restore = resubmit_restore(first_restore, run_checkpoints.progress())
        if restore != RESTORE_LATEST:
            self.log.info("this run has no completed checkpoint yet: resubmitting with "
                          "restore=%s", restore)
        return restore

    def _job_conf(
        self, args: ValidatedArgs, store: CheckpointStoreHook, restore: str, attempt: int,
        run_id: str,
    ) -> dict[str, str]:
        conf = {
            sparkconf.JOB: args.job,
            sparkconf.STORAGE: args.storage_uri,
            sparkconf.CHECKPOINT_CONFIG: json.dumps(args.checkpoint_config.to_dict()),
            sparkconf.RESTART_STRATEGY: json.dumps(args.restart_params),
            sparkconf.RESTORE: restore,
            sparkconf.ATTEMPT: str(attempt),
            sparkconf.RUN_ID: run_id,
            **store.job_conf(),
        }
        if self.workdir:
            conf[sparkconf.WORKDIR] = str(self.workdir)
        return conf

    def _job_env(
        self, probe: CheckpointedSparkSubmitHook, store: CheckpointStoreHook,
        user_conf: Mapping[str, Any], user_env: Mapping[str, Any],
    ) -> dict[str, Any]:
        """spark-submit's environment: the user's, AWS credentials, and the Python to use.

        In client mode the driver runs here, so it defaults to this interpreter (which
        has pyspark, boto3 and this package); executors default to it only with a
        ``local`` master. Explicit ``PYSPARK_*`` variables, ``spark.pyspark.*`` confs or
        the worker's own environment win.

        On YARN / Kubernetes the Spark hook turns ``env_vars`` into
        ``spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` confs, which are
        visible in ``ps`` and the Spark UI: the storage credentials are therefore *not*
        passed there; the driver must get them from its own environment (instance
        profile / IRSA / a Kubernetes secret, e.g.
        ``spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY``).
        """
        credentials = store.job_env()
        if probe.is_yarn_or_kubernetes:
            if credentials:
                self.log.warning(
                    "%s: the storage connection's credentials are not passed to the driver "
                    "(they would travel as Spark conf); give the driver its own AWS "
                    "credentials", probe.master)
            credentials = {}
        env: dict[str, Any] = {**credentials, **user_env}
        client = not probe.is_cluster_mode
        if client and not _python_configured(
            "PYSPARK_DRIVER_PYTHON", "spark.pyspark.driver.python", user_conf, env
        ) and not _python_configured("PYSPARK_PYTHON", "spark.pyspark.python", user_conf, env):
            env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        if probe.master.startswith("local") and not _python_configured(
            "PYSPARK_PYTHON", "spark.pyspark.python", user_conf, env
        ):
            env["PYSPARK_PYTHON"] = sys.executable
        return env

    def _get_hook(self) -> CheckpointedSparkSubmitHook:
        return CheckpointedSparkSubmitHook.adopt(
            super()._get_hook(), master=str(self.master) if self.master else None,
            secret_values=secret_values(self.env_vars or {}),
        )

    def _result(
        self, catalog: CheckpointCatalog, job: str, attempt: int, terminal: Any
    ) -> dict[str, Any]:
        latest = catalog.latest_checkpoint()
        result: dict[str, Any] = {
            "job": job,
            "checkpoint_id": latest.checkpoint_id if latest else None,
            "checkpoint_path": (
                catalog.uri_of(catalog.resolve(f"chk-{latest.checkpoint_id}")) if latest else None
            ),
            "batch_id": latest.batch_id if latest else None,
            "attempts": attempt,
            "outcome": "stopped" if terminal is not None and terminal.type == JOB_STOPPED
            else "finished",
        }
        savepoint = terminal.data.get("savepoint") if terminal is not None else None
        if savepoint:
            result["savepoint_path"] = savepoint
        self.log.info("job %s ended cleanly after %d submission(s); last checkpoint %s",
                      job, attempt, result["checkpoint_path"])
        return result

    def on_kill(self) -> None:
        """Blocking path: stop supervising and kill the driver (spark-submit and children).

        While deferred, the task runs nowhere: killing it (mark failed / clear) calls the
        supervision trigger's ``on_kill`` instead - a graceful stop request, then the kill.
        """
        self._killed.set()
        hook = self._hook
        pid = hook.pid if isinstance(hook, CheckpointedSparkSubmitHook) else None
        children = _child_processes(pid) if pid is not None else []
        if hook is not None:
            super().on_kill()
        for child in children:
            with contextlib.suppress(Exception):  # already gone
                child.kill()


# ==================================================================== helpers


def supervision_id(context: Context) -> str:
    """``<dag_id>/<run_id>/<task_id>[/<map_index>]``: stable across retries of one task."""
    ti = context["ti"]
    parts = [ti.dag_id, ti.run_id, ti.task_id]
    map_index = getattr(ti, "map_index", -1)
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return "/".join(str(p) for p in parts)


def _airflow_ids(context: Context) -> dict[str, Any]:
    ti = context["ti"]
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "try_number": getattr(ti, "try_number", None),
    }


def _as_mapping(value: Any, argument: str) -> Mapping[str, Any]:
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


def _join_csv(*parts: str | None) -> str | None:
    joined = ",".join(p for p in parts if p)
    return joined or None


def _python_configured(
    env_name: str, conf_key: str, conf: Mapping[str, Any], env: Mapping[str, Any]
) -> bool:
    return bool(env.get(env_name) or conf.get(conf_key) or os.environ.get(env_name))


def _child_processes(pid: int) -> list[Any]:
    try:
        import psutil

        return list(psutil.Process(pid).children(recursive=True))
    except Exception:  # psutil missing or the process is gone
        return []
