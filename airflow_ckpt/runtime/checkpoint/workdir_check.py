"""Refuse a checkpoint whose state the driver cannot see (executors on other hosts).

The sync phase hard-links Spark's working directory *on the driver*. On a multi-host
cluster each executor writes its state store partitions under the same path on its own
host; unless that path is one filesystem shared with the driver (NFS...), the driver
sees the query-level files it wrote itself (logs, ``state/<op>/_metadata``, the
partition-0 schema) and none of the partitions' data files. A checkpoint captured
then would complete and restore empty state. Every state store partition writes a
versioned file (``<v>.delta``, ``.changelog``, ``.zip``) for every batch, so a
partition with none is state the driver cannot see: the checkpoint must fail, and
the job with it (no later checkpoint could do better).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from airflow_ckpt.errors import WorkdirNotSharedError
from airflow_ckpt.runtime.checkpoint.metadata import OperatorInfo
from airflow_ckpt.runtime.checkpoint.snapshot import CapturedSnapshot

_VERSIONED = re.compile(r"^\d+(?:_[^.]*)?\.(delta|snapshot|changelog|zip)$")


def check_captured(workdir: str, snap: CapturedSnapshot) -> None:
    """:func:`check_state_visible` on a captured snapshot of ``workdir`` (its location);
    discards its staging links before raising."""
    try:
        check_state_visible(workdir, (f.path for f in snap.files), snap.operators)
    except WorkdirNotSharedError:
        snap.discard()
        raise


def check_state_visible(workdir: str, paths: Iterable[str],
                        operators: Sequence[OperatorInfo]) -> None:
    """Raise :class:`WorkdirNotSharedError` if a stateful operator's partition has no
    versioned state file among the captured ``paths`` (relative to ``workdir``)."""
    seen: set[tuple[str, str]] = set()
    for path in paths:
        parts = path.split("/")
        if len(parts) >= 4 and parts[0] == "state" and _VERSIONED.match(parts[-1]):
            seen.add((parts[1], parts[2]))
    missing = [
        f"state/{op.operator_id}/{part}"
        for op in operators
        for part in range(op.num_partitions)
        if (str(op.operator_id), str(part)) not in seen
    ]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5
                                          else "")
        raise WorkdirNotSharedError(
            f"the driver's working directory {workdir} holds no state data for {shown}: "
            "the executors wrote their state files on another host. Put the working "
            "directory on HDFS (spark.airflow_ckpt.workdir=hdfs://<namenode>/<dir>, "
            "ideally a directory with snapshots allowed), or on a filesystem every "
            "executor and the driver mount at the same path (NFS...), or run the "
            "executors on the driver's host (local mode); see docs/deploy.md (an s3a:// "
            "working directory is not supported: it runs through the HDFS path untested, "
            "without snapshots, and costs S3 requests on every batch). No checkpoint was "
            "completed."
        )
