"""Append-only job history in storage: ``<job>/history/<epoch-ms>-<uid>.json``.

Every event is first its own object written create-only, so concurrent writers (the
driver, the Airflow supervisor) never overwrite each other, and listing the prefix
returns the events in time order. The restart strategies' failure log lives here too,
so it spans in-process restarts, driver resubmissions and Airflow worker restarts.

**Compaction** keeps the cost of a year-long job flat (docs/architecture.md, "History
compaction"). Raw events older than a grace period are folded into immutable, gzipped
JSON-lines *segments*, ``<job>/history/segments/<stream>/<last>_<first>_<count>.jsonl.gz``
(``<last>``/``<first>``: the newest/oldest event's key stem ``<ms>-<uid>``), in two
streams: ``checkpoints`` (``checkpoint_completed``/``checkpoint_failed``, the bulk, kept
for the newest ``retain_checkpoint_events``) and ``events`` (everything else: lifecycle,
failures, restarts, savepoints; never deleted). Every event keeps its original key as its
identity, in a segment too.

The invariant: *an event is deleted only after a segment holding it was written* (or, for
checkpoint statistics, by the retention policy). A crash between the two leaves the event
in both places; readers deduplicate by key, so they never see it twice and never miss it.
A reader that finds a listed object gone (compacted meanwhile) lists again.

Readers never list more than ``history/`` (raw tail + segment names, a few hundred keys)
and read newest first only as far as they need: :meth:`JobHistory.newest` (the UI window),
:meth:`JobHistory.newest_until` (the restart log's and savepoint check's backward scans,
skipping the ``checkpoints`` stream when the types they want are not in it) and
:meth:`JobHistory.events_after` (incremental reads, ``StartAfter``). Objects are immutable
(create-only keys, never rewritten), so an :class:`EventCache` can keep parsed objects
across reads (the UI plugin does).
"""

from __future__ import annotations

import contextlib
import gzip
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

from airflow_ckpt.errors import MetadataError, ObjectAlreadyExistsError, ObjectNotFoundError
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


log = logging.getLogger(__name__)

#: Events compacted into the ``checkpoints`` stream (subject to retention); every other
#: type goes to the ``events`` stream, which is never deleted.
CHECKPOINT_STREAM_TYPES = frozenset({CHECKPOINT_COMPLETED, CHECKPOINT_FAILED})
STREAM_CHECKPOINTS = "checkpoints"
STREAM_EVENTS = "events"
STREAMS = (STREAM_CHECKPOINTS, STREAM_EVENTS)
SEGMENTS_DIR = "segments/"
_STEM_RE = re.compile(r"^\d{13}-[0-9A-Za-z]+$")
_SEGMENT_RE = re.compile(r"^(\d{13}-[0-9A-Za-z]+)_(\d{13}-[0-9A-Za-z]+)_(\d+)\.jsonl\.gz$")


def stream_of(event_type: str) -> str:
    """The segment stream an event type is compacted into."""
    return STREAM_CHECKPOINTS if event_type in CHECKPOINT_STREAM_TYPES else STREAM_EVENTS


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event: its type, when (epoch seconds), its key (identity) and payload.

    ``key`` is the event's raw object key ``<job>/history/<ms>-<uid>.json`` even when the
    event now lives in a segment: it orders events and deduplicates them.
    """

    type: str
    ts: float
    key: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Segment:
    """One compacted segment object: its key, stream, and the key stems it spans."""

    key: str
    stream: str
    first: str
    last: str
    count: int


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When and how :class:`JobHistory` compacts (see the module docstring).

    :param every: compact in the background after this many appends by one process (and
        on a driver's first ``job_started``); 0 turns automatic compaction off
    :param grace_s: raw events younger than this stay raw, so a writer whose key is a
        little "in the past" (clock, slow PUT) is never raced
    :param segment_events: events per segment; the newest segment of a stream is topped
        up until it holds this many
    :param retain_checkpoint_events: ``checkpoint_completed``/``_failed`` events kept in
        segments (whole segments are dropped, oldest first); None keeps all
    """

    every: int = 50
    grace_s: float = 60.0
    segment_events: int = 1000
    retain_checkpoint_events: int | None = 20_000


DEFAULT_COMPACTION = CompactionPolicy()


@dataclass(slots=True)
class CompactionResult:
    """What one :meth:`JobHistory.compact` did."""

    compacted: int = 0  # raw events now in segments (and deleted as raw objects)
    segments_written: int = 0
    segments_deleted: int = 0  # merged into a bigger one, or dropped by retention
    events_dropped: int = 0  # checkpoint events dropped by retention
    skipped: list[str] = field(default_factory=list)  # unreadable raw events, left alone


@dataclass(frozen=True, slots=True)
class HistoryListing:
    """One listing of ``<job>/history/``: the raw event keys and the segments, sorted."""

    raw: tuple[str, ...]
    segments: tuple[Segment, ...]

    @property
    def newest_key(self) -> str | None:
        """The key of the newest event listed (raw or last of a segment)."""
        keys = [self.raw[-1]] if self.raw else []
        keys += [_raw_key_of(s.key, s.last) for s in self.segments]
        return max(keys) if keys else None

    @property
    def total(self) -> int:
        """Events stored (a crash mid-compaction may count some twice)."""
        return len(self.raw) + sum(s.count for s in self.segments)


def _raw_key_of(segment_key: str, stem: str) -> str:
    prefix = segment_key[: segment_key.index(SEGMENTS_DIR)]
    return f"{prefix}{stem}.json"


class EventCache:
    """Parsed history objects by key, least recently used dropped first.

    Sound because history objects are immutable: a raw event key is written once,
    create-only, and a segment's name fixes its content. ``capacity`` counts events.
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
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        job: str,
        *,
        compaction: CompactionPolicy | None = DEFAULT_COMPACTION,
        cache: EventCache | None = None,
    ) -> None:
        self.storage = storage
        self.layout = JobLayout(job)
        self.compaction = compaction
        self.cache = cache
        self._appends = 0
        self._compacting = threading.Lock()
        # what this instance wrote itself (its events, its segments): compaction then
        # reads from storage only what other writers appended
        self._written = EventCache(4 * compaction.segment_events if compaction else 1)

    @property
    def segments_prefix(self) -> str:
        return f"{self.layout.history_prefix}{SEGMENTS_DIR}"

    # ------------------------------------------------------------------ writing

    def append(self, event_type: str, **data: Any) -> HistoryEvent:
        """Append one event. Durable when this returns.

        Every ``compaction.every`` appends (and on a driver's first ``job_started``) a
        background thread compacts the history; it never delays the caller.
        """
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
            break
        event = HistoryEvent(event_type, now, key, body)
        self._written.put(key, (event,))
        self._appends += 1
        policy = self.compaction
        if policy is not None and policy.every > 0 and (
            self._appends % policy.every == 0
            or (self._appends == 1 and event_type == JOB_STARTED)
        ):
            self._compact_in_background()
        return event

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
        raw: list[str] = []
        segments: list[Segment] = []
        seg_prefix = self.segments_prefix
        for info in infos:
            key = info.key
            if key.startswith(seg_prefix):
                stream, _, name = key[len(seg_prefix):].partition("/")
                match = _SEGMENT_RE.match(name)
                if stream in STREAMS and match:
                    segments.append(Segment(key, stream, match.group(2), match.group(1),
                                            int(match.group(3))))
            elif key.endswith(".json") and "/" not in key[len(prefix):]:
                raw.append(key)
        segments.sort(key=lambda s: (s.last, s.first, s.key))
        return HistoryListing(tuple(raw), tuple(segments))

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
        try:
            body = json.loads(raw)
            event = HistoryEvent(str(body["type"]), float(body["ts"]), key, body)
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"history event {key} is unreadable: {exc}") from exc
        if not isinstance(body, dict):
            raise MetadataError(f"history event {key} is not a JSON object")
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
                body = row["event"]
                events.append(HistoryEvent(str(body["type"]), float(body["ts"]),
                                           f"{prefix}{row['id']}.json", body))
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
        items += [(_raw_key_of(s.key, s.last), s) for s in listing.segments
                  if s.stream in wanted]
        if after is not None:
            items = [item for item in items if item[0] > after]
        items.sort(key=lambda item: item[0], reverse=True)
        buffer: list[HistoryEvent] = []  # ascending by key; pop() is the newest
        seen: set[str] = set()
        i = 0
        while i < len(items) or buffer:
            if buffer and (i >= len(items) or buffer[-1].key >= items[i][0]):
                event = buffer.pop()
                if event.key not in seen:
                    seen.add(event.key)
                    yield event
                continue
            _, item = items[i]
            i += 1
            try:
                loaded = (self._load_raw(item),) if isinstance(item, str) \
                    else self._load_segment(item)
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
        """All events in time order, optionally only those of ``types``.

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
        newest event is after it: a reader that polls pays for what is new.
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

    def last(self, event_type: str) -> HistoryEvent | None:
        """The newest event of ``event_type``, if any."""
        return self.last_of([event_type])

    def last_of(self, types: Iterable[str]) -> HistoryEvent | None:
        """The newest event of any of ``types``, if any."""
        wanted = set(types)
        found, _ = self.newest_until(lambda e: True, wanted)
        return found[0] if found else None

    # ------------------------------------------------------------------ compaction

    def compact(
        self, policy: CompactionPolicy | None = None, now: float | None = None
    ) -> CompactionResult:
        """Fold raw events older than the grace period into segments; apply retention.

        Safe to run concurrently with writers, readers and other compactions, and to
        crash at any point: raw events are deleted only after a segment holding them
        is durable, and only the keys this call read are deleted.
        """
        policy = policy or self.compaction or DEFAULT_COMPACTION
        now = time.time() if now is None else now
        result = CompactionResult()
        listing = self.listing()
        prefix = self.layout.history_prefix
        cutoff = f"{prefix}{int((now - policy.grace_s) * 1000):013d}"
        fresh: dict[str, list[HistoryEvent]] = {s: [] for s in STREAMS}
        for key in listing.raw:
            if key >= cutoff:
                break
            if not _STEM_RE.match(key[len(prefix):-len(".json")]):
                continue  # not written by append(): left raw, still read
            try:
                event = self._load_raw(key)
            except _Vanished:
                continue  # another compaction took it
            except MetadataError as exc:
                result.skipped.append(str(exc))
                continue
            fresh[stream_of(event.type)].append(event)
        written: set[str] = set()
        delete: list[str] = []
        for stream in STREAMS:
            existing = [s for s in listing.segments if s.stream == stream]
            new = fresh[stream]
            if new:
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
                chunks = [ordered[i:i + size] for i in range(0, len(ordered), size)]
                keep = policy.retain_checkpoint_events if stream == STREAM_CHECKPOINTS \
                    else None
                kept = 0
                for chunk in reversed(chunks):  # newest first, for retention
                    if keep is not None and kept >= keep:
                        result.events_dropped += len(chunk)  # dropped by retention unwritten
                        continue
                    kept += len(chunk)
                    segment = self._write_segment(stream, chunk)
                    written.add(segment.key)
                    existing.append(segment)
                    result.segments_written += 1
                result.compacted += len(new)
                delete.extend(e.key for e in new)
            if stream == STREAM_CHECKPOINTS and policy.retain_checkpoint_events is not None:
                kept = 0
                for segment in sorted(existing, key=lambda s: s.last, reverse=True):
                    if kept >= policy.retain_checkpoint_events and segment.key not in written:
                        delete.append(segment.key)
                        result.events_dropped += segment.count
                    kept += segment.count
        # only now, with every segment durable: the invariant of the module docstring
        delete = [k for k in delete if k not in written]
        if delete:
            self.storage.delete_many(delete)
        result.segments_deleted = sum(1 for k in delete if k.startswith(self.segments_prefix))
        if result.compacted or result.segments_deleted:
            log.info("compacted the history of %s: %s", self.layout.job, result)
        return result

    def _write_segment(self, stream: str, events: list[HistoryEvent]) -> Segment:
        prefix = self.layout.history_prefix
        stems = [e.key[len(prefix):-len(".json")] for e in events]
        name = f"{stems[-1]}_{stems[0]}_{len(events)}.jsonl.gz"
        key = f"{self.segments_prefix}{stream}/{name}"
        lines = [json.dumps({"id": stem, "event": e.data}, default=str)
                 for stem, e in zip(stems, events, strict=True)]
        data = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
        # exists: a concurrent compaction wrote the same events under the same name
        with contextlib.suppress(ObjectAlreadyExistsError):
            self.storage.put_bytes(key, data, create_only=True)
        self._written.put(key, tuple(events))
        return Segment(key, stream, stems[0], stems[-1], len(events))


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
