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
   history through :class:`~airflow_ckpt.runtime.history.restart_log.RestartLog`, the
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

**Deferrable** (``deferrable=True``): the driver is submitted detached (its own session
and log file, so it outlives the task process), the task defers on a
:class:`~airflow_ckpt.triggers.supervision.DriverSupervisionTrigger` that watches the
job's storage, and resumes in :meth:`execute_complete` to end, give up, or wait the
restart delay deferred (:meth:`resubmit`) and submit again. Both paths take their steps
from one :class:`~airflow_ckpt.operators.supervisor.Supervisor` (deferred:
``supervisor.after(event)`` gives ``Done`` or ``Restart``; the operator only returns,
defers or submits); submission
mechanics live in :class:`~airflow_ckpt.hooks.spark_submit.CheckpointedSparkSubmitHook`,
argument validation in :mod:`airflow_ckpt.operators.arguments`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, NoReturn

from airflow.configuration import conf
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException
from airflow.triggers.base import BaseTrigger

from airflow_ckpt.detached import LOCAL_PROCESSES, HostProcesses
from airflow_ckpt.guard import (
    KillSwitch,
    RunningJobGuard,
    recording_kill,
    validate_on_running_job,
)
from airflow_ckpt.health import DEFAULT_MULTIPLE
from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.hooks.spark_submit import (
    CheckpointedSparkSubmitHook,
    master_given,
    secret_values,
)
from airflow_ckpt.operators.arguments import (
    ARGUMENTS,
    CheckpointedJobConfigError,
    ValidatedArgs,
    check_restore_target,
    validate_arguments,
)
from airflow_ckpt.operators.supervisor import (
    CheckpointedJobFailedError,
    Done,
    Step,
    Supervisor,
)
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.shipping import runtime_py_files
from airflow_ckpt.supervision import RESTORE_LATEST, DriverFailure

__all__ = ["CheckpointedJobConfigError", "CheckpointedJobFailedError",
           "CheckpointedSparkSubmitOperator", "supervision_id"]


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
    :param deferrable: supervise deferred (default ``[operators] default_deferrable``):
        submit the driver detached and free the worker slot while it runs (see the
        module docstring and docs/operators.md for the executors this suits)
    :param poll_interval: deferred: seconds between the trigger's looks at storage
    :param startup_timeout_s: deferred: how long a driver may take to hold its lease
    :param stop_timeout_s: deferred ``on_kill``: how long a graceful stop may take
        before the driver is killed (cut to what the triggerer's ``on_kill_timeout`` leaves)
    :param driver_log_dir: deferred: directory of the detached drivers' log files
    :param checkpoint_progress_multiple: report a job whose last completed checkpoint is
        older than this multiple of the checkpoint interval while its heartbeat lives
    :param restart_on_stale_checkpoints: restart such a job from its latest checkpoint
        (counted by the restart strategy); implies the default multiple
    :param on_running_job: when another supervision (DAG run) holds the job before the
        first submit: ``"fail"`` (default: refuse, naming that DAG run, task and
        attempt; nothing is submitted) or ``"wait"`` until it lets go (see
        :mod:`airflow_ckpt.guard`)
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
    #: the detached drivers as this worker sees them (the simulation's operator: its own)
    _processes: HostProcesses = LOCAL_PROCESSES

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
        on_running_job: str = "fail",
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
        self.on_running_job = validate_on_running_job(on_running_job)
        self._killed: KillSwitch = threading.Event()

    def __deepcopy__(self, memo: dict[int, Any]) -> CheckpointedSparkSubmitOperator:
        """A copy with its own (fresh) execution state: ``partial_subset`` and similar
        paths deep-copy tasks, and a ``threading.Event`` cannot be deep-copied."""
        copied = super().__deepcopy__(memo)
        copied._killed = threading.Event()
        copied._hook = None
        return copied

    def validate_arguments(self) -> ValidatedArgs:
        """Check every checkpointing argument; one :class:`CheckpointedJobConfigError`
        names every bad key (see :func:`~airflow_ckpt.operators.arguments.validate_arguments`).
        Touches no storage."""
        return validate_arguments(
            job_name=self.job_name, checkpoint_storage=self.checkpoint_storage,
            checkpoint_config=self.checkpoint_config, restart_strategy=self.restart_strategy,
            restore=self.restore)

    def _store(self, args: ValidatedArgs) -> CheckpointStoreHook:
        """The job's storage (the simulation's operator opens its own)."""
        return CheckpointStoreHook(args.storage_uri, conn_id=self.storage_conn_id)

    def _check_restore_target(self, catalog: CheckpointCatalog, restore: str) -> str:
        return check_restore_target(catalog, restore)

    def _supervisor(self, context: Context) -> Supervisor:
        """The run's supervisor, rebuilt from the arguments and storage at every entry."""
        args = self.validate_arguments()
        sup = Supervisor.open(args, store=self._store(args), run_id=supervision_id(context),
                              check_restore=self._check_restore_target, log=self.log,
                              processes=self._processes)
        self.log.info("job %r, storage %s, checkpointing %s, restart strategy %s, restore %s%s",
                      args.job, args.storage_uri, args.checkpoint_config.to_dict(),
                      args.strategy.describe(), args.restore,
                      " (deferrable)" if self.deferrable else "")
        return sup

    # ================================================================ blocking path

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        """Validate, submit, then supervise: blocking, or deferred on the triggerer."""
        sup = self._supervisor(context)
        RunningJobGuard(sup.store.storage, sup.args.job, sup.run_id,
                        self.log).ensure_free(self.on_running_job)
        if not self.deferrable:
            with recording_kill(sup.history, sup.run_id, self._killed,
                                lambda: sup.next_attempt() - 1, self.log):
                return sup.run_blocking(partial(self._submit_blocking, context, sup),
                                        self._killed)
        watch = sup.reattach(self._watch_settings(sup.args))  # a retried task's live driver
        if watch is not None:
            self.defer(trigger=watch, method_name="execute_complete")
        self._submit_and_defer(context, sup, sup.next_attempt())

    def _submit_blocking(self, context: Context, sup: Supervisor, attempt: int,
                         restore: str) -> DriverFailure | None:
        """One spark-submit, waited for; None on exit 0, else the driver failure. Errors
        that are no driver failure (spark-submit missing, bad connection) propagate."""
        hook = self._prepare(sup, attempt, restore)
        # recorded when spark-submit really runs: a durable (YARN/K8s) task retry that
        # reconnects to the driver it submitted before submits nothing
        hook.before_submit = partial(sup.record_submit, hook, attempt, restore,
                                     **self._submit_fields(context))
        try:
            super().execute(context)
        except (AirflowException, RuntimeError) as exc:
            failure = hook.failure_of(exc, attempt)
            if failure is None:
                raise
            return failure
        return None

    # ================================================================ deferrable path

    def _submit_and_defer(self, context: Context, sup: Supervisor, attempt: int) -> NoReturn:
        """Submit ``attempt`` detached and defer on the trigger that watches it (its event
        carries the submission: attempt, pid, host, log; no resume kwargs)."""
        restore = sup.restore_for(attempt)
        self.defer(trigger=sup.submit_detached(
            self._prepare(sup, attempt, restore), attempt, restore,
            log_dir=self.driver_log_dir, settings=self._watch_settings(sup.args),
            **self._submit_fields(context)), method_name="execute_complete")

    def _watch_settings(self, args: ValidatedArgs) -> dict[str, Any]:
        health = None
        if self.checkpoint_progress_multiple is not None:
            health = {"interval_s": args.checkpoint_config.interval_s,
                      "multiple": float(self.checkpoint_progress_multiple),
                      "restart": bool(self.restart_on_stale_checkpoints)}
        return {"conn_id": self.storage_conn_id, "health": health,
                "poll_interval": float(self.poll_interval),
                "startup_timeout_s": float(self.startup_timeout_s),
                "stop_timeout_s": float(self.stop_timeout_s)}

    def execute_complete(
        self, context: Context, event: dict[str, Any], **kwargs: Any
    ) -> dict[str, Any]:
        """Resumed by the supervision trigger: end, give up, or restart (deferred again)."""
        sup = self._supervisor(context)
        return self._follow(context, sup, sup.after(event))

    def resubmit(self, context: Context, event: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Resumed after the restart delay: submit the next attempt (from history)."""
        sup = self._supervisor(context)
        return self._follow(context, sup, sup.resume())

    def _follow(self, context: Context, sup: Supervisor, step: Step) -> dict[str, Any]:
        """Return a :class:`Done`'s result, or defer the :class:`Restart`'s delay (no
        sleeping in a worker) and then its submission."""
        if isinstance(step, Done):
            return step.result
        if step.delay_s > 0:
            self.defer(trigger=self._delay_trigger(step.delay_s), method_name="resubmit")
        self._submit_and_defer(context, sup, step.attempt)

    def _delay_trigger(self, delay_s: float) -> BaseTrigger:
        """The trigger that fires after a restart delay (the simulation's: virtual time)."""
        return TimeDeltaTrigger(timedelta(seconds=delay_s))

    # ================================================================ submission

    def _prepare(self, sup: Supervisor, attempt: int, restore: str
                 ) -> CheckpointedSparkSubmitHook:
        """Build this attempt's hook: the user's arguments plus the job's Spark conf,
        runtime ``--py-files`` and environment (the operator's own attributes stay the
        user's). The provider's ``execute`` submits through :attr:`_hook`."""
        user_conf, user_env = dict(self.conf or {}), dict(self.env_vars or {})
        hook = self._get_hook()
        if (problem := hook.unsupported_deploy_mode) is not None:
            raise CheckpointedJobConfigError(ARGUMENTS, {"deploy_mode": problem})
        runtime = runtime_py_files() if self.ship_runtime else None
        hook.use_attempt(
            conf={**user_conf, **sup.args.spark_conf(
                restore=restore, attempt=attempt, run_id=sup.run_id,
                storage_conf=sup.store.job_conf(), workdir=self.workdir)},
            py_files=",".join(p for p in (runtime, self.py_files) if p) or None,
            env=hook.submission_env(sup.store.job_env(), user_conf, user_env, self.log))
        self._hook = hook
        return hook

    def _submit_fields(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        return {"application": self.application, "airflow": {
            "dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id,
            "try_number": getattr(ti, "try_number", None)}}

    def _get_hook(self) -> CheckpointedSparkSubmitHook:
        with master_given() if self.master else contextlib.nullcontext():
            built = super()._get_hook()
        return CheckpointedSparkSubmitHook.adopt(
            built, master=str(self.master) if self.master else None,
            secret_values=secret_values(self.env_vars or {}),
        )

    def on_kill(self) -> None:
        """Blocking path: stop supervising and kill the driver (spark-submit and children).

        While deferred, the task runs nowhere: killing it (mark failed / clear) calls the
        supervision trigger's ``on_kill`` instead - a graceful stop request, then the kill.
        """
        self._killed.set()
        hook = self._hook
        if isinstance(hook, CheckpointedSparkSubmitHook):
            hook.kill_tree(super().on_kill)
        elif hook is not None:
            super().on_kill()


def supervision_id(context: Context) -> str:
    """``<dag_id>/<run_id>/<task_id>[/<map_index>]``: stable across retries of one task."""
    ti = context["ti"]
    parts = [ti.dag_id, ti.run_id, ti.task_id]
    map_index = getattr(ti, "map_index", -1)
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return "/".join(str(p) for p in parts)
