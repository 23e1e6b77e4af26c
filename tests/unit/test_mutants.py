"""The mutation score's harness (:mod:`airflow_ckpt.testing.mutants`): every mutant still
finds its text exactly once (none has rotted into a no-op), a mutant is planted in a
temporary copy only, a planted bug the simulation catches is reported killed, and a
mutant that changes nothing survives."""

from __future__ import annotations

import pytest

from airflow_ckpt.testing import mutants
from airflow_ckpt.testing.mutants import (
    MUTANTS,
    PACKAGE,
    Mutant,
    MutantRotError,
    check,
    judge,
)


def test_every_mutant_finds_its_text_exactly_once() -> None:
    check()
    assert len(MUTANTS) >= 40
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert all(m.old != m.new for m in MUTANTS)
    # an equivalent mutant is the exception, with its argument
    assert sum(bool(m.equivalent) for m in MUTANTS) <= 5


def test_a_mutant_whose_text_moved_fails_loudly() -> None:
    rotten = Mutant("rotten", "runtime/storage/fenced.py", "no such text", "x", "none")
    with pytest.raises(MutantRotError, match="occurs 0 times"):
        check([rotten])
    twice = Mutant("twice", "runtime/storage/fenced.py", "self.gate()", "pass", "none")
    with pytest.raises(MutantRotError, match="times"):
        check([twice])


def test_a_planted_bug_is_killed_and_the_package_is_left_alone() -> None:
    mutant = next(m for m in MUTANTS if m.name == "gate-never-expires")
    before = (PACKAGE / mutant.file).read_text()
    verdict = judge(mutant, seeds=200)
    assert verdict.killed, verdict.line()
    assert "[" in verdict.how and verdict.seeds >= 1
    assert (PACKAGE / mutant.file).read_text() == before


def test_a_mutant_that_changes_nothing_survives() -> None:
    same = Mutant("comment", "runtime/storage/fenced.py",
                  "self.gate()\n        self.inner.copy(src_key, dst_key)",
                  "self.gate()  # planted: no change\n        self.inner.copy(src_key, dst_key)",
                  "nothing")
    verdict = judge(same, seeds=3)
    assert not verdict.killed and verdict.seeds == 3, verdict.line()


def test_equivalent_mutants_are_printed_with_their_argument_and_left_out_of_the_score(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    judged: list[str] = []

    def run(chosen: list[Mutant], seeds: int, jobs: int) -> list[object]:
        judged.extend(m.name for m in chosen)
        return []

    monkeypatch.setattr(mutants, "run", run)
    assert mutants.main([]) == 0
    equivalent = {m.name for m in MUTANTS if m.equivalent}
    assert equivalent and not equivalent & set(judged)
    assert len(judged) == len(MUTANTS) - len(equivalent)
    out = capsys.readouterr().out
    assert all(f"EQUIVALENT {name} (not run): " in out for name in equivalent)
    judged.clear()
    mutants.main(["--equivalent"])
    assert equivalent <= set(judged)
