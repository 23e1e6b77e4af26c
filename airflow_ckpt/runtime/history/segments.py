"""The layout of ``<job>/history/``: raw event keys, segment objects, one listing.

A *segment* is an immutable, gzipped JSON-lines object
``<job>/history/segments/<stream>/<hi>_<last>_<first>_<count>_<digest>.jsonl.gz`` that
holds every event of its stream numbered up to ``hi`` that its compaction read
(``first``..``last``: the numbers of the oldest and newest it holds); ``digest`` names its
content, so two compactions that read different events never write the same name. Its
name is built and parsed here only (:class:`Segment`); what the names mean for readers and
writers (the *sealed* mark) is argued in :mod:`airflow_ckpt.runtime.history.journal`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from airflow_ckpt.errors import MetadataError
from airflow_ckpt.runtime.history.events import (
    RAW_RE,
    STREAM_EVENTS,
    STREAMS,
    UNREADABLE,
    HistoryEvent,
    seq_of_key,
)

SEGMENTS_DIR = "segments/"
_NAME_RE = re.compile(r"^(\d{16})_(\d{16})_(\d{16})_(\d+)_([0-9a-f]{12})\.jsonl\.gz$")


@dataclass(frozen=True, slots=True)
class Segment:
    """One compacted segment object: its key, stream, the numbers of the oldest and newest
    events it holds (0 when empty), the number it seals up to (``hi``), how many events it
    holds and the digest of its content."""

    key: str
    stream: str
    first: int
    last: int
    hi: int
    count: int
    digest: str

    @property
    def name(self) -> str:
        """The object's name in its stream's folder (what :meth:`parse` reads back)."""
        return (f"{self.hi:016d}_{self.last:016d}_{self.first:016d}_{self.count}_"
                f"{self.digest}.jsonl.gz")

    @classmethod
    def parse(cls, key: str, segments_prefix: str) -> Segment | None:
        """The segment ``key`` names (under ``<job>/history/segments/``), or None if it
        names none."""
        if not key.startswith(segments_prefix):
            return None
        stream, _, name = key[len(segments_prefix):].partition("/")
        match = _NAME_RE.match(name)
        if stream not in STREAMS or match is None:
            return None
        hi, last, first, count, digest = match.groups()
        return cls(key, stream, int(first), int(last), int(hi), int(count), digest)

    @classmethod
    def encode(cls, segments_prefix: str, history_prefix: str, stream: str,
               events: list[HistoryEvent], hi: int) -> tuple[Segment, bytes]:
        """The segment holding ``events`` (ascending) and sealing up to ``hi``, and its
        bytes. The same events always give the same name and bytes."""
        lines = []
        for event in events:
            row: dict[str, Any] = {"id": event.key[len(history_prefix):-len(".json")]}
            if event.type == UNREADABLE:
                row["unreadable"] = event.data["error"]
            else:
                row["event"] = event.data
            lines.append(json.dumps(row, default=str, sort_keys=True))
        text = ("\n".join(lines) + "\n") if lines else ""
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        first, last = (events[0].seq, events[-1].seq) if events else (0, 0)
        segment = cls("", stream, first, last, hi, len(events), digest)
        key = f"{segments_prefix}{stream}/{segment.name}"
        return replace(segment, key=key), gzip.compress(text.encode(), mtime=0)

    def decode(self, data: bytes, history_prefix: str) -> tuple[HistoryEvent, ...]:
        """The events this segment's bytes hold (``MetadataError`` if unreadable)."""
        try:
            events = []
            for line in gzip.decompress(data).splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                key = f"{history_prefix}{row['id']}.json"
                if "unreadable" in row:  # kept as evidence by the compaction
                    events.append(HistoryEvent(UNREADABLE, 0.0, key,
                                               {"error": str(row["unreadable"])}))
                    continue
                body = row["event"]
                events.append(HistoryEvent(str(body["type"]), float(body["ts"]), key, body))
        except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"history segment {self.key} is unreadable: {exc}") from exc
        return tuple(events)


@dataclass(frozen=True, slots=True)
class HistoryListing:
    """One listing of ``<job>/history/``: live raw event keys, segments, the sealed mark.

    ``raw`` holds only keys above ``sealed`` (sorted); ``void`` the raw keys at or below
    it, which no reader reads (see :mod:`airflow_ckpt.runtime.history.journal`).
    """

    prefix: str
    raw: tuple[str, ...]
    segments: tuple[Segment, ...]
    sealed: int
    void: tuple[str, ...] = ()

    @classmethod
    def parse(cls, prefix: str, keys: list[str]) -> HistoryListing:
        """The listing of the keys under ``prefix`` (``<job>/history/``)."""
        segments_prefix = f"{prefix}{SEGMENTS_DIR}"
        raw: list[str] = []
        segments: list[Segment] = []
        for key in keys:
            if key.startswith(segments_prefix):
                segment = Segment.parse(key, segments_prefix)
                if segment is not None:
                    segments.append(segment)
            elif RAW_RE.match(key[len(prefix):]):
                raw.append(key)
        raw.sort()
        segments.sort(key=lambda s: (s.hi, s.first, s.key))
        sealed = max((s.hi for s in segments if s.stream == STREAM_EVENTS), default=0)
        live = tuple(k for k in raw if seq_of_key(k) > sealed)
        void = tuple(k for k in raw if seq_of_key(k) <= sealed)
        return cls(prefix, live, tuple(segments), sealed, void)

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
