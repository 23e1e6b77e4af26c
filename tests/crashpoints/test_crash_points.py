"""Crash before and after storage mutations of a scripted driver life, restart with
``restore=latest``, check the guarantees (airflow_ckpt.testing.crashpoints).

``make test`` explores a sample (every 7th mutation, before and after);
``make crash-points`` explores every point.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from airflow_ckpt.testing import crashpoints as cp

EVERY = int(os.environ.get("CRASH_POINTS_EVERY", "7"))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    base = tmp_path_factory.mktemp("crashpoints")
    root = cp.prepare(base)
    return root, cp.count_mutations(root, base)


def test_the_scripted_life_covers_every_kind_of_mutation(
    prepared: tuple[Path, list[str]],
) -> None:
    _, log = prepared
    text = "\n".join(log)
    for what in ("create crash/lease/", "upload crash/shared/", "create crash/chk-",
                 "delete crash/chk-", "delete crash/shared/", "upload crash/savepoints/sp-mid/",
                 "create crash/savepoints/sp-stop/_metadata", "copy _out/crash/_pending/",
                 "create _out/crash/_pending/", "swap _out/crash/_txn/",
                 "create _out/crash/_committed/", ".result.json"):
        verb, _, key = what.partition(" ")
        # a batched delete names its keys in one mutation (markers first: issue 26)
        assert what in text or (verb == "delete" and re.search(
            rf"^delete (.+ )?{re.escape(key)}", text, re.M)), \
            f"the scenario never does: {what}"


def test_every_sampled_crash_point_keeps_the_guarantees(
    prepared: tuple[Path, list[str]], tmp_path: Path
) -> None:
    root, log = prepared
    explored = cp.points(len(log), EVERY)
    failures = {}
    for point in explored:
        problems = cp.explore(root, tmp_path, point)
        if problems:
            failures[f"{point.moment} {point.k}: {log[point.k - 1]}"] = problems
    print(f"crash points explored: {len(explored)} of {2 * len(log)}")
    assert not failures, failures
