"""Append-only job history in storage: ``<job>/history/<seq>.json``, ``seq`` = 1, 2, ...

Every event is its own object, written create-only at the next free *sequence number*.
The number, not a clock, orders the history: an append takes the newest number it knows
plus one, and when another writer took that number first (the create-only write answers
412) it lists what is newer and tries again. So the order of the keys is the order in
which the events became durable, whatever the clocks of the hosts that wrote them (the
driver's and the Airflow worker's may be an hour apart), and a reader that remembers the
newest key it read (a cursor) misses nothing later: no event can appear *below* a key
that a reader has listed (see "Sealed", below, for the one way a write can land there and
why it never counts). The event's ``ts`` (the writer's clock) is for display only.

**Compaction** keeps the cost of a year-long job flat (docs/architecture.md, "History
compaction"). Raw events are folded into immutable, gzipped JSON-lines *segments*
``<job>/history/segments/<stream>/<hi>_<last>_<first>_<count>_<digest>.jsonl.gz``, in two
streams: ``checkpoints`` (``checkpoint_completed``/``checkpoint_failed``, the bulk, kept
for the newest ``retain_checkpoint_events``) and ``events`` (everything else: lifecycle,
failures, restarts, savepoints; never deleted). A segment holds every event of its stream
numbered up to ``hi`` that its compaction read (``first``..``last``: the numbers of the
oldest and newest it holds); ``digest`` names its content, so two
compactions that read different events never write the same name (each deletes only the
raw events its *own* segment holds). Every event keeps its key as its identity.

**Sealed.** A compaction writes its ``checkpoints`` segment first and its ``events``
segment last; the newest ``hi`` of the ``events`` stream is the history's *sealed* mark:
every event numbered up to it is in a segment (or was dropped by retention). Raw events
are deleted only after that. A raw key at or below the mark is *void*: either an original
that is also in a segment (not yet deleted) or a write that landed after its number had
been compacted and deleted (a writer with a stale view, or a create whose answer came
back long after it was sent). Readers ignore void keys; the writer of a void key finds it
void by listing the ``events`` segments after its create (the mark only grows, and it had
reached the number before the number could be re-created), deletes it and appends again.
A compaction drops raw events at or below the mark it reads *after* reading them, so a
void write never enters a segment. (Why a reader never takes a void key for a live one:
a listing returns the raw keys before the segment names, S3 in key order and the file
backend directory by directory; a void key is created after the segment that seals its
number, so a listing that returns the key also returns that segment.)

The invariant: *an event is deleted only after a segment holding it was written* (or, for
checkpoint statistics, by the retention policy). A crash between the two leaves the event
in both places; readers deduplicate by key, so they never see it twice and never miss it.
A reader that finds a listed object gone (compacted meanwhile) lists again.

Reading (:class:`~airflow_ckpt.runtime.history.reader.HistoryReader`, which
:class:`JobHistory` extends) and the object layout
(:mod:`airflow_ckpt.runtime.history.segments`) live beside this module; compaction stays
with the writer, as a writer starts it and it reads through the writer's own cache.
This package is the one reader and writer of ``history/``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_ckpt.errors import (
    HistoryMovedError,
    MetadataError,
    ObjectAlreadyExistsError,
    StorageOutageError,
    VanishedError,
)
from airflow_ckpt.runtime.history.events import (
    EVENT_TYPES,
    JOB_STARTED,
    STREAM_CHECKPOINTS,
    STREAM_EVENTS,
    STREAMS,
    UNREADABLE,
    HistoryEvent,
    stream_of,
)
from airflow_ckpt.runtime.history.reader import EventCache, HistoryReader
from airflow_ckpt.runtime.history.segments import Segment
from airflow_ckpt.runtime.interleave import (
    HISTORY_BEFORE_CREATE,
    HISTORY_BEFORE_SEAL_CHECK,
    HISTORY_BEFORE_SEGMENT_READ,
    HISTORY_COMPACTION_BEFORE_READ,
    point,
)
from airflow_ckpt.runtime.masking import mask_value
from airflow_ckpt.runtime.storage.base import CheckpointStorage

log = logging.getLogger(__name__)

#: appends in a row that may meet a taken number before one gives up (each retry lists)
_APPEND_ATTEMPTS = 1000


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When and how :class:`JobHistory` compacts (see the module docstring).

    :param every: compact in the background after this many appends by one process (and
        on a driver's first ``job_started``); 0 turns automatic compaction off
    :param segment_events: events per segment; the newest segment of a stream is topped
        up until it holds this many
    :param retain_checkpoint_events: ``checkpoint_completed``/``_failed`` events kept in
        segments (whole segments are dropped, oldest first); None keeps all
    :param background: automatic compaction runs on a thread of its own (the append
        returns at once); False runs it inside the append that triggers it (one order of
        storage requests, for a driver that runs no threads)
    """

    every: int = 50
    segment_events: int = 1000
    retain_checkpoint_events: int | None = 20_000
    background: bool = True

    def __post_init__(self) -> None:
        if self.every < 0 or self.segment_events < 1 or (
                self.retain_checkpoint_events is not None
                and self.retain_checkpoint_events < 1):
            raise ValueError(f"invalid compaction policy {self}: every >= 0, "
                             "segment_events >= 1, retain_checkpoint_events >= 1 or None")


DEFAULT_COMPACTION = CompactionPolicy()


@dataclass(slots=True)
class CompactionResult:
    """What one :meth:`JobHistory.compact` did."""

    compacted: int = 0  # raw events now in segments (and deleted as raw objects)
    segments_written: int = 0
    segments_deleted: int = 0  # merged into a bigger one, or dropped by retention
    events_dropped: int = 0  # checkpoint events dropped by retention
    void_deleted: int = 0  # void raw keys removed (see the module docstring)
    unreadable: list[str] = field(default_factory=list)  # kept in segments as evidence


class JobHistory(HistoryReader):
    """Appends to the history of one job, and compacts it; reads as a :class:`HistoryReader`.

    :param compaction: the policy of automatic compaction (see :class:`CompactionPolicy`);
        None: never compact automatically (:meth:`compact` still works)
    :param cache: parsed objects shared between reads (the UI passes one per storage)
    :param clock: the writer's clock for the events' display ``ts`` (never for order)
    :param ids: fresh random ids (each event's ``uid``, which tells our own create from
        another writer's at the same number)
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        job: str,
        *,
        compaction: CompactionPolicy | None = DEFAULT_COMPACTION,
        cache: EventCache | None = None,
        clock: Callable[[], float] = time.time,
        ids: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        super().__init__(storage, job, cache=cache)
        self.compaction = compaction
        self.clock = clock
        self.ids = ids
        self._appends = 0
        self._compacting = threading.Lock()
        self._append_lock = threading.Lock()
        #: event bodies kept in memory until the storage is back, oldest first
        self._deferred: list[dict[str, Any]] = []
        self._head: int | None = None  # the newest number this instance knows is taken
        # what this instance wrote itself (its events, its segments): compaction then
        # reads from storage only what other writers appended
        self._written = EventCache(4 * compaction.segment_events if compaction else 1)

    def _cached(self, key: str) -> tuple[HistoryEvent, ...] | None:
        """The shared cache, then what this instance wrote itself."""
        found = super()._cached(key)
        return found if found is not None else self._written.get(key)

    # ------------------------------------------------------------------ writing

    def append(self, event_type: str, **data: Any) -> HistoryEvent:
        """Append one event at the next free number. Durable and counted when this returns.

        Every ``compaction.every`` appends (and on a driver's first ``job_started``) a
        background thread compacts the history; it never delays the caller.
        """
        event = self._append(event_type, data, at=None)
        self._after_append(event_type)
        return event

    def append_if_head(self, head: int, event_type: str, **data: Any) -> HistoryEvent:
        """Append at number ``head + 1`` exactly, i.e. only if the newest event is still
        the one numbered ``head`` (a compare-and-swap on the whole history).

        Raises :class:`~airflow_ckpt.errors.HistoryMovedError` when something was
        appended after ``head``: the caller reads the new events and decides again.
        """
        event = self._append(event_type, data, at=head + 1)
        self._after_append(event_type)
        return event

    def append_when_reachable(self, event_type: str, **data: Any) -> HistoryEvent | None:
        """:meth:`append`; but when the storage stays unreachable past the outage budget
        (``StorageOutageError``), keep the event in memory and return None: it is
        appended, in order, before the next event this instance appends. For events
        nobody waits on (a checkpoint completed or failed); a late append is safe, as
        numbers are taken create-only at the append (see the module doc)."""
        body = self._body(event_type, data)
        try:
            event = self._append_body(body, at=None)
        except StorageOutageError as exc:
            with self._append_lock:
                self._deferred.append(body)
            log.warning("%s event kept in memory until the storage is back: %s",
                        event_type, exc)
            return None
        self._after_append(event_type)
        return event

    def _body(self, event_type: str, data: dict[str, Any]) -> dict[str, Any]:
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown history event type {event_type!r}")
        # the uid makes the bytes unique: a retried create that finds them is ours
        return {"type": event_type, "ts": self.clock(), "job": self.layout.job,
                "uid": self.ids().hex[:16], **mask_value(data)}

    def _append(self, event_type: str, data: dict[str, Any], at: int | None) -> HistoryEvent:
        return self._append_body(self._body(event_type, data), at)

    def _append_body(self, body: dict[str, Any], at: int | None) -> HistoryEvent:
        """Create ``body`` at the next free number (``at``: exactly there), after the
        events kept for later (:meth:`append_when_reachable`), which go first in order."""
        with self._append_lock:
            while self._deferred:
                self._create(self._deferred[0], at=None)
                self._deferred.pop(0)
            return self._create(body, at)

    def _create(self, body: dict[str, Any], at: int | None) -> HistoryEvent:
        """One event at the next free number; the caller holds the append lock."""
        event_type, now = str(body["type"]), float(body["ts"])
        raw = json.dumps(body, default=str).encode()
        for _ in range(_APPEND_ATTEMPTS):
            seq = at if at is not None else self._known_head() + 1
            key = self.layout.history_event(seq)
            point(HISTORY_BEFORE_CREATE)  # a stale number: it may be sealed meanwhile
            try:
                self.storage.put_bytes(key, raw, create_only=True)
            except ObjectAlreadyExistsError:
                if at is not None:
                    raise HistoryMovedError(
                        f"history of {self.layout.job} moved past {at - 1}") from None
                self._head = self._head_after(seq)
                continue
            event = HistoryEvent(event_type, now, key, body)
            point(HISTORY_BEFORE_SEAL_CHECK)  # a compaction may take the number meanwhile
            sealed = self._sealed()
            if seq <= sealed and not self._in_segment(event):
                # the number had been compacted and its raw object deleted before
                # our create landed: void, never read; take it back (ours alone)
                self.storage.delete_many([key])
                self._head = max(self._head or 0, sealed)
                if at is not None:
                    raise HistoryMovedError(
                        f"history of {self.layout.job} moved past {at - 1}")
                continue
            self._head = max(self._head or 0, seq)
            self._written.put(key, (event,))
            return event
        raise MetadataError(f"could not append to the history of {self.layout.job}: "
                            f"{_APPEND_ATTEMPTS} numbers in a row were taken")

    def _after_append(self, event_type: str) -> None:
        self._appends += 1
        policy = self.compaction
        if policy is not None and policy.every > 0 and (
            self._appends % policy.every == 0
            or (self._appends == 1 and event_type == JOB_STARTED)
        ):
            self._compact_automatically(policy.background)

    def _known_head(self) -> int:
        if self._head is None:
            self._head = self.listing().head
        return self._head

    def _head_after(self, seq: int) -> int:
        """The newest number taken, listing only what sorts after ``seq``."""
        infos = self.storage.list_after(self.layout.history_prefix,
                                        self.layout.history_event(seq))
        listing = self._parse([info.key for info in infos])
        return max(seq, listing.head)

    def _sealed(self) -> int:
        """The sealed mark now (one LIST of the ``events`` segments)."""
        prefix = f"{self.segments_prefix}{STREAM_EVENTS}/"
        segments = self._parse([info.key for info in self.storage.list(prefix)]).segments
        return max((s.hi for s in segments), default=0)

    def _in_segment(self, event: HistoryEvent) -> bool:
        """Whether a compaction already took ``event`` (ours, appended just now) into a
        segment: then its number was ours and it counts. Otherwise it is void. A
        segment that vanished between the listing and its read was merged by another
        compaction: the history is listed again, never answered "void" for it."""
        return bool(self._retrying(lambda: self._listed_in_segment(event)))

    def _listed_in_segment(self, event: HistoryEvent) -> bool:
        stream = stream_of(event.type)
        for segment in self.listing().segments:
            if segment.stream == stream and segment.first <= event.seq <= segment.last:
                point(HISTORY_BEFORE_SEGMENT_READ)  # another compaction may merge it away
                with contextlib.suppress(MetadataError):  # unreadable: not held there
                    for held in self._load_segment(segment):
                        if held.key == event.key and held.data.get("uid") == event.data["uid"]:
                            return True
        return False

    def _compact_automatically(self, background: bool) -> None:
        if not self._compacting.acquire(blocking=False):
            return  # one is running; the next trigger catches up

        def run() -> None:
            try:
                self.compact()
            except Exception:  # never fatal: raw events stay readable as they are
                log.warning("compacting the history of %s failed", self.layout.job,
                            exc_info=True)
            finally:
                self._compacting.release()

        if background:
            threading.Thread(target=run, name="ckpt-history-compact", daemon=True).start()
        else:
            run()

    # ------------------------------------------------------------------ compaction

    def compact(self, policy: CompactionPolicy | None = None) -> CompactionResult:
        """Fold the listed raw events into segments; apply retention; drop void keys.

        Safe to run concurrently with writers, readers and other compactions, and to
        crash at any point: raw events are deleted only after the segments holding them
        are durable (``events`` last: it seals), and only the keys this call's own
        segments hold are deleted. No clock is read.
        """
        policy = policy or self.compaction or DEFAULT_COMPACTION
        result = CompactionResult()
        listing = self.listing()
        point(HISTORY_COMPACTION_BEFORE_READ)  # a listed number may turn void meanwhile
        fresh: list[HistoryEvent] = []
        for key in listing.raw:
            try:
                fresh.append(self._load_raw(key))
            except VanishedError:
                continue  # another compaction took it: it is in that one's segment
            except MetadataError as exc:  # kept as evidence, never silently dropped
                result.unreadable.append(str(exc))
                fresh.append(HistoryEvent(UNREADABLE, 0.0, key, {"error": str(exc)}))
        delete: list[str] = list(listing.void)
        result.void_deleted = len(listing.void)
        written: set[str] = set()
        if fresh:
            # Read the mark again *after* reading the raw events: anything at or below
            # it is in another compaction's segment, or a void write read by mistake.
            sealed = max(listing.sealed, self._sealed())
            fresh = [e for e in fresh if e.seq > sealed]
        if fresh:
            hi = fresh[-1].seq
            for stream in STREAMS:  # events last: its segment seals up to ``hi``
                existing = [s for s in listing.segments if s.stream == stream]
                new = [e for e in fresh if e.stream == stream]
                if not new and stream == STREAM_CHECKPOINTS:
                    continue
                merged = {e.key: e for e in new}
                if existing and existing[-1].count < policy.segment_events:
                    open_segment = existing.pop()
                    try:
                        merged.update({e.key: e for e in self._load_segment(open_segment)})
                        delete.append(open_segment.key)
                    except VanishedError:
                        pass  # merged by another compaction: its events are elsewhere
                ordered = sorted(merged.values(), key=lambda e: e.key)
                size = policy.segment_events
                chunks = [ordered[i:i + size] for i in range(0, len(ordered), size)] or [[]]
                keep = policy.retain_checkpoint_events if stream == STREAM_CHECKPOINTS \
                    else None
                kept, dropped = 0, 0
                for chunk in reversed(chunks):  # newest first, for retention
                    if keep is not None and kept >= keep:
                        dropped += 1
                        result.events_dropped += len(chunk)  # dropped by retention unwritten
                    kept += len(chunk)
                # oldest first: the segment that declares ``hi`` (the seal, in the events
                # stream) is written only once every older one is durable
                for index in range(dropped, len(chunks)):
                    chunk = chunks[index]
                    top = hi if index == len(chunks) - 1 else chunk[-1].seq
                    segment = self._write_segment(stream, chunk, top)
                    written.add(segment.key)
                    existing.append(segment)
                    result.segments_written += 1
                result.compacted += len(new)
                delete.extend(e.key for e in new)
                if stream == STREAM_CHECKPOINTS and keep is not None:
                    self._retain(existing, keep, written, delete, result)
        elif listing.segments:
            checkpoints = [s for s in listing.segments if s.stream == STREAM_CHECKPOINTS]
            if policy.retain_checkpoint_events is not None:
                self._retain(checkpoints, policy.retain_checkpoint_events, written, delete,
                             result)
        # only now, with every segment durable: the invariant of the module docstring
        delete = [k for k in dict.fromkeys(delete) if k not in written]
        if delete:
            self.storage.delete_many(delete)
        result.segments_deleted = sum(1 for k in delete if k.startswith(self.segments_prefix))
        if result.compacted or result.segments_deleted or result.void_deleted:
            log.info("compacted the history of %s: %s", self.layout.job, result)
        return result

    @staticmethod
    def _retain(existing: list[Segment], keep: int, written: set[str], delete: list[str],
                result: CompactionResult) -> None:
        kept = 0
        for segment in sorted(existing, key=lambda s: s.last, reverse=True):
            if kept >= keep and segment.key not in written:
                delete.append(segment.key)
                result.events_dropped += segment.count
            kept += segment.count

    def _write_segment(self, stream: str, events: list[HistoryEvent], hi: int) -> Segment:
        segment, data = Segment.encode(self.segments_prefix, self.layout.history_prefix,
                                       stream, events, hi)
        # exists: a concurrent compaction wrote these very events (the digest says so)
        with contextlib.suppress(ObjectAlreadyExistsError):
            self.storage.put_bytes(segment.key, data, create_only=True)
        self._written.put(segment.key, tuple(events))
        return segment
