"""What a sink published, read back for a test's assertions."""

from __future__ import annotations

from typing import Any

from airflow_ckpt.runtime.sinks import ParquetSink, TwoPhaseCommitSink


def published_rows(sink: TwoPhaseCommitSink) -> list[dict[str, Any]]:
    """Every row ``sink`` published, sorted by the ``n`` column: a ``ParquetSink``'s
    committed files read with pyarrow, any other sink's ``committed_rows()``
    (``JsonLinesSink`` has one; a test's own sink defines it). Raises ``TypeError`` for
    a sink that has neither."""
    if isinstance(sink, ParquetSink):
        import pyarrow.parquet as pq

        rows: list[dict[str, Any]] = []
        for key in sink.committed_files():
            with sink.storage.open_stream(key) as fh:
                rows += pq.read_table(fh).to_pylist()
    else:
        committed_rows = getattr(sink, "committed_rows", None)
        if committed_rows is None:
            raise TypeError(f"{sink!r} does not list the rows it published")
        rows = list(committed_rows())
    return sorted(rows, key=lambda r: int(r["n"]))


def published_numbers(sink: TwoPhaseCommitSink) -> list[int]:
    """The ``n`` column of :func:`published_rows`, ascending."""
    return [int(r["n"]) for r in published_rows(sink)]
