"""The job page's "Latest failure" card: the newest failure of any kind, error first.

Flink's ``latest.failed`` (in :func:`~airflow_ckpt.plugins.overview.checkpoint_stats`) is
the newest failed *checkpoint*; a user looking at a job wants the newest thing that went
wrong, whatever it was:

* a failed checkpoint or savepoint (``checkpoint_failed`` / ``savepoint_failed``);
* a driver or query failure (``failure``: a crash, a killed driver, a query that died);
* a restart decision that declined to restart (``restart`` with ``restart: false``);
* the job's final failure (``job_failed``).

Each is shown with the Python exception's message first
(:func:`airflow_ckpt.driver_output.python_error`: ``RuntimeError: injected``, not the
``exit code 17`` around it nor the py4j frames), the raw cause and details after it.
Failures in the events stream are found however old (the history reads that stream
only, newest first, up to the first failure); checkpoint failures come from the page's
history window (the checkpoint stream is the large one).
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt.driver_output import exit_cause, python_error
from airflow_ckpt.plugins.redact import driver_text
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.events import HistoryEvent
from airflow_ckpt.runtime.history.reader import EventCache, HistoryReader
from airflow_ckpt.runtime.storage.base import CheckpointStorage

#: event types that may be a failure (a ``restart`` only when it declined)
_FAILURE_TYPES = frozenset({ev.FAILURE, ev.RESTART, ev.JOB_FAILED, ev.SAVEPOINT_FAILED})


def is_failure(event: HistoryEvent) -> bool:
    """Whether the card shows ``event`` (see the module docstring)."""
    if event.type == ev.RESTART:
        return not event.data.get("restart", True)
    return event.type in _FAILURE_TYPES or event.type == ev.CHECKPOINT_FAILED


def newest_event_failure(storage: CheckpointStorage, job: str,
                         cache: EventCache | None = None) -> HistoryEvent | None:
    """The newest failure in the job's ``events`` stream (reads that stream newest
    first, up to the first failure; unreadable objects are skipped: the page lists
    them)."""
    history = HistoryReader(storage, job, cache=cache)
    found, _ = history.newest_until(is_failure, _FAILURE_TYPES, on_error=lambda _: None)
    return found[-1] if found and is_failure(found[-1]) else None


def _what(event: HistoryEvent) -> str:
    d = event.data
    if event.type == ev.FAILURE:
        level = d.get("level") or "driver"
        return "driver crash" if level == "driver" else f"{level} failure"
    if event.type == ev.RESTART:
        return f"restart declined ({d.get('strategy') or 'restart strategy'})"
    if event.type == ev.JOB_FAILED:
        return "job failed"
    kind = "savepoint" if event.type == ev.SAVEPOINT_FAILED else "checkpoint"
    number = d.get("id") if d.get("id") is not None else d.get("checkpoint_id")
    return f"{kind} {number} failed" if number is not None else f"{kind} failed"


def describe_failure(event: HistoryEvent) -> dict[str, Any]:
    """The card's fields: ``what``, ``ts``, ``message`` (the Python error if there is
    one, else the cause), ``cause`` (when it says more than the message), ``details``
    (attempt, exit code, run id), ``error_lines``, ``type``."""
    d = event.data
    lines = [driver_text(x) for x in d.get("error_lines") or []]
    cause = driver_text(d.get("cause") or d.get("failure_message") or d.get("reason") or "")
    if not cause and isinstance(d.get("exit_code"), int):
        cause = exit_cause(d["exit_code"])
    message = python_error([*lines, cause]) or cause or "no cause recorded"
    details = [f"{name.replace('_', ' ')} {d[name]}"
               for name in ("attempt", "exit_code", "attempts") if d.get(name) not in (None, "")]
    if d.get("run_id"):
        details.append(f"run {d['run_id']}")
    return {
        "type": event.type,
        "what": _what(event),
        "ts": event.ts,
        "message": message,
        "cause": cause if cause and cause != message else "",
        "details": ", ".join(str(x) for x in details),
        "error_lines": lines[:20],
    }


def latest_failure(storage: CheckpointStorage, job: str, window_events: list[HistoryEvent],
                   cache: EventCache | None = None) -> dict[str, Any] | None:
    """The newest failure of any kind (events stream, and the window's checkpoint
    failures), as :func:`describe_failure`; None if the job has none."""
    candidates = [e for e in window_events if e.type == ev.CHECKPOINT_FAILED]
    newest = newest_event_failure(storage, job, cache)
    if newest is not None:
        candidates.append(newest)
    if not candidates:
        return None
    return describe_failure(max(candidates, key=lambda e: e.seq))  # one append order
