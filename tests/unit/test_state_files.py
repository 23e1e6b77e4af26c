"""needed_state_files(): only the files loading state version V reads."""

from __future__ import annotations

from airflow_ckpt.runtime.checkpoint.metadata import FileEntry
from airflow_ckpt.runtime.restore.state_files import needed_state_files


def _entries(*paths: str) -> list[FileEntry]:
    return [FileEntry(p, "shared/" + p, 1, "0" * 64, True) for p in paths]


def _paths(entries: list[FileEntry]) -> list[str]:
    return [e.path for e in entries]


def test_rocksdb_newest_zip_then_changelogs() -> None:
    files = _entries(
        "offsets/9", "commits/9", "state/0/_metadata/metadata",
        "state/0/0/3.zip", "state/0/0/4.changelog", "state/0/0/5.zip",
        "state/0/0/5.changelog", "state/0/0/6.changelog", "state/0/0/7.changelog",
        "state/0/0/SSTs/000008-abc.sst", "state/0/0/_metadata/schema",
        "state/0/1/1.changelog", "state/0/1/2.changelog",  # no snapshot yet: keep all
    )
    got = _paths(needed_state_files(files, 7))
    assert got == [
        "offsets/9", "commits/9", "state/0/_metadata/metadata",
        "state/0/0/5.zip", "state/0/0/6.changelog", "state/0/0/7.changelog",
        "state/0/0/SSTs/000008-abc.sst", "state/0/0/_metadata/schema",
        "state/0/1/1.changelog", "state/0/1/2.changelog",
    ]


def test_hdfs_snapshot_then_deltas_and_nothing_newer() -> None:
    files = _entries("state/1/2/1.delta", "state/1/2/2.delta", "state/1/2/2.snapshot",
                     "state/1/2/3.delta", "state/1/2/4.delta")
    assert _paths(needed_state_files(files, 3)) == ["state/1/2/2.snapshot", "state/1/2/3.delta"]


def test_checkpoint_format_v2_directories_are_kept_whole() -> None:
    files = _entries("state/0/0/3_aa-bb.zip", "state/0/0/4_cc-dd.changelog",
                     "state/0/0/5_ee-ff.zip")
    assert _paths(needed_state_files(files, 5)) == _paths(files)
