"""An in-memory checkpoint storage that enforces the contract and injects seeded faults.

:class:`SimStorage` implements :class:`~airflow_ckpt.runtime.storage.base.CheckpointStorage`
over a dict, atomically (only one actor runs at a time): create-only writes that find
other bytes raise ``ObjectAlreadyExistsError`` (equal bytes succeed, the contract's
equal-bytes rule), ``if_match`` writes that find another version (or none) raise
``PreconditionFailedError``, listings are sorted by key, ``list_after`` is S3's
``StartAfter``, and every write returns the ETag a read returns.

Every call is a yield point of the :class:`~.scheduler.Scheduler` (so a request is
*delayed*: others run first), and, per the storage's :class:`Faults`, the calling actor
may meet:

* ``unavailable``: a 503 / timeout after the backend's own retries
  (``EndpointUnreachableError``); nothing was applied;
* ``late``: the write's answer never came (``OutcomeUnknownError``) and the request is
  still in the network: it is applied at a later turn the scheduler picks (its
  conditions judged then), after its caller gave up; with ``hold_s`` the network holds
  it for up to that many seconds of true time first (a request that lands after a
  successor took over);
* ``unknown``: the write was applied, but its answer was lost and the read-back failed
  (``OutcomeUnknownError``);
* a *hang* (``hang``, default the ``late`` chance; not of the lease's own writes):
  the write, past its caller's lease gate, stays in the network for half ``hold_s`` to
  ``hold_s`` (default 30 s) with its caller waiting, then applies and answers (a
  deposed driver's write that was gated in time).

Each fault is a fault site (:mod:`~airflow_ckpt.testing.sim.buggify`): asked through
:meth:`~.scheduler.Scheduler.chance`, so it fires only when the seed's swarm enables it.

For the coverage report the objects remember every lease claim (epoch -> the view that
made it) and which actors claimed (two or more: a second lease holder), count the
claims made while the previous epoch's holder still ran (a takeover from a live,
deposed driver), and the kinds of writes applied for a driver that a newer epoch had
deposed by then (:func:`write_kind`).

Each storage call appends one line to the scheduler's trace. :meth:`SimStorage.objects`
is the ground truth (no yield, no fault) for the invariants.
"""

from __future__ import annotations

import builtins
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from airflow_ckpt.errors import (
    EndpointUnreachableError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    OutcomeUnknownError,
    PreconditionFailedError,
)
from airflow_ckpt.runtime.history.events import STREAM_EVENTS
from airflow_ckpt.runtime.history.segments import SEGMENTS_DIR, HistoryListing
from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, Versioned, etag_of
from airflow_ckpt.testing.sim.buggify import (
    STORAGE_503,
    STORAGE_HANG,
    STORAGE_LATE,
    STORAGE_LOST_ANSWER,
)
from airflow_ckpt.testing.sim.scheduler import Scheduler

#: a planted reader defect: which stored objects a view leaves out of its listings
Hidden = Callable[[str, "Stored"], bool]
#: how long a hung write stays in the network when its view has no ``hold_s``
HANG_S = 30.0
_LEASE_KEY = re.compile(r"/lease/(\d+)\.json$")
#: key fragment -> the kind of write (first match wins), for the coverage report
_KINDS = (("/_metadata", "marker"), ("/_txn/", "txn-record"),
          ("/_committed/", "commit-decision"), ("/_outcome/", "outcome"),
          ("/_pending/", "staged"), ("/part-", "publish"), ("/shared/", "shared-file"),
          ("/history/", "history"), ("/control/", "control"), ("/lease/", "lease"))


def write_kind(key: str, op: str = "put") -> str:
    """What a write to ``key`` is, as the coverage report names it."""
    if op == "delete":
        return "delete"
    return next((kind for part, kind in _KINDS if part in key), "checkpoint-file")


@dataclass(frozen=True, slots=True)
class Faults:
    """Chances, per call, of each fault (see the module doc); all 0: a perfect store."""

    unavailable: float = 0.0
    late: float = 0.0
    unknown: float = 0.0
    hold_s: float = 0.0  # a late write is held up to this long (uniform) before it lands
    hang: float = -1.0  # chance of a hang (see the module doc); negative: ``late``

    @property
    def hang_p(self) -> float:
        return self.late if self.hang < 0 else self.hang


@dataclass(frozen=True, slots=True)
class Stored:
    """One object: bytes, ETag, when it was written (true time) and its birth number
    (the order in which keys were first created; kept across deletes and rewrites)."""

    data: bytes
    etag: str
    written: float
    born: int
    writer: str  # the tag of the storage view that wrote it


def _void(objects: dict[str, Stored], key: str) -> bool:
    """A raw history key at or below the sealed mark (see runtime/history/journal.py): no reader
    ever reads it, so creating it again with other bytes is a void write (its writer takes
    it back), not a rewrite a cache could be fooled by."""
    head, sep, name = key.rpartition("/history/")
    if not sep or not name.endswith(".json") or not name[:-5].isdigit():
        return False
    prefix = f"{head}/history/"
    events = f"{prefix}{SEGMENTS_DIR}{STREAM_EVENTS}/"
    listing = HistoryListing.parse(prefix, [k for k in objects if k.startswith(events)])
    return int(name[:-5]) <= listing.sealed


class SimObjects:
    """The objects themselves, shared by every actor's :class:`SimStorage` view."""

    def __init__(self) -> None:
        self.objects: dict[str, Stored] = {}
        self.births = 0
        self.born: dict[str, int] = {}  # birth number of every key ever created
        self.last: dict[str, str] = {}  # the ETag each key was last written with
        self.changed = 0  # writes that gave a key other bytes than it had (or last had)
        self.rewritten: set[str] = set()  # keys deleted and created again, other bytes
        self.version = 0  # bumped by every mutation (a cheap "did anything change")
        self.claims: dict[int, str] = {}  # lease epoch -> the view (tag) that claimed it
        self.holders: set[str] = set()  # the actors' views that claimed an epoch
        self.contended = 0  # claims made while the previous holder's process still ran
        self.deposed: Counter[str] = Counter()  # kinds of writes applied for a deposed view

    def deposed_writer(self, tag: str) -> bool:
        """Whether ``tag`` claimed an epoch and a newer epoch was claimed by another."""
        return bool(self.claims) and tag in self.claims.values() \
            and self.claims[max(self.claims)] != tag

    def put(self, key: str, data: bytes, now: float, *, create_only: bool,
            if_match: str | None, writer: str = "") -> str:
        """Apply a write with its conditions (raises as the contract says)."""
        current = self.objects.get(key)
        if create_only and current is not None:
            if current.data == data:
                return current.etag
            raise ObjectAlreadyExistsError(f"sim://{key} already exists")
        if if_match is not None and (current is None or current.etag != if_match):
            raise PreconditionFailedError(f"sim://{key}: version is not {if_match}")
        etag = etag_of(data)
        if key in self.last and self.last[key] != etag:
            self.changed += 1
            if current is None and not _void(self.objects, key):
                self.rewritten.add(key)
        born = self.born.get(key) or self._birth()
        self.born.setdefault(key, born)
        self.last[key] = etag
        self.objects[key] = Stored(data, etag, now, born, writer)
        self.version += 1
        return etag

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            if self.objects.pop(key, None) is not None:
                self.version += 1

    def _birth(self) -> int:
        self.births += 1
        return self.births


class SimStorage(CheckpointStorage):
    """One actor's (or one group of actors') view of the shared :class:`SimObjects`.

    :param faults: the faults this view's callers meet (the harness gives each kind of
        actor its own view, so e.g. only the driver's writes land late)
    :param tag: shown in the trace
    :param hidden: planted defect: objects it accepts (key, object) are left out of
        listings (a reader that does not know where some events live)
    :param dropped: planted defect: writes to keys containing this are acknowledged and
        never stored (a writer that believes a write it did not make)
    :param unconditional: planted defect: writes to keys containing this drop their
        conditions (create-only, ``if_match``) and overwrite whatever is there
    :param alias: planted defect: the key every call really addresses (a layout that
        puts two writers' objects under one name)
    :param oracle: the harness's own view: no yield point, no fault, no trace line (the
        invariants read the ground truth through it)
    """

    def __init__(self, objects: SimObjects, scheduler: Scheduler, *,
                 faults: Faults = Faults(), tag: str = "", hidden: Hidden | None = None,
                 dropped: str | None = None, unconditional: str | None = None,
                 alias: Callable[[str], str] | None = None, oracle: bool = False) -> None:
        self.store = objects
        self.oracle = oracle
        self.scheduler = scheduler
        self.faults = faults
        self.tag = tag
        self.hidden = hidden
        self.dropped = dropped
        self.unconditional = unconditional
        self.alias = alias
        self.uri = "sim://bucket/root"
        #: called with (operation, key) when a write starts (before any fault): the
        #: harness's check that a driver's write passed its lease gate first
        self.checked: Callable[[str, str], None] | None = None

    def checked_view(self, check: Callable[[str, str], None]) -> SimStorage:
        """This view again (same faults, tag and plants) with ``check`` called at the
        start of every write."""
        view = SimStorage(self.store, self.scheduler, faults=self.faults, tag=self.tag,
                          hidden=self.hidden, dropped=self.dropped,
                          unconditional=self.unconditional, alias=self.alias)
        view.checked = check
        return view

    def view(self, faults: Faults, tag: str, *, hidden: Hidden | None = None,
             dropped: str | None = None, unconditional: str | None = None) -> SimStorage:
        """Another view of the same objects with other faults (and planted defects; an
        ``alias`` applies to every view)."""
        return SimStorage(self.store, self.scheduler, faults=faults, tag=tag, hidden=hidden,
                          dropped=dropped, unconditional=unconditional, alias=self.alias)

    def _listed(self, prefix: str, start_after: str = "") -> builtins.list[ObjectInfo]:
        return [ObjectInfo(k, len(v.data), v.written) for k, v in
                sorted(self.store.objects.items())
                if k.startswith(prefix) and k > start_after
                and not (self.hidden and self.hidden(k, v))]

    # ------------------------------------------------------------------ plumbing

    def _real(self, key: str) -> str:
        """The key a call really addresses (``alias``: a planted defect)."""
        return self.alias(key) if self.alias is not None else key

    def _enter(self, op: str, key: str) -> None:
        if self.oracle:
            return
        self.scheduler.yield_point(f"{op} {key}")
        if self.scheduler.current() is not None \
                and self.scheduler.chance(STORAGE_503, self.faults.unavailable):
            self._log(op, key, "503")
            raise EndpointUnreachableError(f"sim: {op} {key}: 503 Slow Down (retries spent)")

    def _log(self, op: str, key: str, outcome: str) -> None:
        if not self.oracle:
            self.scheduler.log(f"[{self.tag}] {op} {key} -> {outcome}")

    def _write(self, op: str, key: str, apply: Callable[[], str]) -> str:
        """Run a mutation with the write faults; returns what ``apply`` returns."""
        if self.checked is not None:
            self.checked(op, key)
        self._enter(op, key)
        sched = self.scheduler
        apply = self._tracked(op, key, apply)
        if sched.current() is not None and not self.oracle:
            if sched.chance(STORAGE_LATE, self.faults.late):
                hold = sched.rng.uniform(0.0, self.faults.hold_s) if self.faults.hold_s else 0.0
                sched.defer(f"late {op} {key}", lambda: _outcome(apply), sched.now + hold)
                self._log(op, key, "timeout (still in flight)")
                raise OutcomeUnknownError(f"sim: {op} {key}: no answer (it may land later)")
            if sched.chance(STORAGE_LOST_ANSWER, self.faults.unknown):
                self._log(op, key, f"applied, answer lost ({_outcome(apply)})")
                raise OutcomeUnknownError(f"sim: {op} {key}: answer lost, read-back failed")
            if write_kind(key, op) != "lease" and sched.chance(STORAGE_HANG, self.faults.hang_p):
                hold = self.faults.hold_s or HANG_S
                hang = sched.rng.uniform(hold / 2, hold)
                self._log(op, key, f"hangs {hang:.1f} s in the network")
                sched.sleep(hang)
        try:
            result = apply()
        except Exception as exc:
            self._log(op, key, type(exc).__name__)
            raise
        self._log(op, key, "ok")
        return result

    def _tracked(self, op: str, key: str, apply: Callable[[], str]) -> Callable[[], str]:
        """``apply`` that, once it succeeded, records lease claims and deposed writes
        (see the module doc)."""
        store, tag = self.store, self.tag

        def tracked() -> str:
            result = apply()
            claim = _LEASE_KEY.search(key) if op.startswith("put create-only") else None
            if claim is not None and int(claim.group(1)) not in store.claims:
                previous = store.claims[max(store.claims)] if store.claims else None
                store.claims[int(claim.group(1))] = tag
                if self.scheduler.current() is not None:
                    store.holders.add(tag)
                if previous is not None and previous != tag and self.scheduler.alive(previous):
                    store.contended += 1
                    self.scheduler.log(f"contention: {tag} claims epoch {claim.group(1)} "
                                       f"while {previous} still runs")
            elif store.deposed_writer(tag):
                store.deposed[write_kind(key, op)] += 1
            return result
        return tracked

    def _get(self, key: str) -> Stored:
        found = self.store.objects.get(key)
        if found is None:
            self._log("get", key, "404")
            raise ObjectNotFoundError(f"sim://{key}: no such object")
        self._log("get", key, "ok")
        return found

    # ------------------------------------------------------------------ the interface

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        key = self._real(key)
        op = "put" + (" create-only" if create_only else "") + (" if-match" if if_match else "")

        def apply() -> str:
            if self.dropped and self.dropped in key:
                return etag_of(data)
            if self.unconditional and self.unconditional in key:
                return self.store.put(key, data, self.scheduler.now, create_only=False,
                                      if_match=None, writer=self.tag)
            return self.store.put(key, data, self.scheduler.now, create_only=create_only,
                                  if_match=if_match, writer=self.tag)

        return self._write(op, key, apply)

    def get_bytes(self, key: str) -> bytes:
        key = self._real(key)
        self._enter("get", key)
        return self._get(key).data

    def get_versioned(self, key: str) -> Versioned:
        key = self._real(key)
        self._enter("get", key)
        found = self._get(key)
        return Versioned(found.data, found.etag)

    def exists(self, key: str) -> bool:
        key = self._real(key)
        self._enter("head", key)
        return key in self.store.objects

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        self._enter("list", prefix)
        out = self._listed(prefix)
        self._log("list", prefix, f"{len(out)} keys")
        return out

    def list_after(self, prefix: str, start_after: str) -> builtins.list[ObjectInfo]:
        self._enter("list", prefix)
        out = self._listed(prefix, start_after)
        self._log("list", f"{prefix} after {start_after.rsplit('/', 1)[-1]}", f"{len(out)} keys")
        return out

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        self._enter("list-dirs", prefix)
        base = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        names = {k[len(base):].split("/", 1)[0] for k in self.store.objects
                 if k.startswith(base) and "/" in k[len(base):]}
        return sorted(names)

    def upload_file(self, path: Path, key: str) -> None:
        key = self._real(key)
        data = path.read_bytes()
        self._write("upload", key, lambda: self.store.put(
            key, data, self.scheduler.now, create_only=False, if_match=None))

    def download_file(self, key: str, path: Path) -> None:
        key = self._real(key)
        self._enter("download", key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._get(key).data)

    def copy(self, src_key: str, dst_key: str) -> None:
        src_key, dst_key = self._real(src_key), self._real(dst_key)
        self._enter("get", src_key)
        data = self._get(src_key).data
        self._write("copy", dst_key, lambda: self.store.put(
            dst_key, data, self.scheduler.now, create_only=False, if_match=None))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = [self._real(k) for k in keys]
        if not keys:
            return

        def apply() -> str:
            self.store.delete(keys)
            return "deleted"

        label = keys[0].rsplit("/", 1)[-1] + (f" (+{len(keys) - 1})" if len(keys) > 1 else "")
        self._write("delete", label, apply)


def _outcome(apply: Callable[[], str]) -> str:
    """Apply a held write; its outcome as a trace word (conditions may fail by now)."""
    try:
        apply()
    except Exception as exc:
        return type(exc).__name__
    return "applied"


_View = TypeVar("_View", bound="RacingView")


class RacingView(SimStorage):
    """A driver's storage view that carries a race of its world (``race``: e.g. the
    sinks world's record race, the savepoints world's marker race) through
    :meth:`checked_view`, so the fenced view a driver writes through still races."""

    race: Any

    @classmethod
    def of(cls: type[_View], view: SimStorage, race: Any) -> _View:
        racing = cls.__new__(cls)
        racing.__dict__.update(view.__dict__)
        racing.race = race
        return racing

    def checked_view(self, check: Callable[[str, str], None]) -> SimStorage:
        return type(self).of(super().checked_view(check), self.race)
