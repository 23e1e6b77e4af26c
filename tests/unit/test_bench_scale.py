"""bench.scale / bench.steady without Spark: the ground truth and the argument sizes.

No timings here: speed is measured by ``python -m bench.scale``, not by tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("numpy")
pytest.importorskip("pyarrow")

from bench.scale import parse_args
from bench.steady import Workload


def test_truth_counts_every_touched_key_once_per_batch() -> None:
    w = Workload(keys=1000, touched=0.05, rows=200, batches=3)
    truth = w.truth(range(4))
    assert truth[0][:3] == (1000, 1000, int(w.batch(0)[1].sum()))
    for rows, counts, _sums, _crc in truth[1:]:
        assert rows == 50  # 5 % of the keys, each at least once
        assert counts >= 200  # running counts of the touched keys include this batch
    assert w.truth([1, 2]) != truth[1:3]  # from empty state, not after batch 0


def test_inputs_are_deterministic_parquet(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    w = Workload(keys=100, touched=0.1, rows=30, batches=1)
    path = w.write(tmp_path, 1, mtime=1_000_000.0)
    table = pq.read_table(path)
    assert table.num_rows == 30 and table.schema.names == ["k", "v", "p"]
    assert table.column("p").to_pylist() == [x.decode() for x in w.batch(1)[2].tolist()]
    assert path.stat().st_mtime == 1_000_000.0


def test_quick_is_smaller_than_the_default() -> None:
    quick, full = parse_args(["--quick"]), parse_args([])
    assert quick.keys < full.keys and quick.batches < full.batches
    assert (full.keys, full.touched, full.batches) == (3_000_000, 0.01, 24)


def test_transfer_repeats_default_to_nine_and_are_validated() -> None:
    assert parse_args([]).repeats_transfer == 9
    assert parse_args(["--quick"]).repeats_transfer == 1
    assert parse_args(["--repeats-transfer", "5"]).repeats_transfer == 5
    with pytest.raises(SystemExit):
        parse_args(["--repeats-transfer", "0"])


def test_the_table_prints_the_spread_of_paired_ratios() -> None:
    from bench.suites import Row, paired_spread, table

    spread = paired_spread([1.1, 1.3, 0.9], [1.0, 1.0, 1.0])
    assert spread is not None and spread == pytest.approx((0.9, 1.3))
    assert paired_spread([1.0], [1.0]) is None  # one pair: no spread to show
    text = table([Row("d restore", "x", "s", "raw", 1.0, "ours", 1.1, spread),
                  Row("e start", "y", "s", "fresh", 2.0, "restored", 2.0)])
    assert "paired min-max" in text and "1.10x  0.90-1.30" in text
    assert text.splitlines()[-1].endswith("1.00x")


def test_the_upload_rows_show_both_paths_and_the_bytes_read() -> None:
    from bench.scale import _upload_rows

    assert parse_args(["--only", "upload", "--files", "34", "--file-mib", "34"]).only == "upload"
    runs = {"ours": [2.0, 2.2], "raw": [2.0, 2.0], "ours_full": [2.1, 1.9]}
    c = {"bytes": 4 * 1024 * 1024, "files": 2, "raw_s": 2.0, "ours_s": 2.1, "full_s": 2.0,
         "runs": runs, "read_per_byte": {"raw": [3.0, 3.0], "ours": [4.0, 4.0],
                                         "ours_full": [3.0, 3.0]}}
    rows = _upload_rows(c)
    assert [(r.subject, r.subject_value) for r in rows] == [
        ("incremental", 2.1), ("full (hash sending)", 2.0), ("incremental", 4.0),
        ("full", 3.0)]
    assert rows[1].spread == pytest.approx((0.95, 1.05))
    del c["read_per_byte"]  # reports written before the column: the timings alone
    assert len(_upload_rows(c)) == 2
