"""CheckpointedSparkSubmitHook: the one place that touches ``SparkSubmitHook`` internals.

The operator and the supervision trigger use only the public properties below
(``master``, ``deploy_mode``, ``is_cluster_mode``, ``exit_code``, ``driver_status``,
``output_tail``) and methods: :meth:`~CheckpointedSparkSubmitHook.submission_env` (the
driver's environment), :meth:`~CheckpointedSparkSubmitHook.failure_of` (is an error of a
submission a driver failure?), :meth:`~CheckpointedSparkSubmitHook.kill_tree` and
:meth:`~CheckpointedSparkSubmitHook.submit_detached`. The provider's private attributes this
class reads (``_connection``, ``_submit_sp``, ``_driver_status``,
``_last_submit_log_lines``, ``_is_yarn``, ``_is_kubernetes``, ``_is_yarn_cluster_mode``,
``_should_track_driver_status``, ``_build_spark_submit_command``, ``_env``) are those of
``apache-airflow-providers-apache-spark`` 6.x (read against 6.3.4); the package bound
belongs in ``pyproject.toml``.

Detached drivers (deferrable supervision): :meth:`submit_detached` starts spark-submit
through ``python -m airflow_ckpt.launch`` in its own session with output to a log file,
so the driver outlives the task process; the launcher writes spark-submit's exit code
to ``<log>.exit`` when it ends (:mod:`airflow_ckpt.detached` reads it and stops the driver).

A driver is one unit: a blocking :meth:`~CheckpointedSparkSubmitHook.submit` returns
only once every process spark-submit started has ended too (a client-mode Python
driver whose JVM died ends itself within seconds; one that does not is killed after
:data:`~airflow_ckpt.launch.FOLLOW_S`), and the launcher does the same for a detached
driver. So the supervisor resubmits only when no process of the previous driver runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import structlog
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_ckpt.detached import OUTPUT_TAIL_LINES, DetachedDriver, exit_path_of
from airflow_ckpt.launch import end_processes
from airflow_ckpt.supervision import DriverFailure

#: spark-submit output lines kept per submission to report the driver's last error

#: how often a blocking submission notes the processes spark-submit started (while its
#: output flows), to end the ones that outlive it
UNIT_LOOK_S = 1.0

#: environment variable names whose values are credentials (masked everywhere)
SECRET_ENV_NAMES = frozenset({"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                              "AWS_SECURITY_TOKEN"})


#: the provider hook's line when its connection is missing: "Could not load connection
#: string spark_default, defaulting to yarn"
_MISSING_CONNECTION = "Could not load connection string"


class _WithoutMissingConnection:
    """A logger that passes every line on but the missing-connection one."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def info(self, event: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(event, str) and event.startswith(_MISSING_CONNECTION):
            return None
        return self._inner.info(event, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def master_given() -> Iterator[None]:
    """While the provider's operator builds a hook whose master ours then sets anyway.

    The provider's hook looks up its connection (``spark_default``) in its constructor
    and, when there is none, logs "Could not load connection string spark_default,
    defaulting to yarn" - untrue once the operator's ``master`` replaces it (issue 18:
    twice per submission with ``master="local[2]"``). The hook logs through the class's
    logger until an instance has its own, so for the construction the class logger
    drops that one line; every other line, and every line after, logs as usual.
    """
    had = "_log" in SparkSubmitHook.__dict__
    saved = SparkSubmitHook.__dict__.get("_log")
    name = f"{SparkSubmitHook.__module__}.{SparkSubmitHook.__name__}"
    SparkSubmitHook._log = _WithoutMissingConnection(structlog.get_logger(name))
    try:
        yield
    finally:
        if had:
            SparkSubmitHook._log = saved
        else:
            del SparkSubmitHook._log


class CheckpointedSparkSubmitHook(SparkSubmitHook):
    """A ``SparkSubmitHook`` with a master override, a long output tail and public state.

    :param master: overrides the connection's master (``local[*]``, ``spark://...``)
    :param secret_values: values masked in every command line and output line this
        hook logs (e.g. ``AWS_SESSION_TOKEN``, which the provider's mask misses)
    """

    def __init__(self, *, master: str | None = None,
                 secret_values: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._setup(master, secret_values)

    @classmethod
    def adopt(cls, hook: SparkSubmitHook, *, master: str | None = None,
              secret_values: tuple[str, ...] = ()) -> CheckpointedSparkSubmitHook:
        """Turn the hook ``SparkSubmitOperator._get_hook`` built into one of this class.

        The operator builds its hook from ~30 private attributes; re-listing them here
        would couple us to more internals than taking its result does.
        """
        hook.__class__ = cls
        adopted: CheckpointedSparkSubmitHook = hook  # type: ignore[assignment]
        adopted._setup(master, secret_values)
        return adopted

    def _setup(self, master: str | None, secret_values: tuple[str, ...]) -> None:
        #: called right before each real submission (never for a ``durable`` task
        #: retry that reconnects to a driver already submitted)
        self.before_submit: Callable[[], object] | None = None
        self._secret_values = tuple(v for v in secret_values if v)
        self._tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
        #: the processes spark-submit started (pid -> psutil.Process), noted while it ran
        self._unit: dict[int, Any] = {}
        self._unit_looked = float("-inf")
        if master:
            self._override_master(master)
        self._connection["spark_binary"] = resolve_spark_binary(
            self._connection["spark_binary"])

    # ------------------------------------------------------------------ public state

    @property
    def master(self) -> str:
        return str(self._connection["master"])

    @property
    def deploy_mode(self) -> str:
        return str(self._connection["deploy_mode"] or "client")

    @property
    def is_cluster_mode(self) -> bool:
        return self.deploy_mode == "cluster"

    @property
    def is_yarn_or_kubernetes(self) -> bool:
        return bool(self._is_yarn or self._is_kubernetes)

    @property
    def is_standalone_cluster_mode(self) -> bool:
        """Standalone ``spark://`` cluster deploy mode, which cannot run Python apps."""
        return self.is_cluster_mode and not self.is_yarn_or_kubernetes

    @property
    def unsupported_deploy_mode(self) -> str | None:
        """Why this master / deploy mode cannot run a Python application, or None."""
        if self.is_standalone_cluster_mode:
            return ("standalone cluster deploy mode cannot run Python applications (Spark "
                    "refuses it): use client mode, or YARN / Kubernetes cluster mode")
        return None

    @property
    def tracks_driver(self) -> bool:
        return bool(self._should_track_driver_status or self.is_yarn_or_kubernetes)

    @property
    def exit_code(self) -> int | None:
        process = self._submit_sp
        return process.returncode if process is not None else None

    @property
    def pid(self) -> int | None:
        process = self._submit_sp
        return process.pid if process is not None else None

    @property
    def driver_status(self) -> str | None:
        return self._driver_status

    @property
    def output_tail(self) -> list[str]:
        """The submission's last output lines (ours, or the provider's short tail)."""
        return list(self._tail) or list(self._last_submit_log_lines)

    def clear_output(self) -> None:
        self._tail.clear()

    def use_attempt(self, conf: Mapping[str, Any], py_files: str | None,
                    env: Mapping[str, Any]) -> None:
        """Submit with this attempt's Spark conf, ``--py-files`` and environment (instead
        of the ones the hook was built with); its credentials are masked in the output."""
        self._conf = dict(conf)
        self._py_files = py_files
        self._env_vars = dict(env)
        self._secret_values = tuple(dict.fromkeys(self._secret_values + secret_values(env)))
        self.clear_output()

    # ------------------------------------------------------------------ submission

    def submission_env(
        self, credentials: Mapping[str, str], user_conf: Mapping[str, Any],
        user_env: Mapping[str, Any], log: Any = None,
    ) -> dict[str, Any]:
        """spark-submit's environment: the user's, the storage credentials, the Python.

        In client mode the driver runs here, so it defaults to this interpreter (which
        has pyspark, boto3 and this package); executors default to it only with a
        ``local`` master. Explicit ``PYSPARK_*`` variables, ``spark.pyspark.*`` confs or
        the worker's own environment win.

        On YARN / Kubernetes the Spark hook turns ``env_vars`` into
        ``spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` confs, which are
        visible in ``ps`` and the Spark UI: ``credentials`` are therefore *not* passed
        there; the driver must get them from its own environment (instance profile /
        IRSA / a Kubernetes secret, e.g.
        ``spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY``).
        """
        if self.is_yarn_or_kubernetes and credentials:
            if log is not None:
                log.warning("%s: the storage connection's credentials are not passed to the "
                            "driver (they would travel as Spark conf); give the driver its "
                            "own AWS credentials", self.master)
            credentials = {}
        env: dict[str, Any] = {**credentials, **user_env}

        def configured(env_name: str, conf_key: str) -> bool:
            return bool(env.get(env_name) or user_conf.get(conf_key)
                        or os.environ.get(env_name))

        if not self.is_cluster_mode and not configured(
            "PYSPARK_DRIVER_PYTHON", "spark.pyspark.driver.python"
        ) and not configured("PYSPARK_PYTHON", "spark.pyspark.python"):
            env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        if self.master.startswith("local") and not configured(
            "PYSPARK_PYTHON", "spark.pyspark.python"
        ):
            env["PYSPARK_PYTHON"] = sys.executable
        return env

    def failure_of(self, exc: BaseException, attempt: int) -> DriverFailure | None:
        """Classify an error raised by a blocking submission: a driver failure (non-zero
        exit, or a tracked driver that ended FAILED / ERROR / KILLED / UNKNOWN), or None
        when it is no driver failure (spark-submit missing, a bad connection, ...) and
        must propagate unchanged."""
        exit_code, status = self.exit_code, self.driver_status
        if exit_code in (None, 0) and not (self.tracks_driver and isinstance(exc, RuntimeError)) \
                and status not in ("FAILED", "ERROR", "KILLED", "UNKNOWN"):
            return None
        return DriverFailure.of_output(attempt, exit_code, self.output_tail, status)

    def kill_tree(self, kill: Callable[[], object] | None = None) -> None:
        """Kill the running spark-submit with ``kill`` (default: this hook's ``on_kill``;
        the operator passes its deploy-mode backend's), then every process it had
        started (a client-mode driver's JVM and Python), which ``on_kill`` misses."""
        children = _child_processes(self.pid) if self.pid is not None else []
        (kill or self.on_kill)()
        for child in children:
            with contextlib.suppress(Exception):  # already gone
                child.kill()

    # ------------------------------------------------------------------ masking

    def mask(self, text: str) -> str:
        for value in self._secret_values:
            text = text.replace(value, "******")
        return text

    def _mask_cmd(self, connection_cmd: str | list[str]) -> str:
        return self.mask(super()._mask_cmd(connection_cmd))

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        def capture(lines: Iterator[Any]) -> Iterator[Any]:
            for line in lines:
                self._note_unit()
                masked = self.mask(str(line))
                self._tail.append(masked.rstrip("\n"))
                yield masked

        super()._process_spark_submit_log(capture(itr))

    # ------------------------------------------------------------------ detached submit

    def submit(self, application: str = "", **kwargs: Any) -> None:
        """``SparkSubmitHook.submit``, after :attr:`before_submit`; returns (or raises)
        once the processes spark-submit started have ended too (see the module doc)."""
        if self.before_submit is not None:
            self.before_submit()
        self._unit.clear()
        try:
            super().submit(application, **kwargs)
        finally:
            end_processes(list(self._unit.values()), warn=self.log.warning)
            self._unit.clear()

    def _note_unit(self) -> None:
        """Note spark-submit's descendants (the JVM's Python driver), at most once per
        :data:`UNIT_LOOK_S`: after the JVM died they are no longer its children."""
        now = time.monotonic()
        if self.pid is None or now - self._unit_looked < UNIT_LOOK_S:
            return
        self._unit_looked = now
        for process in _child_processes(self.pid):
            self._unit.setdefault(process.pid, process)

    def submit_detached(self, application: str, log_path: str | Path) -> DetachedDriver:
        """Start spark-submit in its own session (it outlives this process); don't wait.

        Output goes to ``log_path``; the launcher writes the exit code to
        ``<log_path>.exit`` when spark-submit ends.
        """
        command = self._build_spark_submit_command(application)
        env = os.environ.copy()
        if self._env:
            env.update({k: str(v) for k, v in self._env.items()})
        log_file = Path(log_path)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        exit_path = exit_path_of(log_file)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(exit_path)
        if self.is_cluster_mode:
            self.log.info("cluster deploy mode: the driver runs in the cluster; the local "
                          "spark-submit client is detached as well")
        self.log.info("Spark-Submit cmd (detached, log %s): %s", log_file,
                      self._mask_cmd(command))
        with open(log_file, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "airflow_ckpt.launch", exit_path, "--", *command],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, close_fds=True,
            )
        return DetachedDriver(process.pid, str(log_file), exit_path)

    def _override_master(self, master: str) -> None:
        """Recompute the flags the provider derives from the master in its constructor."""
        self._connection["master"] = master
        self._connection["rest_endpoint"] = None
        self._is_yarn = "yarn" in master
        self._is_yarn_cluster_mode = self._is_yarn and self._connection["deploy_mode"] == "cluster"
        self._is_kubernetes = "k8s" in master
        self._should_track_driver_status = self._resolve_should_track_driver_status()


def secret_values(env: Mapping[str, Any]) -> tuple[str, ...]:
    """The credential values in an environment mapping (to mask them)."""
    return tuple(str(v) for k, v in env.items() if k in SECRET_ENV_NAMES and v)


def resolve_spark_binary(name: str) -> str:
    """``name`` if it is on PATH (or a path); else the one of this interpreter's pyspark.

    An Airflow worker started without activating its virtualenv does not have the
    venv's ``bin`` on PATH, but pip's ``pyspark`` ships a complete ``spark-submit``
    beside the interpreter and in ``pyspark/bin``.
    """
    if os.sep in name or shutil.which(name):
        return name
    candidates = [Path(sys.executable).parent / name]
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "bin" / name)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return name


def _child_processes(pid: int) -> list[Any]:
    try:
        import psutil

        return list(psutil.Process(pid).children(recursive=True))
    except Exception:  # psutil missing or the process is gone
        return []
