"""What a micro-batch read: its source offsets, recorded in each sink transaction.

A batch id alone does not name a batch's data. After a restore of a checkpoint older than
the sink's output, Spark plans every batch after the restored one again from the sources
(it re-runs only the last batch its offsets log holds without a commit), so batch ``b`` may
now cover other offsets than the batch the sink committed as ``b``. Each transaction
therefore records :class:`BatchOffsets`, and a replay of a committed batch is skipped only
if it read exactly the same; otherwise :class:`ReplayPolicy` decides: under EXACTLY_ONCE the
sink refuses it with :class:`~airflow_ckpt.errors.SinkReplayMismatchError`, under
AT_LEAST_ONCE it publishes the replay as extra output (duplicates allowed, nothing lost),
logged at WARNING and reported to the runtime first.

The offsets come from Spark's offsets log entry ``offsets/<batch>`` of the query's
checkpoint directory (``v1``, the batch's metadata, then one line per source: its end
offset as JSON, or ``-``). The metadata line is left out (its ``batchTimestampMs`` differs
on every replay). A file source's offset, ``{"logOffset": n}``, only points into the
source's own log (``sources/<i>/<n>``, or a ``.compact`` file holding it), whose entry for
``n`` lists the files the batch read; those paths are part of what is compared (as a
count and a SHA-256 of the sorted paths, so a record stays small however many files a
batch reads), since a replay may list other files under the same ``logOffset``.

An entry holds each source's *end* offset only; a range source's batch starts where the
previous batch ended (``offsets/<b-1>``) or, for batch 0, at the source's initial offset
(``sources/<i>/0``, e.g. Kafka's ``startingOffsets`` resolved). So two batches ``b`` with
the same end can have read different ranges: a job first run with
``startingOffsets=latest``, then started into the same output with ``restore=none`` and
``earliest``, plans batch 0 over 0..59 where the committed batch 0 read 50..59. Each
record therefore also holds the batch's start (``starts``), and a replay is the same
batch only if both ends and both starts agree. A record from a version that did not
record starts (or a start Spark purged) is compared by its ends, as before.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_ckpt.errors import SinkReplayMismatchError
from airflow_ckpt.runtime.workdir import Workdir, read_bytes, read_text

log = logging.getLogger("airflow_ckpt.sinks")

#: characters of each source's offset shown in an error message
_SHOWN = 300
#: hex characters of the replay's offsets digest that name an extra publication
_TAG_CHARS = 16


@dataclass(frozen=True, slots=True)
class BatchOffsets:
    """The sources' end offsets of one batch (``sources[i]`` is source ``i``'s JSON
    offset, ``-`` if it had none) and, per source, the files it read (``files[i]``:
    ``<count>:<sha256 of the sorted paths>`` for a file source, ``""`` for any other; the
    tuple is empty when no source is a file source). ``digest`` identifies the two
    together: equal digests, same input."""

    sources: tuple[str, ...]
    files: tuple[str, ...] = ()
    #: where the batch started, per source (the previous batch's end offsets, or the
    #: sources' initial offsets for batch 0); empty when unknown
    starts: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        parts = [list(self.sources), list(self.files)]
        body = json.dumps([*parts, list(self.starts)] if self.starts else parts)
        return hashlib.sha256(body.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"sources": list(self.sources), "files": list(self.files)}
        if self.starts:
            body["starts"] = list(self.starts)
        return {**body, "digest": self.digest}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BatchOffsets:
        return cls(tuple(raw["sources"]), tuple(raw.get("files", ())),
                   tuple(raw.get("starts", ())))

    def same_input(self, other: BatchOffsets) -> bool:
        """Whether ``other`` read what this batch read: the same ends (and files), and
        the same starts where both know them."""
        if self.starts and other.starts:
            return self == other
        return (self.sources, self.files) == (other.sources, other.files)

    @property
    def tag(self) -> str:
        """Names an extra publication of a batch that read these offsets (a replay
        published under AT_LEAST_ONCE): the same input always gets the same tag."""
        return self.digest[:_TAG_CHARS]

    def describe(self) -> str:
        """The offsets for a person: each source's offset (and file count), shortened."""
        parts = []
        for i, offset in enumerate(self.sources):
            shown = _shorten(offset)
            files = self.files[i] if i < len(self.files) else ""
            parts.append(f"{shown} ({files.split(':')[0]} files)" if files else shown)
        ends = "[" + ", ".join(parts) + "]"
        if not self.starts:
            return ends
        return "from [" + ", ".join(_shorten(s) for s in self.starts) + "] to " + ends


def _shorten(offset: str) -> str:
    return offset if len(offset) <= _SHOWN else offset[:_SHOWN] + "..."


def _file_source_entries(checkpoint_dir: Workdir, source_log: str, log_offset: int) -> str:
    """``<count>:<sha256>`` of the paths a file source's log lists for ``log_offset``
    (``""`` if the log has no entry for it)."""
    for name in (str(log_offset), f"{log_offset}.compact"):
        try:
            text = read_text(checkpoint_dir, f"{source_log}/{name}")
        except (FileNotFoundError, IsADirectoryError):
            continue
        found = []
        for line in text.splitlines()[1:]:
            entry = json.loads(line) if line.strip() else {}
            if entry.get("batchId") == log_offset:
                found.append(str(entry["path"]))
        listed = "\n".join(sorted(found)).encode()
        return f"{len(found)}:{hashlib.sha256(listed).hexdigest()}"
    return ""


def _end_offsets(checkpoint_dir: Workdir, batch_id: int) -> tuple[str, ...] | None:
    """Each source's end offset in ``offsets/<batch_id>`` (None: no such entry)."""
    try:
        lines = read_text(checkpoint_dir, f"offsets/{batch_id}").splitlines()
    except FileNotFoundError:
        return None
    return tuple(line.strip() for line in lines[2:])


def _initial_offset(checkpoint_dir: Workdir, source: int) -> str:
    """Source ``source``'s initial offset as its metadata log ``sources/<i>/0`` holds it
    (its text after the version line; ``""`` when the source keeps none there)."""
    try:
        raw = read_bytes(checkpoint_dir, f"sources/{source}/0")
    except (FileNotFoundError, IsADirectoryError):
        return ""
    text = raw.lstrip(b"\x00").decode("utf-8", errors="replace")  # Kafka: a 0 byte first
    return "\n".join(line.strip() for line in text.splitlines()[1:])


def _start_offsets(checkpoint_dir: Workdir, batch_id: int, count: int) -> tuple[str, ...]:
    """Where ``batch_id`` started: the previous batch's end offsets, or for batch 0 the
    sources' initial offsets; ``()`` when unknown (the previous entry was purged)."""
    if batch_id == 0:
        return tuple(_initial_offset(checkpoint_dir, i) for i in range(count))
    return _end_offsets(checkpoint_dir, batch_id - 1) or ()


def read_batch_offsets(checkpoint_dir: Workdir, batch_id: int) -> BatchOffsets | None:
    """The offsets of ``batch_id`` from the query's checkpoint directory (its ends, the
    files it read and where it started), or None if its offsets log has no such entry
    (the batch is not Spark's, e.g. a sink driven directly)."""
    sources = _end_offsets(checkpoint_dir, batch_id)
    if sources is None:
        return None
    files: list[str] = []
    for i, offset in enumerate(sources):
        listed = ""
        if offset.startswith("{"):
            parsed = json.loads(offset)
            if isinstance(parsed, dict) and set(parsed) == {"logOffset"}:
                listed = _file_source_entries(checkpoint_dir, f"sources/{i}",
                                              int(parsed["logOffset"]))
        files.append(listed)
    return BatchOffsets(sources, tuple(files) if any(files) else (),
                        _start_offsets(checkpoint_dir, batch_id, len(sources)))


class ReplayVerdict(enum.Enum):
    """What becomes of a replay of a batch a sink committed already."""

    #: it read exactly what the committed batch read: skip it (exactly once)
    SAME = "same"
    #: no offsets are known (the sink runs without the runtime): skip it, unverified
    UNVERIFIED = "unverified"
    #: it read other offsets (or the committed batch recorded none) and the mode allows
    #: duplicates: publish it as extra output
    PUBLISH = "publish"


#: ``report(sink, batch_id, committed, replay)``: the offsets described for a person
ReplayReport = Callable[[str, int, str, str], None]


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    """What a sink does with a replay of a committed batch that read other source
    offsets. ``publish_other`` False (EXACTLY_ONCE, the default): refuse it with
    :class:`~airflow_ckpt.errors.SinkReplayMismatchError`, nothing published; True
    (AT_LEAST_ONCE, duplicates allowed by contract): publish it as extra output, so that
    no row is lost, after :meth:`announce` (a WARNING log, then ``report``: the runtime
    appends a ``sink_replay_published`` history event). The runtime hands each
    registered sink the policy of the job's mode (``TwoPhaseCommitSink.track_offsets``)."""

    publish_other: bool = False
    report: ReplayReport | None = None

    def judge(self, sink: str, batch_id: int, committed: dict[str, Any] | None,
              replay: BatchOffsets | None, *, published_as: int | None = None) -> ReplayVerdict:
        """Decide a replay of a batch ``sink`` committed already, from the offsets the
        commit decision recorded (``committed``, ``BatchOffsets.to_dict``) and the
        replay's. Raises ``SinkReplayMismatchError`` for other offsets unless
        ``publish_other``; a sink that then publishes the replay calls
        :meth:`announce` first, so an extra publication is never silent.
        ``published_as``: the committed batch's id when it is not ``batch_id`` (a
        replay under a shifted id, found by where it started)."""
        if replay is None:
            return ReplayVerdict.UNVERIFIED
        if committed is not None and BatchOffsets.from_dict(committed).same_input(replay):
            return ReplayVerdict.SAME
        if not self.publish_other:
            raise SinkReplayMismatchError(batch_id, sink, _shown(committed, published_as),
                                          replay.describe())
        return ReplayVerdict.PUBLISH

    def announce(self, sink: str, batch_id: int, committed: dict[str, Any] | None,
                 replay: BatchOffsets, *, published_as: int | None = None) -> None:
        """Say that ``sink`` publishes a replay of ``batch_id`` that read other offsets
        than the committed batch: a WARNING log with both, then ``report``."""
        shown = _shown(committed, published_as)
        log.warning("%s: batch %d is committed already, from source offsets %s; its replay "
                    "read other source offsets %s and is published as extra output "
                    "(AT_LEAST_ONCE: rows of both may appear twice, none is lost)",
                    sink, batch_id, shown, replay.describe())
        if self.report is not None:
            self.report(sink, batch_id, shown, replay.describe())


def _shown(committed: dict[str, Any] | None, published_as: int | None = None) -> str:
    """The offsets a commit decision recorded, for a person (and the batch id it was
    published under, when another than the replay's)."""
    shown = BatchOffsets.from_dict(committed).describe() if committed else "(not recorded)"
    return shown if published_as is None else f"{shown} (published as batch {published_as})"


#: EXACTLY_ONCE's policy, and a sink's without the runtime: other offsets are refused
REFUSE = ReplayPolicy()


def check_replay(sink: str, batch_id: int, committed: dict[str, Any] | None,
                 replay: BatchOffsets | None) -> bool:
    """Decide a replay of a batch ``sink`` committed already under :data:`REFUSE`:
    True to skip it (it read exactly what the committed batch read: exactly once),
    False to skip it unverified (``replay`` is None: the sink is driven without the
    runtime, which knows no offsets). Raises
    :class:`~airflow_ckpt.errors.SinkReplayMismatchError` if the replay read other
    offsets, or the committed transaction recorded none to compare. ``committed`` is
    the offsets the commit decision recorded (``BatchOffsets.to_dict``). A sink that
    honours AT_LEAST_ONCE calls :meth:`ReplayPolicy.judge` with its policy instead."""
    return REFUSE.judge(sink, batch_id, committed, replay) is ReplayVerdict.SAME
