"""The benchmarks' measuring tools on a real endpoint: moto over HTTPS (a certificate
made for the run, trusted only inside the block) and bench.year's per-call timer."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from botocore.exceptions import SSLError

from airflow_ckpt.testing import local_s3_server
from airflow_ckpt.testing.s3_server import s3_server_process
from bench.year import RequestTimer


def test_https_server_trusted_in_the_block_and_puts_unsigned_trailer_payloads() -> None:
    before = os.environ.get("AWS_CA_BUNDLE")
    with s3_server_process(tls=True) as server:
        endpoint = server.endpoint
        assert endpoint.url.startswith("https://")
        endpoint.create_bucket("tls-bench")
        storage = endpoint.storage("s3://tls-bench/root")
        storage.put_bytes("a/b", b"x" * 1000)
        assert storage.get_bytes("a/b") == b"x" * 1000
        storage.close()
        client = endpoint.client()
        sent: list[dict[str, Any]] = []
        client.meta.events.register("before-send.s3",
                                    lambda request, **_: sent.append(dict(request.headers)))
        client.put_object(Bucket="tls-bench", Key="c", Body=io.BytesIO(b"y" * 100))
        # botocore reads such a body once: no payload hash before the send
        assert sent[-1]["X-Amz-Content-SHA256"] == b"STREAMING-UNSIGNED-PAYLOAD-TRAILER"
        client.close()
        os.environ.pop("AWS_CA_BUNDLE")  # the default trust store: the server is refused
        try:
            with pytest.raises(SSLError):
                endpoint.client().list_buckets()
        finally:
            os.environ["AWS_CA_BUNDLE"] = "restored-by-the-block"
    assert os.environ.get("AWS_CA_BUNDLE") == before


def test_the_timer_files_each_call_under_its_area_and_counts_listed_keys() -> None:
    with local_s3_server() as endpoint:
        endpoint.create_bucket("timer-bench")
        storage = endpoint.storage("s3://timer-bench/root")
        for n in range(3):
            storage.put_bytes(f"orders/control/{n}.json", b"{}")
        storage.put_bytes("orders/history/segments/checkpoints/x.jsonl.gz", b"")
        timer = RequestTimer()
        timer.attach(storage)
        storage.list("orders/control/")
        storage.get_bytes("orders/control/0.json")
        storage.get_bytes("orders/history/segments/checkpoints/x.jsonl.gz")
        seconds, listed = timer.snapshot()
        storage.close()
    assert set(seconds) == {"control LIST", "control GET", "segment GET"}
    assert all(s > 0 for s in seconds.values())
    assert listed == {"control LIST": 3}
