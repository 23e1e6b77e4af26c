"""Append-only job history in storage: ``<job>/history/<epoch-ms>-<uid>.json``.

Every event is its own object written create-only, so concurrent writers (the
driver, the Airflow supervisor) never overwrite each other, and listing the prefix
returns the events in time order. The restart strategies' failure log lives here too,
so it spans in-process restarts, driver resubmissions and Airflow worker restarts.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_ckpt.errors import MetadataError, ObjectAlreadyExistsError
from airflow_ckpt.runtime.layout import JobLayout
from airflow_ckpt.runtime.masking import mask_value
from airflow_ckpt.runtime.storage.base import CheckpointStorage

# Event types. Payload fields are documented in docs/storage-layout.md.
JOB_SUBMITTED = "job_submitted"  # supervisor: spark-submit started (attempt, deploy target)
JOB_STARTED = "job_started"  # driver: runtime up (query name, spark version, config)
RESTORED = "restored"  # driver: restored from (path, checkpoint id, batch id)
RESTORE_FALLBACK = "restore_fallback"  # driver: newest was damaged, fell back (why)
CHECKPOINT_COMPLETED = "checkpoint_completed"  # Flink history entry fields
CHECKPOINT_FAILED = "checkpoint_failed"  # id, failure_message
SAVEPOINT_COMPLETED = "savepoint_completed"
SAVEPOINT_FAILED = "savepoint_failed"
FAILURE = "failure"  # level: query|driver, cause, exit_code, last error lines
RESTART = "restart"  # decision: restart bool, delay_s, attempt, strategy, strategy_state
JOB_FINISHED = "job_finished"  # clean end (source exhausted)
JOB_STOPPED = "job_stopped"  # stop(-with-savepoint) request honoured
JOB_FAILED = "job_failed"  # terminal failure (strategy declined)

EVENT_TYPES = frozenset(
    {
        JOB_SUBMITTED, JOB_STARTED, RESTORED, RESTORE_FALLBACK, CHECKPOINT_COMPLETED,
        CHECKPOINT_FAILED, SAVEPOINT_COMPLETED, SAVEPOINT_FAILED, FAILURE, RESTART,
        JOB_FINISHED, JOB_STOPPED, JOB_FAILED,
    }
)


_clock_lock = threading.Lock()
_last_ms = 0


def _next_ms(now: float) -> int:
    """Epoch ms for an event key, strictly increasing within this process: events one
    writer appends in the same millisecond still list in the order they were written."""
    global _last_ms
    with _clock_lock:
        _last_ms = max(int(now * 1000), _last_ms + 1)
        return _last_ms


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event: its type, when (epoch seconds), its storage key and payload."""

    type: str
    ts: float
    key: str
    data: dict[str, Any]


class JobHistory:
    """Reads and appends the history of one job."""

    def __init__(self, storage: CheckpointStorage, job: str) -> None:
        self.storage = storage
        self.layout = JobLayout(job)

    def append(self, event_type: str, **data: Any) -> HistoryEvent:
        """Append one event. Durable when this returns."""
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown history event type {event_type!r}")
        while True:
            now = time.time()
            key = self.layout.history_event(_next_ms(now), uuid.uuid4().hex[:12])
            body = {"type": event_type, "ts": now, "job": self.layout.job, **mask_value(data)}
            try:
                self.storage.put_bytes(key, json.dumps(body, default=str).encode(),
                                       create_only=True)
            except ObjectAlreadyExistsError:  # a 48-bit uid collision: pick another
                continue
            return HistoryEvent(event_type, now, key, body)

    def events(self, types: Iterable[str] | None = None) -> list[HistoryEvent]:
        """All events in time order, optionally only those of ``types``.

        An unreadable event (corrupt JSON) raises ``MetadataError`` naming its key:
        history is evidence and is never silently skipped.
        """
        wanted = set(types) if types is not None else None
        out = []
        for info in self.storage.list(self.layout.history_prefix):
            if not info.key.endswith(".json"):
                continue
            raw = self.storage.get_bytes(info.key)
            try:
                body = json.loads(raw)
                event_type, ts = body["type"], float(body["ts"])
            except (ValueError, KeyError, TypeError) as exc:
                raise MetadataError(f"history event {info.key} is unreadable: {exc}") from exc
            if wanted is None or event_type in wanted:
                out.append(HistoryEvent(event_type, ts, info.key, body))
        return out

    def last(self, event_type: str) -> HistoryEvent | None:
        """The newest event of ``event_type``, if any."""
        found = self.events([event_type])
        return found[-1] if found else None
