"""History event types, their streams, and one event as read back.

Payload fields are documented in docs/storage-layout.md. Every module that writes or
matches an event type names it by these constants, never by its string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from airflow_ckpt.errors import MetadataError

# Event types.
JOB_SUBMITTED = "job_submitted"  # supervisor: spark-submit started (attempt, deploy target)
JOB_STARTED = "job_started"  # driver: runtime up (query name, spark version, config)
RESTORED = "restored"  # driver: restored from (path, checkpoint id, batch id)
RESTORE_FALLBACK = "restore_fallback"  # driver: newest was damaged, fell back (why)
SINK_AHEAD = "sink_ahead"  # driver: a sink committed batches after the restored one
#: driver, AT_LEAST_ONCE: a replay of a committed batch read other offsets, published extra
SINK_REPLAY_PUBLISHED = "sink_replay_published"
#: driver: a restore found source records gone and failOnDataLoss=false (ranges, path)
SOURCE_DATA_LOST = "source_data_lost"
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
        JOB_FINISHED, JOB_STOPPED, JOB_FAILED, SINK_AHEAD, SINK_REPLAY_PUBLISHED,
        SOURCE_DATA_LOST,
    }
)
#: events that end every supervision of the job
TERMINAL_EVENTS = frozenset({JOB_FINISHED, JOB_STOPPED, JOB_FAILED})
#: the driver's lifecycle: it started, then one of the terminal events
LIFECYCLE_EVENTS = frozenset({JOB_STARTED}) | TERMINAL_EVENTS
#: events that belong to one supervision run (they carry ``run_id``)
RUN_EVENTS = frozenset({JOB_SUBMITTED, JOB_STARTED, FAILURE, RESTART})
#: completed snapshots, checkpoint or savepoint
SNAPSHOT_COMPLETED_EVENTS = frozenset({CHECKPOINT_COMPLETED, SAVEPOINT_COMPLETED})

#: Events compacted into the ``checkpoints`` stream (subject to retention); every other
#: type goes to the ``events`` stream, which is never deleted.
CHECKPOINT_STREAM_TYPES = frozenset({CHECKPOINT_COMPLETED, CHECKPOINT_FAILED})
STREAM_CHECKPOINTS = "checkpoints"
STREAM_EVENTS = "events"
#: the order a compaction writes its segments in: ``events`` last, it seals (see
#: :mod:`airflow_ckpt.runtime.history.journal`)
STREAMS = (STREAM_CHECKPOINTS, STREAM_EVENTS)
#: the type of a placeholder event for an unreadable object (kept as evidence)
UNREADABLE = "_unreadable"

RAW_RE = re.compile(r"^(\d{16})\.json$")


def stream_of(event_type: str) -> str:
    """The segment stream an event type is compacted into."""
    return STREAM_CHECKPOINTS if event_type in CHECKPOINT_STREAM_TYPES else STREAM_EVENTS


def streams_for(types: set[str] | None) -> tuple[str, ...]:
    """The streams that can hold events of ``types``."""
    if types is None:
        return STREAMS
    out = []
    if types & CHECKPOINT_STREAM_TYPES:
        out.append(STREAM_CHECKPOINTS)
    if types - CHECKPOINT_STREAM_TYPES:
        out.append(STREAM_EVENTS)
    return tuple(out)


def seq_of_key(key: str) -> int:
    """The sequence number of a raw event key (``.../history/<seq>.json``)."""
    match = RAW_RE.match(key.rsplit("/", 1)[-1])
    if match is None:
        raise ValueError(f"not a history event key: {key!r}")
    return int(match.group(1))


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event: its type, when (the writer's epoch seconds), its key and payload.

    ``key`` is the event's raw object key ``<job>/history/<seq>.json`` even when the
    event now lives in a segment: it orders events (:attr:`seq`) and deduplicates them.
    ``ts`` comes from the clock of the host that wrote it: show it, never order by it.
    """

    type: str
    ts: float
    key: str
    data: dict[str, Any]

    @property
    def seq(self) -> int:
        """The event's place in the job's history (1 is the first event)."""
        return seq_of_key(self.key)

    @property
    def stream(self) -> str:
        """The stream it is compacted into (an unreadable raw event may have been a
        lifecycle event: it goes where nothing is ever dropped)."""
        return STREAM_EVENTS if self.type == UNREADABLE else stream_of(self.type)

    @classmethod
    def parse(cls, key: str, raw: bytes) -> HistoryEvent:
        """The raw event object ``key`` holding ``raw`` (``MetadataError`` if unreadable)."""
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise MetadataError(f"history event {key} is not a JSON object")
            return cls(str(body["type"]), float(body["ts"]), key, body)
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"history event {key} is unreadable: {exc}") from exc
