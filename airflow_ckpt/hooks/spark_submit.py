"""CheckpointedSparkSubmitHook: the one place that touches ``SparkSubmitHook`` internals.

The operator and the supervision trigger use only the public properties below
(``master``, ``deploy_mode``, ``is_cluster_mode``, ``exit_code``, ``driver_status``,
``output_tail``) and :meth:`submit_detached`. The provider's private attributes this
class reads (``_connection``, ``_submit_sp``, ``_driver_status``,
``_last_submit_log_lines``, ``_is_yarn``, ``_is_kubernetes``, ``_is_yarn_cluster_mode``,
``_should_track_driver_status``, ``_build_spark_submit_command``, ``_env``) are those of
``apache-airflow-providers-apache-spark`` 6.x (read against 6.3.4); the package bound
belongs in ``pyproject.toml``.

Detached drivers (deferrable supervision): :meth:`submit_detached` starts spark-submit
through ``python -m airflow_ckpt.launch`` in its own session with output to a log file,
so the driver outlives the task process; the launcher writes spark-submit's exit code
to ``<log>.exit`` when it ends (:func:`read_exit_code`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

#: spark-submit output lines kept per submission to report the driver's last error
OUTPUT_TAIL_LINES = 400

#: environment variable names whose values are credentials (masked everywhere)
SECRET_ENV_NAMES = frozenset({"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                              "AWS_SECURITY_TOKEN"})


@dataclass(frozen=True, slots=True)
class DetachedDriver:
    """A spark-submit started in its own session: pid (= its process group), log, exit file."""

    pid: int
    log_path: str
    exit_path: str


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
                masked = self.mask(str(line))
                self._tail.append(masked.rstrip("\n"))
                yield masked

        super()._process_spark_submit_log(capture(itr))

    # ------------------------------------------------------------------ detached submit

    def submit(self, application: str = "", **kwargs: Any) -> None:
        """``SparkSubmitHook.submit``, after :attr:`before_submit`."""
        if self.before_submit is not None:
            self.before_submit()
        super().submit(application, **kwargs)

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
        exit_path = f"{log_file}.exit"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(exit_path)
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


def read_exit_code(exit_path: str | None) -> int | None:
    """The exit code a detached launcher wrote, or None (still running / other host)."""
    if not exit_path:
        return None
    try:
        return int(Path(exit_path).read_text().strip())
    except (OSError, ValueError):
        return None


def signal_detached(pid: int, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to a detached driver's whole process group; False if it is gone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def log_tail(path: str | None, lines: int = OUTPUT_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a detached driver's log (empty if unreadable here)."""
    if not path:
        return []
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


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
