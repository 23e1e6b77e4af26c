"""Damaging a completed checkpoint on purpose, so that restore must fall back past it."""

from __future__ import annotations

import base64
from collections.abc import Collection
from dataclasses import replace

from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout


def damage_one_file(storage: CheckpointStorage, manifest: Manifest,
                    spare: Collection[str] = ()) -> None:
    """Give one file of ``manifest`` other bytes of the same size, so that its
    verification fails: an object of its own whose key is not in ``spare`` (keys other
    checkpoints reference) if it has one, else one of its inline entries (the marker is
    rewritten with that entry's bytes changed and its recorded hash kept)."""
    layout = JobLayout(manifest.job)
    stored = [f for f in manifest.files if not f.is_inline and f.key not in spare]
    if stored:
        storage.put_bytes(layout.root + stored[0].key, b"x" * stored[0].size)
        return
    victim = next(f for f in manifest.files if f.is_inline)
    changed = replace(victim, inline=base64.b64encode(b"x" * victim.size).decode())
    damaged = replace(manifest, files=tuple(changed if f is victim else f
                                            for f in manifest.files))
    storage.put_bytes(layout.checkpoint_metadata(manifest.checkpoint_id), damaged.to_json())
