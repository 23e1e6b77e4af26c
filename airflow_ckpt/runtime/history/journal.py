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
compaction"). Raw events are folded into immutable, gzipped JSON-lines *segments*,
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

Readers never list more than ``history/`` (raw tail + segment names, a few hundred keys)
and read newest first only as far as they need: :meth:`JobHistory.newest` (the UI window),
:meth:`JobHistory.newest_until` (the restart log's and savepoint check's backward scans,
skipping the ``checkpoints`` stream when the types they want are not in it) and
:meth:`JobHistory.events_after` (incremental reads, ``StartAfter``). Objects are immutable
(create-only keys, never rewritten; a void key is never read), so an :class:`EventCache`
can keep parsed objects across reads (the UI plugin does).

This module is the one reader and writer of ``history/``: the supervisor, triggers,
sensor, plugin, CLI and metrics read events only through :class:`JobHistory`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from airflow_ckpt.errors import (
    HistoryMovedError,
    MetadataError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    StorageOutageError,
)
from airflow_ckpt.runtime.masking import mask_value
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout

# Event types. Payload fields are documented in docs/storage-layout.md.
JOB_SUBMITTED = "job_submitted"  # supervisor: spark-submit started (attempt, deploy target)
JOB_STARTED = "job_started"  # driver: runtime up (query name, spark version, config)
RESTORED = "restored"  # driver: restored from (path, checkpoint id, batch id)
RESTORE_FALLBACK = "restore_fallback"  # driver: newest was damaged, fell back (why)
SINK_AHEAD = "sink_ahead"  # driver: a sink committed batches after the restored one
#: driver, AT_LEAST_ONCE: a replay of a committed batch read other offsets, published extra
SINK_REPLAY_PUBLISHED = "sink_replay_published"
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
    }
)
#: events that end every supervision of the job
TERMINAL_EVENTS = frozenset({JOB_FINISHED, JOB_STOPPED, JOB_FAILED})
#: the driver's lifecycle: it started, then one of the terminal events
LIFECYCLE_EVENTS = frozenset({JOB_STARTED}) | TERMINAL_EVENTS
#: events that belong to one supervision run (they carry ``run_id``)
RUN_EVENTS = frozenset({JOB_SUBMITTED, JOB_STARTED, FAILURE, RESTART})


log = logging.getLogger(__name__)

#: Events compacted into the ``checkpoints`` stream (subject to retention); every other
#: type goes to the ``events`` stream, which is never deleted.
CHECKPOINT_STREAM_TYPES = frozenset({CHECKPOINT_COMPLETED, CHECKPOINT_FAILED})
STREAM_CHECKPOINTS = "checkpoints"
STREAM_EVENTS = "events"
#: the order a compaction writes its segments in: ``events`` last, it seals (see above)
STREAMS = (STREAM_CHECKPOINTS, STREAM_EVENTS)
SEGMENTS_DIR = "segments/"
_RAW_RE = re.compile(r"^(\d{16})\.json$")
_SEGMENT_RE = re.compile(r"^(\d{16})_(\d{16})_(\d{16})_(\d+)_([0-9a-f]{12})\.jsonl\.gz$")
#: the type of a placeholder event for an unreadable object (see ``_iter_newest``)
_UNREADABLE = "_unreadable"
#: appends in a row that may meet a taken number before one gives up (each retry lists)
_APPEND_ATTEMPTS = 1000


def stream_of(event_type: str) -> str:
    """The segment stream an event type is compacted into."""
    return STREAM_CHECKPOINTS if event_type in CHECKPOINT_STREAM_TYPES else STREAM_EVENTS


def seq_of_key(key: str) -> int:
    """The sequence number of a raw event key (``.../history/<seq>.json``)."""
    match = _RAW_RE.match(key.rsplit("/", 1)[-1])
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


@dataclass(frozen=True, slots=True)
class Segment:
    """One compacted segment object: its key, stream, the numbers of the oldest and newest
    events it holds (0 when empty) and the number it seals up to (``hi``)."""

    key: str
    stream: str
    first: int
    last: int
    hi: int
    count: int


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When and how :class:`JobHistory` compacts (see the module docstring).

    :param every: compact in the background after this many appends by one process (and
        on a driver's first ``job_started``); 0 turns automatic compaction off
    :param segment_events: events per segment; the newest segment of a stream is topped
        up until it holds this many
    :param retain_checkpoint_events: ``checkpoint_completed``/``_failed`` events kept in
        segments (whole segments are dropped, oldest first); None keeps all
    """

    every: int = 50
    segment_events: int = 1000
    retain_checkpoint_events: int | None = 20_000

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


@dataclass(frozen=True, slots=True)
class HistoryListing:
    """One listing of ``<job>/history/``: live raw event keys, segments, the sealed mark.

    ``raw`` holds only keys above ``sealed`` (sorted); ``void`` the raw keys at or below
    it, which no reader reads (see the module docstring).
    """

    prefix: str
    raw: tuple[str, ...]
    segments: tuple[Segment, ...]
    sealed: int
    void: tuple[str, ...] = ()

    @property
    def head(self) -> int:
        """The newest sequence number listed (0: an empty history)."""
        seqs = [self.sealed] + [s.hi for s in self.segments]
        if self.raw:
            seqs.append(seq_of_key(self.raw[-1]))
        return max(seqs)

    @property
    def newest_key(self) -> str | None:
        """The key of the newest event listed (raw, or the newest a segment can hold)."""
        head = self.head
        return f"{self.prefix}{head:016d}.json" if head else None

    @property
    def total(self) -> int:
        """Events stored (a crash mid-compaction may count some twice)."""
        return len(self.raw) + sum(s.count for s in self.segments)


class EventCache:
    """Parsed history objects by key, least recently used dropped first.

    Sound because history objects are immutable: a raw event key is written once,
    create-only (a void key is never read), and a segment's name fixes its content.
    ``capacity`` counts events.
    """

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[HistoryEvent, ...]] = OrderedDict()
        self._size = 0

    def get(self, key: str) -> tuple[HistoryEvent, ...] | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: str, events: tuple[HistoryEvent, ...]) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            self._size -= len(old) if old else 0
            self._items[key] = events
            self._size += len(events)
            while self._size > self.capacity and len(self._items) > 1:
                _, dropped = self._items.popitem(last=False)
                self._size -= len(dropped)


class _Vanished(Exception):
    """A listed object was gone when read: compacted meanwhile; list again."""


_READ_ATTEMPTS = 5


class JobHistory:
    """Reads and appends the history of one job.

    :param compaction: the policy of automatic compaction (see :class:`CompactionPolicy`);
        None: never compact automatically (:meth:`compact` still works)
    :param cache: parsed objects shared between reads (the UI passes one per storage)
    :param clock: the writer's clock for the events' display ``ts`` (never for order)
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        job: str,
        *,
        compaction: CompactionPolicy | None = DEFAULT_COMPACTION,
        cache: EventCache | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.storage = storage
        self.layout = JobLayout(job)
        self.compaction = compaction
        self.cache = cache
        self.clock = clock or _wall_clock
        self._appends = 0
        self._compacting = threading.Lock()
        self._append_lock = threading.Lock()
        #: event bodies kept in memory until the storage is back, oldest first
        self._deferred: list[dict[str, Any]] = []
        self._head: int | None = None  # the newest number this instance knows is taken
        # what this instance wrote itself (its events, its segments): compaction then
        # reads from storage only what other writers appended
        self._written = EventCache(4 * compaction.segment_events if compaction else 1)

    @property
    def segments_prefix(self) -> str:
        return f"{self.layout.history_prefix}{SEGMENTS_DIR}"

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
                "uid": uuid.uuid4().hex[:16], **mask_value(data)}

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
            try:
                self.storage.put_bytes(key, raw, create_only=True)
            except ObjectAlreadyExistsError:
                if at is not None:
                    raise HistoryMovedError(
                        f"history of {self.layout.job} moved past {at - 1}") from None
                self._head = self._head_after(seq)
                continue
            event = HistoryEvent(event_type, now, key, body)
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
            self._compact_in_background()

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
        segment: then its number was ours and it counts. Otherwise it is void."""
        stream = stream_of(event.type)
        listing = self.listing()
        seq = event.seq
        for segment in listing.segments:
            if segment.stream == stream and segment.first <= seq <= segment.last:
                with contextlib.suppress(_Vanished, MetadataError):
                    for held in self._load_segment(segment):
                        if held.key == event.key and held.data.get("uid") == event.data["uid"]:
                            return True
        return False

    def _compact_in_background(self) -> None:
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

        threading.Thread(target=run, name="ckpt-history-compact", daemon=True).start()

    # ------------------------------------------------------------------ listing

    def listing(self, start_after: str | None = None) -> HistoryListing:
        """List ``history/`` once (with ``start_after``: raw keys after it only; segments
        always, as their names sort after every raw key)."""
        prefix = self.layout.history_prefix
        infos = (self.storage.list_after(prefix, start_after) if start_after
                 else self.storage.list(prefix))
        return self._parse([info.key for info in infos])

    def _parse(self, keys: list[str]) -> HistoryListing:
        prefix = self.layout.history_prefix
        seg_prefix = self.segments_prefix
        raw: list[str] = []
        segments: list[Segment] = []
        for key in keys:
            if key.startswith(seg_prefix):
                stream, _, name = key[len(seg_prefix):].partition("/")
                match = _SEGMENT_RE.match(name)
                if stream in STREAMS and match:
                    segments.append(Segment(key, stream, int(match.group(3)),
                                            int(match.group(2)), int(match.group(1)),
                                            int(match.group(4))))
            elif _RAW_RE.match(key[len(prefix):]):
                raw.append(key)
        raw.sort()
        segments.sort(key=lambda s: (s.hi, s.first, s.key))
        sealed = max((s.hi for s in segments if s.stream == STREAM_EVENTS), default=0)
        live = tuple(k for k in raw if seq_of_key(k) > sealed)
        void = tuple(k for k in raw if seq_of_key(k) <= sealed)
        return HistoryListing(prefix, live, tuple(segments), sealed, void)

    # ------------------------------------------------------------------ reading

    def _cached(self, key: str) -> tuple[HistoryEvent, ...] | None:
        found = self.cache.get(key) if self.cache is not None else None
        return found if found is not None else self._written.get(key)

    def _load_raw(self, key: str) -> HistoryEvent:
        cached = self._cached(key)
        if cached is not None:
            return cached[0]
        try:
            raw = self.storage.get_bytes(key)
        except ObjectNotFoundError as exc:
            raise _Vanished(key) from exc
        event = _parse_event(key, raw)
        if self.cache is not None:
            self.cache.put(key, (event,))
        return event

    def _load_segment(self, segment: Segment) -> tuple[HistoryEvent, ...]:
        cached = self._cached(segment.key)
        if cached is not None:
            return cached
        try:
            raw = self.storage.get_bytes(segment.key)
        except ObjectNotFoundError as exc:
            raise _Vanished(segment.key) from exc
        prefix = self.layout.history_prefix
        try:
            events = []
            for line in gzip.decompress(raw).splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                key = f"{prefix}{row['id']}.json"
                if "unreadable" in row:  # kept as evidence by the compaction
                    events.append(HistoryEvent(_UNREADABLE, 0.0, key,
                                               {"error": str(row["unreadable"])}))
                    continue
                body = row["event"]
                events.append(HistoryEvent(str(body["type"]), float(body["ts"]), key, body))
        except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"history segment {segment.key} is unreadable: {exc}") from exc
        out = tuple(events)
        if self.cache is not None:
            self.cache.put(segment.key, out)
        return out

    def _iter_newest(
        self,
        listing: HistoryListing,
        streams: Iterable[str] = STREAMS,
        on_error: Callable[[str], None] | None = None,
        after: str | None = None,
    ) -> Iterator[HistoryEvent]:
        """Events newest first, deduplicated, reading objects only as far as consumed.

        Raw events and segments are visited in the order of the newest event they can
        hold, so an event is yielded only when nothing unread can be newer.
        ``on_error``: report unreadable objects and go on (else ``MetadataError``).
        ``after``: objects that cannot hold an event newer than this key are not read.
        A vanished object raises :class:`_Vanished` (the caller lists again).
        """
        wanted = set(streams)
        items: list[tuple[str, str | Segment]] = [(k, k) for k in listing.raw]
        items += [(f"{listing.prefix}{s.last:016d}.json", s) for s in listing.segments
                  if s.stream in wanted and s.count]
        if after is not None:
            items = [item for item in items if item[0] > after]
        items.sort(key=lambda item: item[0], reverse=True)
        buffer: list[HistoryEvent] = []  # ascending by key; pop() is the newest
        seen: set[str] = set()
        i = 0
        while i < len(items) or buffer:
            if buffer and (i >= len(items) or buffer[-1].key >= items[i][0]):
                event = buffer.pop()
                if event.key in seen:
                    continue
                seen.add(event.key)
                if event.type == _UNREADABLE:
                    message = f"history event {event.key} is unreadable: {event.data['error']}"
                    if on_error is None:
                        raise MetadataError(message)
                    on_error(message)
                    continue
                yield event
                continue
            _, item = items[i]
            i += 1
            try:
                if isinstance(item, str):
                    loaded: tuple[HistoryEvent, ...] = (self._load_raw(item),)
                else:
                    loaded = self._load_segment(item)
            except MetadataError as exc:
                if on_error is None:
                    raise
                on_error(str(exc))
                continue
            buffer.extend(loaded)
            buffer.sort(key=lambda e: e.key)

    def _retrying(self, read: Callable[[], Any]) -> Any:
        for _ in range(_READ_ATTEMPTS - 1):
            try:
                return read()
            except _Vanished:
                continue  # compacted while we read: the new listing has it in a segment
        try:
            return read()
        except _Vanished as exc:
            raise MetadataError(
                f"history of {self.layout.job} kept changing while it was read "
                f"({exc} vanished {_READ_ATTEMPTS} times)"
            ) from exc

    def events(self, types: Iterable[str] | None = None) -> list[HistoryEvent]:
        """All events in append order, optionally only those of ``types``.

        An unreadable event (corrupt JSON) raises ``MetadataError`` naming its key:
        history is evidence and is never silently skipped.
        """
        wanted = set(types) if types is not None else None

        def read() -> list[HistoryEvent]:
            out = [e for e in self._iter_newest(self.listing(), _streams_for(wanted))
                   if wanted is None or e.type in wanted]
            out.reverse()
            return out

        return list(self._retrying(read))

    def newest(
        self, limit: int, *, on_error: Callable[[str], None] | None = None
    ) -> tuple[list[HistoryEvent], HistoryListing]:
        """The newest ``limit`` events (oldest first) and the listing they came from.

        Costs one listing plus the raw events and segments that hold those events.
        """

        def read() -> tuple[list[HistoryEvent], HistoryListing]:
            listing = self.listing()
            out = []
            for event in self._iter_newest(listing, on_error=on_error):
                out.append(event)
                if len(out) >= limit:
                    break
            out.reverse()
            return out, listing

        result: tuple[list[HistoryEvent], HistoryListing] = self._retrying(read)
        return result

    def newest_until(
        self,
        stop: Callable[[HistoryEvent], bool],
        types: Iterable[str] | None = None,
        *,
        on_error: Callable[[str], None] | None = None,
    ) -> tuple[list[HistoryEvent], HistoryListing]:
        """Events of ``types`` newest first, up to and including the first one ``stop``
        accepts; and the listing. Segments of a stream holding none of ``types`` are not
        read (the restart log's scan never reads checkpoint statistics). ``on_error``:
        report unreadable objects and go on (default: ``MetadataError``)."""
        wanted = set(types) if types is not None else None

        def read() -> tuple[list[HistoryEvent], HistoryListing]:
            listing = self.listing()
            out = []
            for event in self._iter_newest(listing, _streams_for(wanted), on_error):
                if wanted is not None and event.type not in wanted:
                    continue
                out.append(event)
                if stop(event):
                    break
            return out, listing

        result: tuple[list[HistoryEvent], HistoryListing] = self._retrying(read)
        return result

    def events_after(self, cursor: str | None) -> tuple[list[HistoryEvent], str | None]:
        """Events whose key sorts after ``cursor`` (oldest first) and the new cursor.

        Lists with ``StartAfter=cursor`` (raw events) and reads only the segments whose
        newest event is after it: a reader that polls pays for what is new. Exact: no
        event can later appear at or below a cursor this returned (module docstring).
        """

        def read() -> tuple[list[HistoryEvent], str | None]:
            listing = self.listing(start_after=cursor)
            out = []
            for event in self._iter_newest(listing, after=cursor):
                if cursor is not None and event.key <= cursor:
                    break
                out.append(event)
            out.reverse()
            newest = listing.newest_key
            new_cursor = max(newest, cursor) if newest and cursor else (newest or cursor)
            return out, new_cursor

        result: tuple[list[HistoryEvent], str | None] = self._retrying(read)
        return result

    def stored_ts(self, event: HistoryEvent) -> float:
        """When the storage stored ``event`` (its ``LastModified``: the storage's clock,
        one clock for every writer), or the writer's ``ts`` if it was compacted since.

        For rules that compare the times of events written by different hosts (the
        failure-rate window): those compare storage times, never two hosts' clocks.
        """
        before = self.layout.history_event(event.seq - 1)
        for info in self.storage.list_after(self.layout.history_prefix, before):
            if info.key == event.key:
                return info.last_modified
            if info.key > event.key:
                break
        return event.ts

    def last(self, event_type: str) -> HistoryEvent | None:
        """The newest event of ``event_type``, if any."""
        return self.last_of([event_type])

    def last_of(self, types: Iterable[str]) -> HistoryEvent | None:
        """The newest event of any of ``types``, if any."""
        wanted = set(types)
        found, _ = self.newest_until(lambda e: True, wanted)
        return found[0] if found else None

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
        fresh: list[HistoryEvent] = []
        for key in listing.raw:
            try:
                fresh.append(self._load_raw(key))
            except _Vanished:
                continue  # another compaction took it: it is in that one's segment
            except MetadataError as exc:  # kept as evidence, never silently dropped
                result.unreadable.append(str(exc))
                fresh.append(HistoryEvent(_UNREADABLE, 0.0, key, {"error": str(exc)}))
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
                new = [e for e in fresh if _stream_of_event(e) == stream]
                if not new and stream == STREAM_CHECKPOINTS:
                    continue
                merged = {e.key: e for e in new}
                if existing and existing[-1].count < policy.segment_events:
                    open_segment = existing.pop()
                    try:
                        merged.update({e.key: e for e in self._load_segment(open_segment)})
                        delete.append(open_segment.key)
                    except _Vanished:
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
        prefix = self.layout.history_prefix
        stems = [e.key[len(prefix):-len(".json")] for e in events]
        lines = []
        for stem, event in zip(stems, events, strict=True):
            row: dict[str, Any] = {"id": stem}
            if event.type == _UNREADABLE:
                row["unreadable"] = event.data["error"]
            else:
                row["event"] = event.data
            lines.append(json.dumps(row, default=str, sort_keys=True))
        text = ("\n".join(lines) + "\n") if lines else ""
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        first, last = (events[0].seq, events[-1].seq) if events else (0, 0)
        name = f"{hi:016d}_{last:016d}_{first:016d}_{len(events)}_{digest}.jsonl.gz"
        key = f"{self.segments_prefix}{stream}/{name}"
        data = gzip.compress(text.encode(), mtime=0)
        # exists: a concurrent compaction wrote these very events (the digest says so)
        with contextlib.suppress(ObjectAlreadyExistsError):
            self.storage.put_bytes(key, data, create_only=True)
        self._written.put(key, tuple(events))
        return Segment(key, stream, first, last, hi, len(events))


def _wall_clock() -> float:
    return time.time()


def _stream_of_event(event: HistoryEvent) -> str:
    # an unreadable raw event may have been a lifecycle event: keep it where nothing is
    # ever dropped
    return STREAM_EVENTS if event.type == _UNREADABLE else stream_of(event.type)


def _parse_event(key: str, raw: bytes) -> HistoryEvent:
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise MetadataError(f"history event {key} is not a JSON object")
        return HistoryEvent(str(body["type"]), float(body["ts"]), key, body)
    except (ValueError, KeyError, TypeError) as exc:
        raise MetadataError(f"history event {key} is unreadable: {exc}") from exc


def _streams_for(types: set[str] | None) -> tuple[str, ...]:
    """The streams that can hold events of ``types``."""
    if types is None:
        return STREAMS
    out = []
    if types & CHECKPOINT_STREAM_TYPES:
        out.append(STREAM_CHECKPOINTS)
    if types - CHECKPOINT_STREAM_TYPES:
        out.append(STREAM_EVENTS)
    return tuple(out)
