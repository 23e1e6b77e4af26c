"""Supervision decisions shared by the blocking and the deferrable supervisor (no Airflow).

Typed predicates over the job's history (STYLE.md point 3): the operator and the
supervision trigger ask these objects instead of reading raw event dicts.

* :class:`RunCheckpoints` answers "has *this* supervision run completed a checkpoint of
  its own?" (issue 8, defect 4). A run started from a savepoint or ``none`` must keep
  that target on resubmission until its own ``initial`` checkpoint exists; the job's
  catalog may hold an *older* run's checkpoints, and ``restore=latest`` would resume
  those instead. One driver per job runs at a time (the lease), so a
  ``checkpoint_completed`` event written after this run's first ``job_submitted`` is
  this run's.
* :func:`resubmit_restore` turns that answer into the resubmission's restore target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from airflow_ckpt.errors import MetadataError
from airflow_ckpt.runtime.history import (
    CHECKPOINT_COMPLETED,
    FAILURE,
    JOB_STARTED,
    JOB_SUBMITTED,
    RESTART,
    HistoryEvent,
    JobHistory,
)

RESTORE_LATEST = "latest"
RESTORE_NONE = "none"

#: events that carry the ``run_id`` of the supervision that wrote them
_RUN_EVENTS = frozenset({JOB_SUBMITTED, JOB_STARTED, FAILURE, RESTART})


@dataclass(frozen=True, slots=True)
class RunProgress:
    """What the history says about one supervision run's own progress."""

    submitted: bool  # the run's first ``job_submitted`` was found
    own_checkpoint: bool  # a checkpoint completed after the run's first submission

    @property
    def may_restore_latest(self) -> bool:
        """True once ``restore=latest`` resumes this run's state, not an older run's."""
        return self.own_checkpoint


class RunCheckpoints:
    """Incrementally watches the history for the run's first submit and own checkpoints.

    The first :meth:`progress` scans newest-first down to the run's first
    ``job_submitted`` (attempt 1) or another run's event; later calls only read keys
    newer than the last one seen (history keys sort chronologically).
    """

    def __init__(self, history: JobHistory, run_id: str) -> None:
        self.history = history
        self.run_id = run_id
        self._cursor: str | None = None
        self._submitted = False
        self._own_checkpoint = False

    def progress(self) -> RunProgress:
        keys = [
            info.key for info in self.history.storage.list(self.history.layout.history_prefix)
            if info.key.endswith(".json")
        ]
        if self._cursor is None:
            for key in reversed(keys):
                event = self._read(key)
                run = event.data.get("run_id")
                if event.type in _RUN_EVENTS and run is not None and run != self.run_id:
                    break  # an earlier supervision: nothing older is ours
                if event.type == CHECKPOINT_COMPLETED:
                    self._own_checkpoint = True
                if event.type == JOB_SUBMITTED and run == self.run_id:
                    self._submitted = True
                    if int(event.data.get("attempt") or 0) <= 1:
                        break
            if not self._submitted:
                # nothing of ours yet: checkpoints seen belong to someone else
                self._own_checkpoint = False
        else:
            for key in keys:
                if key <= self._cursor:
                    continue
                event = self._read(key)
                if event.type == JOB_SUBMITTED and event.data.get("run_id") == self.run_id:
                    self._submitted = True
                elif event.type == CHECKPOINT_COMPLETED and self._submitted:
                    self._own_checkpoint = True
        if keys:
            self._cursor = max(keys[-1], self._cursor or "")
        else:
            self._cursor = self._cursor or ""
        return RunProgress(self._submitted, self._own_checkpoint)

    def _read(self, key: str) -> HistoryEvent:
        raw = self.history.storage.get_bytes(key)
        try:
            body = json.loads(raw)
            return HistoryEvent(str(body["type"]), float(body["ts"]), key, body)
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"history event {key} is unreadable: {exc}") from exc


def resubmit_restore(first_restore: str, progress: RunProgress) -> str:
    """The restore target of a resubmission after a driver death.

    ``latest`` once the run has a checkpoint of its own; until then the original target
    (a savepoint/checkpoint URI, ``none`` or ``latest``) again, so a driver that died
    during restore or before its initial checkpoint never resumes another run's state.
    """
    if first_restore == RESTORE_LATEST or progress.may_restore_latest:
        return RESTORE_LATEST
    return first_restore
