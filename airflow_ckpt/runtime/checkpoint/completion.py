"""What acts on a completed checkpoint or savepoint, after its ``_metadata`` is durable
and the lease was confirmed after it (Flink's ``CheckpointCoordinator.completePendingCheckpoint``
and the ``notifyCheckpointComplete`` it sends).

Each step on its own: a failure of one (e.g. the history append) must not skip the
others, above all the listeners that commit the sinks' transactions. The history step
waits through a storage outage, and past the outage budget keeps the event for the
history's next append (``JobHistory.append_when_reachable``). A commit that fails here
stays pending: the next completion commits it, and every later manifest lists it for
recover-and-commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory

log = logging.getLogger("airflow_ckpt.checkpoint")

#: called with each completed manifest (the job's sinks commit their transactions)
CompletionListener = Callable[[Manifest], None]


def log_completed(manifest: Manifest) -> None:
    t = manifest.timings
    log.info(
        "completed %s %d: batch=%d state_size=%d uploaded=%d files=%d subtasks=%d/%d "
        "start_delay=%dms sync=%dms async=%dms end_to_end=%dms",
        manifest.kind, manifest.checkpoint_id, manifest.batch_id, manifest.state_size,
        manifest.checkpointed_size, len(manifest.files),
        manifest.num_acknowledged_subtasks, manifest.num_subtasks, t.start_delay_ms,
        t.sync_duration_ms, t.async_duration_ms, t.end_to_end_duration_ms,
    )


def notify_completed(manifest: Manifest, path: str, *, store: CompletedCheckpointStore,
                     history: JobHistory, listeners: Sequence[CompletionListener],
                     request_id: str | None = None) -> None:
    """Act on ``manifest`` (completed at ``path``), each step on its own (see the module
    doc): a checkpoint is added to the store, a savepoint releases its reservations
    of shared files; the history records it; then every listener is called. Returns
    when every step ran; a failed step is logged."""
    interleave.point(interleave.COMPLETE_BEFORE_ADD)
    steps: list[tuple[str, Callable[[], object]]] = []
    if manifest.is_savepoint:
        steps.append(("release", lambda: store.shared.release(manifest.checkpoint_id)))
        steps.append(("history", lambda: history.append_when_reachable(
            ev.SAVEPOINT_COMPLETED, path=path, request_id=request_id,
            **manifest.history_entry())))
    else:
        steps.append(("store", lambda: store.add(manifest)))
        steps.append(("history", lambda: history.append_when_reachable(
            ev.CHECKPOINT_COMPLETED, path=path, **manifest.history_entry())))
    steps.extend((f"listener {i}", partial(listener, manifest))
                 for i, listener in enumerate(listeners))
    for name, step in steps:
        try:
            step()
        except Exception:
            log.exception("after completing %d: %s failed", manifest.checkpoint_id, name)
