"""Named interleaving points: where a test pauses a runtime thread to force a race.

The runtime calls :func:`point` at the few places where the order of two threads (or
two drivers) decides correctness: between the garbage collector's decision and its
delete, before a completion marker is written, before a heartbeat, ... A test installs
a hook at a name (e.g. one that blocks until the test releases it), so each
interleaving is produced deterministically, never by sleeping and hoping. Without a
hook a point costs one dictionary lookup.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

_hooks: dict[str, Callable[[], None]] = {}

# The points, so a test cannot pause at a name the runtime never reaches.
GC_BEFORE_DELETE = "store.gc.before_delete"  # decided what is garbage, not deleted yet
COMPLETE_BEFORE_METADATA = "coordinator.before_metadata"  # files durable, marker not yet
COMPLETE_BEFORE_ADD = "coordinator.before_store_add"  # marker durable, store not told yet
UPLOAD_BEFORE_FILE = "upload.before_file"  # a file is about to be uploaded
CAPTURE_BEFORE_LINK = "snapshot.before_link"  # the sync phase is about to link a file
LEASE_BEFORE_BEAT = "lease.before_beat"  # the holder is about to renew its lease
LEASE_BEFORE_SWAP = "lease.before_swap"  # about to rewrite its lease record (beat, ids, ...)
LEASE_BEFORE_CLAIM = "lease.before_claim"  # judged the lease free, not claimed yet
LEASE_BEFORE_CLAIM_PUT = "lease.before_claim_put"  # rejudged: no newer epoch; claim not sent
LEASE_AFTER_CLAIM = "lease.after_claim"  # claimed, older epochs not deleted yet
SINK_STAGED_BEFORE_RECORD = "sink.staged_before_record"  # executors' files staged, no record
SINK_BEFORE_PUBLISH_FILE = "sink.before_publish_file"  # decision durable, a file to publish
SINK_DECIDE_BEFORE_CONFIRM = "sink.decide_before_confirm"  # records read, lease not confirmed
HISTORY_BEFORE_CREATE = "history.before_create"  # an append chose its number, not created yet
HISTORY_BEFORE_SEAL_CHECK = "history.before_seal_check"  # created, sealed mark not re-read
HISTORY_BEFORE_SEGMENT_READ = "history.before_segment_read"  # segments listed, not read yet
HISTORY_COMPACTION_BEFORE_READ = "history.compaction_before_read"  # raw listed, not read
RESTART_BEFORE_DECISION = "restart_log.before_decision"  # decided on a head, not appended yet
POINTS = frozenset({GC_BEFORE_DELETE, COMPLETE_BEFORE_METADATA, COMPLETE_BEFORE_ADD,
                    UPLOAD_BEFORE_FILE, CAPTURE_BEFORE_LINK, LEASE_BEFORE_BEAT, LEASE_BEFORE_SWAP,
                    LEASE_BEFORE_CLAIM, LEASE_BEFORE_CLAIM_PUT, LEASE_AFTER_CLAIM,
                    SINK_STAGED_BEFORE_RECORD, SINK_BEFORE_PUBLISH_FILE, SINK_DECIDE_BEFORE_CONFIRM,
                    HISTORY_BEFORE_CREATE, HISTORY_BEFORE_SEAL_CHECK,
                    HISTORY_BEFORE_SEGMENT_READ, HISTORY_COMPACTION_BEFORE_READ,
                    RESTART_BEFORE_DECISION})


def point(name: str) -> None:
    """Run the hook installed at ``name``, if any (in the calling thread)."""
    hook = _hooks.get(name)
    if hook is not None:
        hook()


@contextlib.contextmanager
def installed(name: str, hook: Callable[[], None]) -> Iterator[None]:
    """Install ``hook`` at ``name`` for the duration of the block."""
    if name not in POINTS:
        raise ValueError(f"unknown interleaving point {name!r}; known: {sorted(POINTS)}")
    _hooks[name] = hook
    try:
        yield
    finally:
        _hooks.pop(name, None)


class Pause:
    """A hook that blocks the thread reaching the point until :meth:`resume`.

    ``only`` limits it to the first ``only`` arrivals (later ones pass straight on).
    """

    def __init__(self, only: int = 1, timeout_s: float = 60.0) -> None:
        self.reached = threading.Event()
        self._resume = threading.Event()
        self._left = only
        self._lock = threading.Lock()
        self.timeout_s = timeout_s

    def __call__(self) -> None:
        with self._lock:
            if self._left <= 0:
                return
            self._left -= 1
        self.reached.set()
        if not self._resume.wait(self.timeout_s):
            raise TimeoutError("a paused thread was never resumed")

    def wait_reached(self, timeout_s: float = 60.0) -> None:
        if not self.reached.wait(timeout_s):
            raise TimeoutError("no thread reached the paused point")

    def resume(self) -> None:
        self._resume.set()
