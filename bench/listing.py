"""``python -m bench.listing [--deleted N] [--server seaweedfs|moto]``: what entries
deleted from a directory cost a later listing of it (session 17, issue 26).

On one server: a directory that held ``N`` keys, all but the newest 3 deleted (as the
driver's clean-up leaves ``control/`` after a year's backlog drained), against a fresh
directory of 3 keys; each LIST timed in the same loop, alternating (median of
``--calls``), in ``--windows`` windows 20 s apart, and the old directory also listed
with ``StartAfter`` its last deleted key. On SeaweedFS the LIST of the emptied directory
took 3-4x the fresh one's at N = 40,000 and the same at N = 4,000 (README, "A year-old
job root").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.year import SERVERS, year_server

BUCKET = "airflow-ckpt-listing"


def keys(directory: str, n: int) -> list[str]:
    """``n`` request-like keys of ``directory``, in listing order."""
    return [f"{directory}/control/{i:013d}.json" for i in range(n)]


def run(deleted: int, server: str, calls: int, windows: int,
        pause_s: float = 20.0) -> dict[str, Any]:
    """The median LIST seconds of each case per window (see the module doc)."""
    report: dict[str, Any] = {"deleted": deleted, "server": server, "windows": []}
    with year_server(server) as (endpoint, _):
        endpoint.create_bucket(BUCKET)
        client = endpoint.client()
        old, fresh = keys("old", deleted + 3), keys("fresh", 3)
        started = time.perf_counter()
        with ThreadPoolExecutor(10) as pool:
            list(pool.map(lambda k: client.put_object(Bucket=BUCKET, Key=k, Body=b"{}"),
                          old + fresh))
        for i in range(0, deleted, 1000):
            client.delete_objects(Bucket=BUCKET, Delete={
                "Objects": [{"Key": k} for k in old[i:min(i + 1000, deleted)]], "Quiet": True})
        report["build_s"] = round(time.perf_counter() - started, 1)

        def listing(prefix: str, **extra: str) -> Callable[[], object]:
            return lambda: client.list_objects_v2(Bucket=BUCKET, Prefix=prefix, **extra)

        cases = {"fresh": listing("fresh/control/"), "emptied": listing("old/control/"),
                 "emptied, StartAfter": listing("old/control/", StartAfter=old[deleted - 1])}
        for window in range(windows):
            if window:
                time.sleep(pause_s)
            seconds: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(calls):
                for name, fn in cases.items():
                    began = time.perf_counter()
                    fn()
                    seconds[name].append(time.perf_counter() - began)
            report["windows"].append({"loadavg_1m": round(os.getloadavg()[0], 1), **{
                name: round(statistics.median(s) * 1000, 2) for name, s in seconds.items()}})
        client.close()
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.listing",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--deleted", type=int, default=40_000, help="keys deleted before listing")
    p.add_argument("--server", choices=SERVERS, default="seaweedfs")
    p.add_argument("--calls", type=int, default=15, help="LISTs per case and window")
    p.add_argument("--windows", type=int, default=3)
    args = p.parse_args(argv)
    if args.deleted < 1 or args.calls < 1 or args.windows < 1:
        p.error("--deleted, --calls and --windows must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args.deleted, args.server, args.calls, args.windows)
    print(f"LIST of 3 keys on {report['server']}: a fresh directory vs one from which "
          f"{report['deleted']:,} keys were deleted (built in {report['build_s']} s); "
          f"median ms of {args.calls} per window")
    for window in report["windows"]:
        print("  " + "; ".join(f"{k} {v}" for k, v in window.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
