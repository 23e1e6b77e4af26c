"""runtime/workdir: which working directories are remote, and the local path's helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt.runtime.checkpoint.snapshot import latest_batch, query_id
from airflow_ckpt.runtime.workdir import (
    is_remote,
    location,
    names,
    read_text,
    replace_with,
    restore_dir,
    staging_root,
)


@pytest.mark.parametrize(("spec", "remote"), [
    ("hdfs://nn:8020/jobs/j", True),
    ("viewfs://cluster/jobs/j", True),
    ("file:///tmp/jobs/j", False),
    ("/tmp/jobs/j", False),
    ("relative/dir", False),
    ("C:\\\\jobs", False),
])
def test_only_a_uri_with_a_scheme_other_than_file_is_remote(spec: str, remote: bool) -> None:
    assert is_remote(spec) is remote


def test_local_working_directory_reads_stages_and_is_replaced_by_rename(tmp_path: Path) -> None:
    work = tmp_path / "job" / "work"
    (work / "commits").mkdir(parents=True)
    (work / "commits" / "3").write_text("v1\n{}")
    (work / "metadata").write_text('{"id":"q"}')
    assert location(work) == str(work)
    assert names(work, "commits") == ["3"] and latest_batch(work, "commits") == 3
    assert latest_batch(work, "offsets") is None and query_id(work) == "q"
    with pytest.raises(FileNotFoundError):
        read_text(work, "offsets/3")
    assert staging_root(work) == tmp_path / "job" / ".work.staging"
    restored = restore_dir(work)
    assert restored.parent == work.parent and restored != restore_dir(work)
    (restored / "commits").mkdir(parents=True)
    (restored / "commits" / "7").write_text("v1\n{}")
    inode = (restored / "commits" / "7").stat().st_ino
    replace_with(work, restored)
    assert latest_batch(work, "commits") == 7 and query_id(work) == ""
    assert (work / "commits" / "7").stat().st_ino == inode  # renamed, not copied
    assert not restored.exists()
