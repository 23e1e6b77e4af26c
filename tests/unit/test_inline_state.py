"""Inline files (``state.storage.fs.memory-threshold``): small files travel in the
manifest, restore writes them from it and verifies them, and the manifest format stays
readable across versions."""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_ckpt.errors import ConfigError, CorruptCheckpointError, UnsupportedSchemaVersionError
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.digests import DigestCache
from airflow_ckpt.runtime.checkpoint.executors import InlineExecutor
from airflow_ckpt.runtime.checkpoint.metadata import Manifest, parse_manifest
from airflow_ckpt.runtime.checkpoint.store import SharedFileRegistry
from airflow_ckpt.runtime.checkpoint.upload import UploadTarget, upload_snapshot
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.layout import JobLayout
from tests.fixtures.snapshots import make_manifest
from tests.unit.test_file_merging import CountingStorage, _snapshot

JOB = "inline"
L = JobLayout(JOB)
FILES = {"offsets/3": b"v1\n{}\n" + b"o" * 50, "commits/3": b"v1\n{}",
         "state/0/0/4.delta": b"d" * 3000, "state/0/1/4.delta": b"",
         "state/0/1/big.sst": bytes(range(256)) * 200}  # 51,200 bytes: stays an object


@pytest.fixture
def storage(tmp_path: Path) -> CountingStorage:
    return CountingStorage(open_storage((tmp_path / "s").as_uri()))


def _checkpoint(storage: CheckpointStorage, tmp_path: Path, threshold: int) -> Manifest:
    """Upload ``FILES`` as checkpoint 1 (full, merging on) and write its marker."""
    config = CheckpointConfig.from_dict({"state.storage.fs.memory-threshold": threshold,
                                         "file-merging.max-file-size": "64 kb"})
    result = upload_snapshot(
        storage, L, _snapshot(tmp_path, f"s{threshold}", FILES),
        UploadTarget.checkpoint(1, config, None), executor=InlineExecutor(),
        digests=DigestCache(), shared=SharedFileRegistry(), deadline=time.monotonic() + 60,
        on_ack=lambda _s: None, cancelled=threading.Event())
    manifest = make_manifest(JOB, 1, files=result.files, batch_id=3)
    storage.put_bytes(L.checkpoint_metadata(1), manifest.to_json())
    return parse_manifest(storage.get_bytes(L.checkpoint_metadata(1)))


def _restored(storage: CheckpointStorage, manifest: Manifest, dest: Path) -> dict[str, bytes]:
    out = materialize(storage, manifest, L.root, dest, only_needed=False)
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_small_files_travel_in_the_manifest_and_restore_byte_for_byte(
        storage: CountingStorage, tmp_path: Path) -> None:
    manifest = _checkpoint(storage, tmp_path, 20 << 10)
    inline = {f.path for f in manifest.files if f.is_inline}
    assert inline == set(FILES) - {"state/0/1/big.sst"}
    assert len(storage.writes) == 1  # one object: the file above the threshold
    assert manifest.schema_version == 3
    assert _restored(storage, manifest, tmp_path / "r") == FILES


def test_threshold_0_stores_every_file_as_an_object_in_a_version_2_manifest(
        storage: CountingStorage, tmp_path: Path) -> None:
    manifest = _checkpoint(storage, tmp_path, 0)
    assert not any(f.is_inline for f in manifest.files)
    raw = json.loads(storage.get_bytes(L.checkpoint_metadata(1)))
    assert raw["schema_version"] == 2 and all("inline" not in f for f in raw["files"])
    assert _restored(storage, manifest, tmp_path / "r") == FILES


def test_a_changed_inline_entry_fails_verification(storage: CountingStorage,
                                                   tmp_path: Path) -> None:
    manifest = _checkpoint(storage, tmp_path, 20 << 10)
    victim = next(f for f in manifest.files if f.path == "state/0/0/4.delta")
    changed = replace(victim, inline=base64.b64encode(b"e" * victim.size).decode())
    damaged = replace(manifest, files=tuple(changed if f is victim else f
                                            for f in manifest.files))
    with pytest.raises(CorruptCheckpointError, match=r"state/0/0/4\.delta.*SHA-256"):
        materialize(storage, parse_manifest(damaged.to_json()), L.root, tmp_path / "r",
                    only_needed=False)


def test_manifest_versions_older_and_newer(storage: CountingStorage, tmp_path: Path) -> None:
    """A version 2 manifest (no inline entries) still restores; an inline entry in a
    version 2 manifest, and a newer version, are refused with a clear error."""
    manifest = _checkpoint(storage, tmp_path, 0)
    assert parse_manifest(manifest.to_json()).schema_version == 2
    inline = json.loads(_checkpoint(storage, tmp_path, 20 << 10).to_json())
    inline["schema_version"] = 2
    with pytest.raises(Exception, match=r"'inline'.*schema version 3"):
        parse_manifest(json.dumps(inline).encode())
    inline["schema_version"] = 4
    with pytest.raises(UnsupportedSchemaVersionError, match=r"versions 1, 2, 3.*upgrade"):
        parse_manifest(json.dumps(inline).encode())


def test_the_threshold_is_flinks_option_capped_at_1_mb() -> None:
    assert CheckpointConfig().memory_threshold == 20 << 10
    assert CheckpointConfig.from_dict(
        {"state.storage.fs.memory-threshold": "1 kb"}).memory_threshold == 1024
    with pytest.raises(ConfigError, match="1 mb"):
        CheckpointConfig.from_dict({"state.storage.fs.memory-threshold": "2 mb"})
