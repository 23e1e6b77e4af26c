"""``airflow-ckpt check-storage`` against the tests' S3 server, a ``file://`` root and an
endpoint that ignores ``If-None-Match``: the verdict printed for each property."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from airflow_ckpt.cli import main
from airflow_ckpt.runtime.storage.check import SCRATCH_PREFIX, CheckVerdict, Property
from airflow_ckpt.testing import S3Endpoint, local_s3_server

pytestmark = pytest.mark.integration

#: what each server of ours answers (docs/storage.md's table); an external server is
#: only required to pass
EXPECTED: dict[str, dict[Property, CheckVerdict]] = {
    "moto": {p: CheckVerdict.OK for p in Property},
    "seaweedfs": {**{p: CheckVerdict.OK for p in Property},
                  Property.LIST_AFTER_DELETE: CheckVerdict.WARN},
    "file": {**{p: CheckVerdict.OK for p in Property},
             Property.MULTIPART_CREATE_ONLY: CheckVerdict.NOT_APPLICABLE},
}


def _check(*argv: str, capsys: pytest.CaptureFixture[str]
           ) -> tuple[int, dict[Property, CheckVerdict], str, str]:
    """Run the command; (exit code, the verdict per property, stderr, stdout)."""
    out = io.StringIO()
    code = main([*argv, "check-storage"], out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("checking ")
    verdicts = {}
    for line in lines[1:]:
        verdict, rest = line.split(None, 1)
        prop = next(p for p in Property if rest.startswith(p.value + " "))
        verdicts[prop] = CheckVerdict(verdict)
    assert list(verdicts) == list(Property)  # one line per property, in order
    return code, verdicts, capsys.readouterr().err, out.getvalue()


def test_check_storage_on_the_tests_s3_server(
    s3_endpoint: S3Endpoint, s3_uri: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in s3_endpoint.env().items():
        monkeypatch.setenv(name, value)
    code, verdicts, err, _ = _check("--storage", s3_uri, capsys=capsys)
    assert code == 0, err
    if s3_endpoint.server in EXPECTED:
        assert verdicts == EXPECTED[s3_endpoint.server]
    storage = s3_endpoint.storage(s3_uri)
    assert storage.list() == []  # the scratch prefix is gone
    assert not [u for u in storage.list_dirs("") if u.startswith(SCRATCH_PREFIX)]


def test_check_storage_on_a_file_root(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, verdicts, err, _ = _check("--storage", tmp_path.as_uri(), capsys=capsys)
    assert code == 0, err
    assert verdicts == EXPECTED["file"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.moto_only("a second, lax moto server shares the first one's state")
def test_check_storage_fails_naming_an_ignored_if_none_match(
    s3_bucket: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    with local_s3_server(honour_if_none_match=False) as lax:
        for name, value in lax.env().items():
            monkeypatch.setenv(name, value)
        code, verdicts, err, out = _check("--storage", f"s3://{s3_bucket}/lax", capsys=capsys)
    assert code == 1
    assert verdicts[Property.CREATE_ONLY] is CheckVerdict.MISSING
    assert [p for p, v in verdicts.items() if v is CheckVerdict.MISSING] == [Property.CREATE_ONLY]
    assert "lacks what the runtime's guarantees rest on: create-only write" in err
    create_only = next(line for line in out.splitlines() if "create-only write" in line)
    assert "ignores 'If-None-Match: *'" in create_only
