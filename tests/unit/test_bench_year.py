"""bench.year builds what the runtime reads: savepoint manifests and control requests
and answers that parse, ids below the lease record's reserved range."""

from __future__ import annotations

import pytest

from airflow_ckpt.runtime.checkpoint.metadata import parse_manifest
from airflow_ckpt.runtime.control.channel import ControlRequest, parse_request
from bench.year import JOB, parse_args, year_objects, year_server


def test_the_year_objects_are_what_the_runtime_writes() -> None:
    objects = dict(year_objects(JOB, savepoints=3, requests=2, first_id=5000, now=1e9))
    manifests = [parse_manifest(v, where=k) for k, v in objects.items() if k.endswith("_metadata")]
    assert len(manifests) == 3 and all(m.is_savepoint and m.checkpoint_id < 5000
                                       for m in manifests)
    requests = [k for k in objects if k.endswith(".json") and not k.endswith(".result.json")]
    assert len(requests) == 2 and len(objects) == 3 + 4
    for key in requests:
        request_id = key.rsplit("/", 1)[1][:-len(".json")]
        assert isinstance(parse_request(objects[key], key, request_id, 1e9), ControlRequest)


def test_the_server_is_moto_unless_seaweedfs_is_chosen() -> None:
    assert parse_args([]).server == "moto"
    assert parse_args(["--quick", "--server", "seaweedfs"]).server == "seaweedfs"
    with pytest.raises(SystemExit):
        parse_args(["--server", "minio"])
    with pytest.raises(ValueError, match="minio"), year_server("minio"):
        pass


def test_repeats_default_to_three_and_are_validated() -> None:
    assert parse_args([]).repeats == 3
    with pytest.raises(SystemExit):
        parse_args(["--repeats", "0"])
