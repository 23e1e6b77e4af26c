"""Read-side views of the storage contract for the UI: jobs, checkpoint stats, events.

Pure functions over a :class:`CheckpointStorage` (no FastAPI, no Airflow), so the JSON
endpoints, the HTML pages and tests share one implementation.

The checkpoint statistics follow Flink's REST ``/jobs/:id/checkpoints``: ``counts``,
``summary``, ``latest`` (``completed``, ``savepoint``, ``failed``, ``restored``) and
``history``. Every count is a count of events (or of retained checkpoints), named for
what it counts: Flink's ``restored`` counts ``restored`` events, which a driver writes
at its start (when it found something to restore) *and* after each in-process restart
of its query, so ``driver_starts`` (``job_started`` events) and ``in_process_restarts``
(``restart`` events of level ``query`` that restarted) stand beside it; ``retained``
counts the retained checkpoints, whose ids are the top-level ``retained`` list.
History entries come from two sources:

* the ``checkpoint_completed`` / ``savepoint_completed`` / ``*_failed`` history events
  (every checkpoint ever taken, including those retention has since discarded);
* the ``_metadata`` manifests of the retained checkpoints and savepoints, rendered with
  :meth:`Manifest.history_entry`; they are authoritative for what is still restorable
  and appear even if their event lies outside the history window.

Only the newest ``limit`` history events are read (one listing of ``history/``, then the
raw tail and the compacted segments that hold the window, see
:mod:`airflow_ckpt.runtime.history.journal`), so a job with a long history stays cheap to show;
``history_window`` says whether older events were left out, and the counts then cover
the window (plus retained manifests).
An unreadable event or manifest is reported in ``errors``, never silently skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_ckpt.errors import AirflowCkptError, MetadataError, RestoreError
from airflow_ckpt.health import DEFAULT_MULTIPLE
from airflow_ckpt.plugins import failures, jobstate, trends
from airflow_ckpt.plugins.access import EVERY_DAG, DagAccess
from airflow_ckpt.plugins.redact import driver_text
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.events import HistoryEvent
from airflow_ckpt.runtime.history.reader import EventCache, HistoryReader
from airflow_ckpt.runtime.sources.kafka import position_lines
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import validate_job_name

#: Events shown in the "restarts, failures and lifecycle" table of a job page.
TIMELINE_EVENTS = frozenset(
    {
        ev.JOB_SUBMITTED, ev.JOB_STARTED, ev.RESTORED, ev.RESTORE_FALLBACK, ev.FAILURE,
        ev.RESTART, ev.JOB_FINISHED, ev.JOB_STOPPED, ev.JOB_FAILED, ev.SINK_AHEAD,
        ev.SINK_REPLAY_PUBLISHED,
    }
)
_LIFECYCLE = {ev.JOB_STARTED: "RUNNING", ev.JOB_FINISHED: "FINISHED",
              ev.JOB_STOPPED: "STOPPED", ev.JOB_FAILED: "FAILED"}
#: payload fields written from driver output (rendered through ``driver_text``)
_DRIVER_TEXT = frozenset({"cause", "reason", "failure_message"})
_COMPLETED = {ev.CHECKPOINT_COMPLETED, ev.SAVEPOINT_COMPLETED}
_FAILED = {ev.CHECKPOINT_FAILED, ev.SAVEPOINT_FAILED}
_ENTRY_FIELDS = (
    "id", "status", "is_savepoint", "savepoint_id", "checkpoint_type", "trigger", "batch_id",
    "trigger_timestamp", "latest_ack_timestamp", "failure_timestamp", "state_size",
    "checkpointed_size", "end_to_end_duration", "start_delay", "sync_duration",
    "async_duration", "num_subtasks", "num_acknowledged_subtasks", "external_path",
    "discarded", "failure_message", "request_id", "imported_from", "source_positions",
)


class UnknownJobError(AirflowCkptError, LookupError):
    """The job name is not valid or has nothing stored under the storage root."""


@dataclass(slots=True)
class HistoryWindow:
    """The newest events of a job (oldest first) and what reading them found."""

    job: str
    events: list[HistoryEvent]
    total: int  # history objects stored
    read: int  # of them read (the window)
    errors: list[str] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.read < self.total

    def describe(self) -> dict[str, Any]:
        return {"events_read": self.read, "events_total": self.total,
                "truncated": self.truncated}


def require_job(storage: CheckpointStorage, job: str) -> str:
    """``job`` if it is a valid name with something stored, else :class:`UnknownJobError`."""
    try:
        validate_job_name(job)
    except AirflowCkptError as exc:
        raise UnknownJobError(f"{job!r} is not a valid job name") from exc
    if job not in storage.list_dirs(""):
        raise UnknownJobError(f"job {job!r} has nothing stored in {storage.uri}")
    return job


def require_visible_job(
    storage: CheckpointStorage, job: str, access: DagAccess, cache: EventCache | None = None
) -> jobstate.JobState:
    """The job's state if it exists and ``access`` may see it, else :class:`UnknownJobError`
    (a hidden job answers as an unknown one: its name does not leak)."""
    require_job(storage, job)
    state = jobstate.job_state(storage, job, cache)
    if not access.may_read(state.dag_id):
        raise UnknownJobError(f"job {job!r} has nothing stored in {storage.uri}")
    return state


def job_view(
    storage: CheckpointStorage,
    job: str,
    *,
    limit: int,
    access: DagAccess = EVERY_DAG,
    cache: EventCache | None = None,
    stale_multiple: float = DEFAULT_MULTIPLE,
    now: float | None = None,
) -> dict[str, Any]:
    """Everything the job page shows (the template's context), read from storage.

    Costs: the job check (one listing of the root), the state scan of the ``events``
    stream, one listing of ``history/`` plus the raw tail and the segments holding the
    newest ``limit`` events (none that ``cache`` holds), the catalog's listings and
    retained ``_metadata``, the lease (one listing, one GET). Without a ``cache`` one
    lives for this call, so no object is read twice.
    """
    cache = cache if cache is not None else EventCache()
    state = require_visible_job(storage, job, access, cache)
    window = read_history(storage, job, limit, cache=cache)
    stats = checkpoint_stats(storage, job, window)
    latest = stats["latest"]["completed"]
    ack = latest.get("latest_ack_timestamp") if latest else None
    last_ts = ack / 1000 if isinstance(ack, int | float) else None
    health = jobstate.job_health(state, last_ts, jobstate.read_lease_view(storage, job),
                                 time.time() if now is None else now, stale_multiple)
    return {
        "job": job, "stats": stats, "timeline": timeline(window),
        "status": job_status(window), "health": health.to_json(), "dag_id": state.dag_id,
        "charts": trends.charts(stats["history"], window.events),
        "failure": failures.latest_failure(storage, job, window.events, cache),
    }


def read_history(
    storage: CheckpointStorage,
    job: str,
    limit: int,
    types: Iterable[str] | None = None,
    cache: EventCache | None = None,
) -> HistoryWindow:
    """The newest ``limit`` history events of ``job`` (oldest first), filtered by ``types``.

    ``limit`` bounds the events read, before filtering: the window is the same for
    every filter. Costs one listing of ``history/`` plus the raw events and segments
    that hold the window (none that ``cache`` holds already). Unreadable events are
    listed in ``errors`` with their keys.
    """
    errors: list[str] = []
    history = HistoryReader(storage, job, cache=cache)
    events, listing = history.newest(limit, on_error=errors.append)
    wanted = set(types) if types is not None else None
    kept = [e for e in events if wanted is None or e.type in wanted]
    return HistoryWindow(job, kept, total=listing.total,
                         read=min(len(events) + len(errors), listing.total), errors=errors)


def event_json(event: HistoryEvent) -> dict[str, Any]:
    """An event as stored, plus its storage ``key``."""
    return {**event.data, "type": event.type, "ts": event.ts, "key": event.key}


# ----------------------------------------------------------------- checkpoint statistics


def _entry(values: dict[str, Any]) -> dict[str, Any]:
    """A history entry with every field present (``None`` when unknown), in a fixed order."""
    entry = {name: values.get(name) for name in _ENTRY_FIELDS}
    entry["is_savepoint"] = bool(entry["is_savepoint"])
    entry["checkpoint_type"] = "SAVEPOINT" if entry["is_savepoint"] else "CHECKPOINT"
    entry["discarded"] = bool(entry["discarded"])
    return entry


def _key(entry: dict[str, Any]) -> tuple[str, Any]:
    if entry["is_savepoint"] and entry.get("savepoint_id"):
        return ("savepoint", entry["savepoint_id"])
    return ("savepoint" if entry["is_savepoint"] else "checkpoint", entry["id"])


def _from_event(event: HistoryEvent) -> dict[str, Any]:
    data = dict(event.data)
    data.setdefault("external_path", data.get("path"))
    if event.type in _FAILED:
        data["failure_message"] = driver_text(data.get("failure_message")) or None
        data["status"] = "FAILED"
        data.setdefault("failure_timestamp", int(event.ts * 1000))
        data.setdefault("is_savepoint", event.type == ev.SAVEPOINT_FAILED)
    else:
        data["status"] = "COMPLETED"
        data.setdefault("is_savepoint", event.type == ev.SAVEPOINT_COMPLETED)
    return _entry(data)


def _from_manifest(manifest: Manifest, path: str) -> dict[str, Any]:
    """A retained checkpoint's entry, with its Kafka source positions per
    topic-partition (what a restore of it re-reads from) and, for an imported savepoint,
    the Spark checkpoint directory it came from."""
    positions = [line for offset in manifest.source_offsets
                 for line in position_lines(offset) or []]
    return _entry({**manifest.history_entry(), "external_path": path,
                   "imported_from": manifest.extra.get("imported_from"),
                   "source_positions": positions})


def _retained(
    storage: CheckpointStorage, job: str, errors: list[str]
) -> tuple[list[dict[str, Any]], int]:
    """Entries of the retained checkpoints and savepoints; checkpoint dirs without one."""
    catalog = CheckpointCatalog(storage, job)
    entries = []
    completed = catalog.checkpoint_ids()
    refs = [catalog.resolve(f"chk-{n}") for n in completed]
    refs += [catalog.resolve(f"savepoints/sp-{sp}") for sp in catalog.savepoint_ids()]
    for ref in refs:
        try:
            manifest = catalog.read(ref)
        except (MetadataError, RestoreError) as exc:  # corrupt, or discarded meanwhile
            errors.append(f"{ref.metadata_key}: {exc}")
            continue
        entries.append(_from_manifest(manifest, catalog.uri_of(ref)))
    incomplete = len(set(catalog.checkpoint_ids(completed_only=False)) - set(completed))
    return entries, incomplete


def checkpoint_stats(storage: CheckpointStorage, job: str, window: HistoryWindow) -> dict[str, Any]:
    """Flink's ``/jobs/:id/checkpoints`` for ``job`` (see the module docstring)."""
    errors = list(window.errors)
    by_key: dict[tuple[str, Any], dict[str, Any]] = {}
    failed: list[dict[str, Any]] = []
    restored: list[HistoryEvent] = []
    driver_starts = in_process_restarts = 0
    for event in window.events:
        if event.type in _COMPLETED:
            entry = _from_event(event)
            entry["discarded"] = True  # until a retained manifest says otherwise
            by_key[_key(entry)] = entry
        elif event.type in _FAILED:
            failed.append(_from_event(event))
        elif event.type == ev.RESTORED:
            restored.append(event)
        elif event.type == ev.JOB_STARTED:
            driver_starts += 1
        elif event.type == ev.RESTART and event.data.get("level") == "query" \
                and event.data.get("restart"):
            in_process_restarts += 1
    retained, incomplete = _retained(storage, job, errors)
    for entry in retained:
        key = _key(entry)
        if key in by_key and by_key[key].get("request_id"):
            entry["request_id"] = by_key[key]["request_id"]
        by_key[key] = entry
    completed = list(by_key.values())
    history = sorted(
        completed + failed,
        key=lambda e: (e["trigger_timestamp"] or 0, e["id"] if isinstance(e["id"], int) else -1),
        reverse=True,
    )
    checkpoints = [e for e in history if e["status"] == "COMPLETED" and not e["is_savepoint"]]
    savepoints = [e for e in history if e["status"] == "COMPLETED" and e["is_savepoint"]]
    failures = [e for e in history if e["status"] == "FAILED"]
    last_restore = restored[-1] if restored else None
    retained_ids = sorted(e["id"] for e in completed
                          if not e["discarded"] and not e["is_savepoint"])
    return {
        "job": job,
        "storage": storage.uri,
        "counts": {
            "restored": len(restored),
            "total": len(completed) + len(failed),
            "in_progress": incomplete,
            "completed": len(completed),
            "failed": len(failed),
            "retained": len(retained_ids),
            "driver_starts": driver_starts,
            "in_process_restarts": in_process_restarts,
        },
        "summary": trends.summary(completed),
        "latest": {
            "completed": checkpoints[0] if checkpoints else None,
            "savepoint": savepoints[0] if savepoints else None,
            "failed": failures[0] if failures else None,
            "restored": None if last_restore is None else {
                "id": last_restore.data.get("checkpoint_id"),
                "restore_timestamp": int(last_restore.ts * 1000),
                "is_savepoint": last_restore.data.get("kind") == "savepoint",
                "savepoint_id": last_restore.data.get("savepoint_id"),
                "batch_id": last_restore.data.get("batch_id"),
                "from_job": last_restore.data.get("from_job"),
                "external_path": last_restore.data.get("path"),
            },
        },
        "retained": retained_ids,
        "history": history,
        "history_window": window.describe(),
        "errors": errors,
    }


# --------------------------------------------------------------------------- timeline


def _summary(event: HistoryEvent) -> str:
    """One line about what an event says (the full payload is in the JSON endpoint)."""
    d = event.data

    def has(*names: str) -> list[str]:
        return [f"{n}={driver_text(d[n]) if n in _DRIVER_TEXT else d[n]}" for n in names
                if d.get(n) not in (None, "", [], {})]

    if event.type == ev.FAILURE:
        parts = has("level", "cause", "exit_code", "attempt")
    elif event.type == ev.RESTART:
        decision = "restart" if d.get("restart") else "no restart"
        parts = [f"{d.get('strategy', '?')}: {decision}",
                 *has("level", "attempt", "delay_s", "cause")]
    elif event.type == ev.RESTORED:
        parts = has("kind", "checkpoint_id", "savepoint_id", "batch_id", "from_job", "path")
    elif event.type == ev.RESTORE_FALLBACK:
        parts = has("path", "reason")
    elif event.type == ev.JOB_SUBMITTED:
        parts = has("attempt", "restore", "master", "deploy_mode")
        airflow = d.get("airflow")
        if isinstance(airflow, dict):
            parts.append("task " + "/".join(
                str(airflow.get(k)) for k in ("dag_id", "run_id", "task_id")))
    elif event.type == ev.JOB_STARTED:
        parts = has("attempt", "restore", "spark_version")
    elif event.type == ev.SINK_AHEAD:
        parts = has("sink", "first_batch", "last_batch", "restored_batch", "restored")
    elif event.type == ev.SINK_REPLAY_PUBLISHED:
        parts = has("sink", "batch", "committed_offsets", "replay_offsets")
    else:
        parts = has("cause", "checkpoint_id", "savepoint", "exit_code", "attempts", "reason")
    return ", ".join(parts)


def timeline(window: HistoryWindow) -> list[dict[str, Any]]:
    """Restart, failure, restore and lifecycle events, newest first, with a summary."""
    rows = []
    for event in reversed(window.events):
        if event.type not in TIMELINE_EVENTS:
            continue
        rows.append({
            "type": event.type,
            "ts": event.ts,
            "run_id": event.data.get("run_id"),
            "level": event.data.get("level"),
            "summary": _summary(event),
            "error_lines": [driver_text(x) for x in event.data.get("error_lines") or []][:20],
        })
    return rows


def job_status(window: HistoryWindow) -> str | None:
    """``RUNNING``/``FINISHED``/``STOPPED``/``FAILED`` from the newest lifecycle event."""
    for event in reversed(window.events):
        if event.type in _LIFECYCLE:
            return _LIFECYCLE[event.type]
    return None


# ------------------------------------------------------------------------------- jobs


def jobs_overview(
    storage: CheckpointStorage,
    cache: EventCache | None = None,
    now: float | None = None,
    stale_multiple: float = DEFAULT_MULTIPLE,
) -> list[dict[str, Any]]:
    """Every job under the root: its newest retained checkpoint, the DAG of its newest
    submission (``dag_id``) and its health badge. Per job: the catalog's listings, one
    ``_metadata``, the ``events`` stream back to the newest submission, the lease."""
    now = time.time() if now is None else now
    out = []
    for job in CheckpointCatalog.jobs(storage):
        try:
            validate_job_name(job)
        except AirflowCkptError:
            continue  # not a job directory (e.g. a sink's "_output")
        catalog = CheckpointCatalog(storage, job)
        row: dict[str, Any] = {"id": job, "latest_completed": None, "num_retained": 0,
                               "num_savepoints": 0, "error": None, "dag_id": None,
                               "health": None}
        last_completed_ts = None
        try:
            ids = catalog.checkpoint_ids()
            row["num_retained"] = len(ids)
            row["num_savepoints"] = len(catalog.savepoint_ids())
            if ids:
                ref = catalog.resolve(f"chk-{ids[-1]}")
                manifest = catalog.read(ref)
                row["latest_completed"] = _from_manifest(manifest, catalog.uri_of(ref))
                last_completed_ts = manifest.timings.completed_ts
        except (MetadataError, RestoreError) as exc:
            row["error"] = str(exc)
        problems: list[str] = []
        state = jobstate.job_state(storage, job, cache, problems.append)
        if problems and not row["error"]:
            row["error"] = problems[0]
        row["dag_id"] = state.dag_id
        lease = jobstate.read_lease_view(storage, job)
        health = jobstate.job_health(state, last_completed_ts, lease, now, stale_multiple)
        row["health"] = health.to_json()
        out.append(row)
    return out


def find_job_for_task(
    storage: CheckpointStorage, dag_id: str, run_id: str, task_id: str,
    cache: EventCache | None = None,
) -> str | None:
    """The job whose newest ``job_submitted`` event came from this task instance.

    The fallback of the task link when it carries no job name: reads every job's
    ``events`` stream (never its checkpoint statistics), newest first, until a match.
    """
    found: tuple[float, str] | None = None

    def ours(event: HistoryEvent) -> bool:
        ids = event.data.get("airflow")
        return (isinstance(ids, dict) and ids.get("dag_id") == dag_id
                and ids.get("run_id") == run_id and ids.get("task_id") == task_id)

    for job in CheckpointCatalog.jobs(storage):
        try:
            validate_job_name(job)
        except AirflowCkptError:
            continue
        history = HistoryReader(storage, job, cache=cache)
        events, _ = history.newest_until(ours, [ev.JOB_SUBMITTED])
        if events and ours(events[-1]) and (found is None or events[-1].ts > found[0]):
            found = (events[-1].ts, job)
    return found[1] if found else None
