"""HistoryReader: reads the history of one job, newest first and only as far as needed.

Readers never list more than ``history/`` (raw tail + segment names, a few hundred keys)
and read newest first only as far as they need: :meth:`HistoryReader.newest` (the UI
window), :meth:`HistoryReader.newest_until` (the restart log's and savepoint check's
backward scans, skipping the ``checkpoints`` stream when the types they want are not in
it) and :meth:`HistoryReader.events_after` (incremental reads, ``StartAfter``). Objects
are immutable (create-only keys, never rewritten; a void key is never read), so an
:class:`EventCache` can keep parsed objects across reads (the UI plugin does). A reader
deduplicates by key (an event may be raw and in a segment at once, mid-compaction) and
lists again when a listed object is gone (compacted meanwhile); why that never misses an
event is argued in :mod:`airflow_ckpt.runtime.history.journal`.

Read-only users (the supervisor's probe, triggers, sensor, plugin, CLI, metrics) take a
:class:`HistoryReader`; the writer, :class:`~airflow_ckpt.runtime.history.journal.JobHistory`,
is one too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from airflow_ckpt.errors import MetadataError, ObjectNotFoundError, VanishedError
from airflow_ckpt.runtime.history.events import (
    STREAMS,
    UNREADABLE,
    HistoryEvent,
    streams_for,
)
from airflow_ckpt.runtime.history.segments import SEGMENTS_DIR, HistoryListing, Segment
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout


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


READ_ATTEMPTS = 5

class HistoryReader:
    """Reads the history of one job (see the module doc).

    :param cache: parsed objects shared between reads (the UI passes one per storage)
    """

    def __init__(self, storage: CheckpointStorage, job: str, *,
                 cache: EventCache | None = None) -> None:
        self.storage = storage
        self.layout = JobLayout(job)
        self.cache = cache

    @property
    def segments_prefix(self) -> str:
        return f"{self.layout.history_prefix}{SEGMENTS_DIR}"

    # ------------------------------------------------------------------ listing

    def listing(self, start_after: str | None = None) -> HistoryListing:
        """List ``history/`` once (with ``start_after``: raw keys after it only; segments
        always, as their names sort after every raw key)."""
        prefix = self.layout.history_prefix
        infos = (self.storage.list_after(prefix, start_after) if start_after
                 else self.storage.list(prefix))
        return self._parse([info.key for info in infos])

    def _parse(self, keys: list[str]) -> HistoryListing:
        return HistoryListing.parse(self.layout.history_prefix, keys)

    # ------------------------------------------------------------------ reading

    def _cached(self, key: str) -> tuple[HistoryEvent, ...] | None:
        """Parsed objects known without a read (the shared cache)."""
        return self.cache.get(key) if self.cache is not None else None

    def _load_raw(self, key: str) -> HistoryEvent:
        cached = self._cached(key)
        if cached is not None:
            return cached[0]
        try:
            raw = self.storage.get_bytes(key)
        except ObjectNotFoundError as exc:
            raise VanishedError(key) from exc
        event = HistoryEvent.parse(key, raw)
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
            raise VanishedError(segment.key) from exc
        out = segment.decode(raw, self.layout.history_prefix)
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
        A vanished object raises :class:`VanishedError` (the caller lists again).
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
                if event.type == UNREADABLE:
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
        for _ in range(READ_ATTEMPTS - 1):
            try:
                return read()
            except VanishedError:
                continue  # compacted while we read: the new listing has it in a segment
        try:
            return read()
        except VanishedError as exc:
            raise MetadataError(
                f"history of {self.layout.job} kept changing while it was read "
                f"({exc} vanished {READ_ATTEMPTS} times)"
            ) from exc

    def events(self, types: Iterable[str] | None = None) -> list[HistoryEvent]:
        """All events in append order, optionally only those of ``types``.

        An unreadable event (corrupt JSON) raises ``MetadataError`` naming its key:
        history is evidence and is never silently skipped.
        """
        wanted = set(types) if types is not None else None

        def read() -> list[HistoryEvent]:
            out = [e for e in self._iter_newest(self.listing(), streams_for(wanted))
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
            for event in self._iter_newest(listing, streams_for(wanted), on_error):
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
        one clock for every writer). Once it was compacted, the ``LastModified`` of the
        first object listed after it (a later event or the segment now holding it: both
        written after it, on the same clock); the writer's ``ts`` only when the listing
        holds nothing after it.

        For rules that compare the times of events written by different hosts (the
        failure-rate window, exponential-delay's pending restart): those compare storage
        times, never two hosts' clocks.
        """
        before = self.layout.history_event(event.seq - 1)
        for info in self.storage.list_after(self.layout.history_prefix, before):
            if info.key >= event.key:
                return info.last_modified
        return event.ts

    def last(self, event_type: str) -> HistoryEvent | None:
        """The newest event of ``event_type``, if any."""
        return self.last_of([event_type])

    def last_of(self, types: Iterable[str]) -> HistoryEvent | None:
        """The newest event of any of ``types``, if any."""
        wanted = set(types)
        found, _ = self.newest_until(lambda e: True, wanted)
        return found[0] if found else None
