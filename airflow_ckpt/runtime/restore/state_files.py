"""Which captured state files a restore of version ``V`` actually needs.

A checkpoint keeps every state file Spark had not yet deleted (up to
``spark.sql.streaming.minBatchesToRetain`` versions). Loading version ``V`` reads far
fewer, per state-store partition directory (``state/<op>/<partition>[/<store>]``):

* HDFS-backed provider (``HDFSBackedStateStoreProvider.loadMap``): the newest
  ``<v>.snapshot`` with ``v <= V`` (or version 0), then every ``<v>.delta`` after it up
  to ``V``;
* RocksDB provider (``RocksDB.load`` with checkpoint format version 1):
  ``fileManager.getLatestVersion(V)`` is the newest ``<v>.zip`` with ``v <= V``; its
  SSTs (in ``SSTs/``, referenced from inside the zip) are loaded, then the changelogs
  ``<v>.changelog`` for ``v`` in ``(snapshot, V]`` are replayed.

So, per directory: versioned files older than the newest snapshot ``<= V`` and newer
than ``V`` are dropped; everything else is kept (SSTs, logs, ``_metadata``, schemas,
offset/commit logs). Directories with checkpoint format version 2 names
(``<v>_<uniqueId>.zip``), where the lineage decides which file is read, are kept whole,
as is any directory without a snapshot ``<= V``. The choice only ever drops files that
loading ``V`` cannot read; verification of what is kept is unchanged.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from airflow_ckpt.runtime.checkpoint.metadata import FileEntry

_VERSIONED = re.compile(r"^(\d+)(_[0-9A-Za-z-]+)?\.(zip|changelog|delta|snapshot)$")
_SNAPSHOT_KINDS = frozenset({"zip", "snapshot"})


def needed_state_files(files: Sequence[FileEntry], version: int) -> list[FileEntry]:
    """The subset of ``files`` that loading state version ``version`` reads (see the
    module docstring), in the original order."""
    by_dir: dict[str, list[tuple[int, str, bool, FileEntry]]] = defaultdict(list)
    for entry in files:
        directory, _, name = entry.path.rpartition("/")
        match = _VERSIONED.match(name)
        if match and entry.path.startswith("state/"):
            by_dir[directory].append(
                (int(match.group(1)), match.group(3), match.group(2) is not None, entry))
    dropped: set[int] = set()
    for versioned in by_dir.values():
        if any(v2 for _, _, v2, _ in versioned):
            continue
        snapshots = [v for v, kind, _, _ in versioned if kind in _SNAPSHOT_KINDS and v <= version]
        if not snapshots:
            continue
        base = max(snapshots)
        for v, kind, _, entry in versioned:
            if v < base or v > version or (v == base and kind not in _SNAPSHOT_KINDS):
                dropped.add(id(entry))
    return [e for e in files if id(e) not in dropped]
