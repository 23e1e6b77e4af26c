"""ParquetSink under ``kill -9``: a real process runs the runtime's order of events
(stage batch ``b`` -> write the checkpoint marker covering ``b`` -> commit ``b``) and is
killed at random points: during staging, during commit, between the marker (the
checkpoint's ``_metadata``) and the commit. Recovery then does what restore does: commit
the pending transactions the newest marker covers, abort the rest, replay from there.
A plain pyarrow reader must see every batch exactly once and nothing staged.

The child stages through ``pre_commit`` (driver-side rows), which shares every step
after the upload with the executor path (``stage``) that test_parquet_sink.py covers.
"""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_ckpt.runtime.sinks import ParquetSink

pytestmark = pytest.mark.timeout(240)

BATCHES = 40
ROWS = 2000

CHILD = r"""
import sys
from pathlib import Path
from airflow_ckpt.runtime.sinks import ParquetSink

uri, markers, start, end, rows = sys.argv[1], Path(sys.argv[2]), *map(int, sys.argv[3:])
sink = ParquetSink(uri, max_workers=2)
for b in range(start, end):
    sink.pre_commit(b, [{"k": i, "b": b} for i in range(rows)])
    (markers / f"{b:06d}").write_text("")   # the checkpoint covering b completed
    sink.commit(b)
print("done", flush=True)
"""


def _run(uri: str, markers: Path, start: int, kill_after: float | None,
         end: int = BATCHES) -> bool:
    """Run the child over batches ``start..end``; kill it after ``kill_after`` s. True if
    it finished."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, uri, str(markers), str(start),
                             str(end), str(ROWS)], stdout=subprocess.PIPE)
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return False
    out, _ = proc.communicate(timeout=200)
    assert proc.returncode == 0
    return b"done" in out


def _plain_batches(sink: ParquetSink) -> list[int]:
    seen: list[int] = []
    for info in sink.storage.list(""):
        if any(seg.startswith(("_", ".")) for seg in info.key.split("/")):
            continue
        table = pq.read_table(io.BytesIO(sink.storage.get_bytes(info.key)))
        assert table.num_rows == ROWS
        seen.extend(set(table.column("b").to_pylist()))
    return sorted(seen)


def _timed(uri: str, markers: Path, end: int) -> float:
    markers.mkdir(parents=True)
    began = time.monotonic()
    assert _run(uri, markers, 0, None, end)
    return time.monotonic() - began


def test_kill_anywhere_then_recover_exactly_once(tmp_path: Path) -> None:
    # kill times are drawn from this machine's own speed: the process start (interpreter,
    # pyarrow import) plus a fraction of the time the remaining batches take, so the
    # kills land inside staging and commits whether the machine is idle or loaded
    calib = tmp_path / "calibration"
    startup = _timed((calib / "t0").as_uri(), calib / "m0", 0)
    per_batch = max(_timed((calib / "t1").as_uri(), calib / "m1", BATCHES) - startup,
                    0.05) / BATCHES
    uri = (tmp_path / "table").as_uri()
    markers = tmp_path / "markers"
    markers.mkdir()
    rng = random.Random(9)
    start, kills = 0, 0
    while True:
        remaining = BATCHES - start
        kill_after = startup + rng.uniform(0.05, 0.8) * remaining * per_batch
        finished = _run(uri, markers, start, kill_after if kills < 6 else None)
        kills += not finished
        # restore: the newest completed checkpoint covers batch `last`
        done = sorted(int(p.name) for p in markers.iterdir())
        last = done[-1] if done else -1
        sink = ParquetSink(uri)
        # a plain reader never sees a batch newer than the newest checkpoint, or twice
        visible = _plain_batches(sink)
        assert len(visible) == len(set(visible)) and all(b <= last for b in visible)
        sink.recover(commit=[b for b in sink.pending() if b <= last])
        assert sink.pending() == []
        assert _plain_batches(sink) == list(range(last + 1))
        if finished:
            break
        start = last + 1
        time.sleep(0.05)
    assert kills >= 3, f"only {kills} kill(s) landed before the child finished"
    assert _plain_batches(ParquetSink(uri)) == list(range(BATCHES))
    assert not ParquetSink(uri).storage.list("_staging/")
