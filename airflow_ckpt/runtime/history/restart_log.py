"""The restart strategies' failure log, kept in the job's history so it spans both levels.

A job can fail at two levels: a streaming query dies inside a live driver (the runtime
restarts it in-process) or the driver itself dies (the Airflow supervisor resubmits it).
Both levels apply the *same* restart strategy, and the strategy's state (failure-rate
window, exponential backoff, attempts used) must survive driver deaths and Airflow worker
restarts. So the state is not kept in memory: every decision is appended to the job's
history as a ``RESTART`` event carrying ``strategy_state``, and every new decision starts
from the newest such event of the same supervision.

**Supervision scope.** One supervision is identified by ``run_id`` (the operator passes
``<dag_id>/<run_id>/<task_id>[/<map_index>]``; Airflow task retries of the same run keep
it). The state of a supervision is the ``strategy_state`` of its newest ``RESTART``
event, unless another event bounds the supervision: any ``JOB_SUBMITTED`` /
``JOB_STARTED`` / ``FAILURE`` / ``RESTART`` event of a *different* run id, or a terminal
event (``JOB_FINISHED`` / ``JOB_STOPPED`` / ``JOB_FAILED``) of another run or of none
(one driver per job runs at a time, so a foreign run's event means ours ended), and the
run's own first submission (``JOB_SUBMITTED`` attempt 1), which starts it.

A terminal event of *this* run is no boundary: it ends the submission it follows
(:attr:`RunState.attempt_end`), and what it means is decided by its place in the
history, not by when a reader saw it. A ``JOB_FINISHED`` whose write landed late (its
driver gave up on the answer and died) sits after the run's newest ``JOB_SUBMITTED``
like a prompt one, so a supervisor that declared the driver dead still sees that the
job finished; the run's ``FAILURE`` / ``RESTART`` events above it never reset the
strategy's window or the attempt counter. A cleared task that runs again after its job
had finished or failed (same run id) sees the terminal event after the newest
submission and starts at attempt 1 (:meth:`RestartLog.next_attempt`); its first
submission then starts a fresh strategy. A task retry after a worker death continues
the window and backoff.

**Cost.** The first read scans the history backwards from the newest event and stops at
the boundary above, reading only the raw tail and the ``events`` segments (never the
compacted checkpoint statistics); later reads list with ``StartAfter`` the newest key
seen and fetch only what was appended or compacted since, so a long healthy run does not
make each failure re-read the history.

**Exact under any clocks and any interleaving.** History keys are sequence numbers (see
:mod:`airflow_ckpt.runtime.history.journal`), so the cursor never skips an event, whatever the
clocks of the driver's and the supervisor's hosts. And a decision is appended with
:meth:`~airflow_ckpt.runtime.history.journal.JobHistory.append_if_head`: only on top of exactly the
history it was computed from. When anything was appended meanwhile (another decider: an
orphaned driver and the supervisor, say) the decision is computed again on the new
events, so every recorded failure is counted by exactly one decision, in one order.

Nothing here imports Airflow: the runtime uses this module inside the Spark driver.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_ckpt.errors import AirflowCkptError, HistoryMovedError, MetadataError
from airflow_ckpt.restart import RestartDecision, RestartStrategy, restart_strategy_from_params
from airflow_ckpt.runtime.history.events import (
    FAILURE,
    JOB_SUBMITTED,
    RESTART,
    RESTORED,
    RUN_EVENTS,
    TERMINAL_EVENTS,
    HistoryEvent,
    seq_of_key,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.interleave import RESTART_BEFORE_DECISION, point

log = logging.getLogger(__name__)

Level = Literal["query", "driver"]
LEVELS: tuple[str, ...] = ("query", "driver")
#: decisions in a row that may meet a moved history before recording gives up
_DECIDE_ATTEMPTS = 100



@dataclass(slots=True)
class RunState:
    """What the history says about the current supervision of ``run_id``.

    ``last_restart`` is the payload of the newest ``RESTART`` event of the run (None
    when the run has not failed yet); ``last_submit_attempt`` is the ``attempt`` of its
    newest ``JOB_SUBMITTED`` event (0 before the first submit); ``restarts`` and
    ``failures`` are the run's events, oldest first, as far as they were read.
    ``attempt_end`` is the run's terminal event newer than its newest ``JOB_SUBMITTED``:
    how the newest submission ended (None while none did), by history order.
    Read going forward only (events appended since the first read): ``restored`` (the
    job's ``RESTORED`` events, which carry no run id).
    """

    last_restart: dict[str, Any] | None = None
    last_submit_attempt: int = 0
    restarts: list[HistoryEvent] = field(default_factory=list)
    failures: list[HistoryEvent] = field(default_factory=list)
    restored: list[HistoryEvent] = field(default_factory=list)
    attempt_end: HistoryEvent | None = None

    @property
    def in_process_gave_up(self) -> str | None:
        """The cause, if the newest decision is the runtime's in-process (query level)
        strategy declining a restart: that failure is counted already and final."""
        last = self.last_restart
        if last is not None and last.get("level") == "query" and not last.get("restart"):
            return str(last.get("cause") or "")
        return None


class RestartLog:
    """Records failures of one supervised run and decides, via the restart strategy, what next.

    :param history: the job's history
    :param params: restart strategy params (Flink option names); validated here, so a bad
        key raises :class:`~airflow_ckpt.errors.ConfigError` at construction
    :param run_id: the supervision the failures belong to (see the module docstring)
    """

    def __init__(self, history: JobHistory, params: Mapping[str, Any], run_id: str) -> None:
        self.history = history
        self.params = dict(params)
        self.run_id = run_id
        # validate now (raises ConfigError naming every bad key) and remember the identity
        template = restart_strategy_from_params(self.params)
        self.strategy_name: str = template.name
        self.strategy_options: dict[str, Any] = _jsonable(template.options())
        self._state = RunState()
        self._cursor: str | None = None  # newest key folded into _state; None: never read

    # ------------------------------------------------------------------ reading

    def refresh(self) -> RunState:
        """Bring the run state up to date with the history and return it."""
        if self._cursor is None:
            self._state, self._cursor = self._scan_backwards()
        else:
            events, self._cursor = self.history.events_after(self._cursor)
            for event in events:
                self._fold(event)
        return self._state

    def _scan_backwards(self) -> tuple[RunState, str | None]:
        """Newest-first until the boundary of this supervision (see module docstring).

        Only run and terminal events can matter, so compacted checkpoint statistics
        are never read. Returns the state and the cursor for later reads."""
        found, listing = self.history.newest_until(
            lambda e: self._ends_supervision(e) or self._first_submit(e),
            RUN_EVENTS | TERMINAL_EVENTS,
        )
        if found and self._ends_supervision(found[-1]):
            found.pop()
        state = RunState()
        for event in reversed(found):
            self._fold_into(state, event)
        return state, listing.newest_key or ""  # "": read, nothing yet

    def _first_submit(self, event: HistoryEvent) -> bool:
        """The first submit of this run: nothing older belongs to it."""
        return event.type == JOB_SUBMITTED and event.data.get("run_id") == self.run_id \
            and int(event.data.get("attempt") or 0) <= 1

    def _ends_supervision(self, event: HistoryEvent) -> bool:
        """Another run's event (a terminal event without a run id counts as another's)."""
        run = event.data.get("run_id")
        if event.type in TERMINAL_EVENTS:
            return run != self.run_id
        return event.type in RUN_EVENTS and run is not None and run != self.run_id

    def _fold(self, event: HistoryEvent) -> None:
        # Going forward, a foreign run's event ends ours and our own first submission
        # starts a new one (a cleared task, same run id).
        run = event.data.get("run_id")
        if event.type in RUN_EVENTS and run is not None and run != self.run_id:
            self._state = RunState()
        elif self._first_submit(event):
            self._state = RunState(restored=self._state.restored)
            self._fold_into(self._state, event)
        elif event.type == RESTORED:
            self._state.restored.append(event)
        else:
            self._fold_into(self._state, event)

    def _fold_into(self, state: RunState, event: HistoryEvent) -> None:
        if event.data.get("run_id") != self.run_id:
            return
        if event.type in TERMINAL_EVENTS:
            state.attempt_end = event
        elif event.type == RESTART:
            state.last_restart = event.data
            state.restarts.append(event)
        elif event.type == FAILURE:
            state.failures.append(event)
        elif event.type == JOB_SUBMITTED:
            state.attempt_end = None
            state.last_submit_attempt = max(
                state.last_submit_attempt, int(event.data.get("attempt") or 0)
            )

    # ------------------------------------------------------------------ deciding

    def strategy(self) -> RestartStrategy:
        """The strategy with the state of the newest decision of this supervision."""
        last = self.refresh().last_restart
        if last is None:
            return restart_strategy_from_params(self.params)
        if last.get("strategy") != self.strategy_name or \
                _jsonable(last.get("options")) != self.strategy_options:
            log.warning(
                "restart strategy changed within run %s (%s %s -> %s %s): starting it fresh",
                self.run_id, last.get("strategy"), last.get("options"),
                self.strategy_name, self.strategy_options,
            )
            return restart_strategy_from_params(self.params)
        try:
            return restart_strategy_from_params(self.params, state=last.get("strategy_state"))
        except (AirflowCkptError, ValueError, TypeError, KeyError) as exc:
            log.warning("could not restore the restart strategy state (%s): starting it fresh", exc)
            return restart_strategy_from_params(self.params)

    def record_failure(
        self, level: Level, cause: str, now: float | None = None, **details: Any
    ) -> RestartDecision:
        """Append ``FAILURE`` and ``RESTART`` events and return the strategy's decision.

        ``details`` go into the ``FAILURE`` payload (e.g. ``exit_code``, ``error_lines``,
        ``attempt``). The ``RESTART`` payload has ``level``, ``run_id``, ``strategy``,
        ``options``, ``restart``, ``delay_s``, ``attempt``, ``strategy_state``, ``cause``
        and ``failure_ts``. ``now`` (epoch seconds) defaults to the time the storage
        stored the ``FAILURE`` event (:meth:`JobHistory.stored_ts`): the strategies' time
        windows (failure rate, backoff reset) then compare times of one clock, whichever
        host recorded each failure.
        """
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        failure = self.history.append(
            FAILURE, level=level, run_id=self.run_id, cause=cause, **details
        )
        now = self.history.stored_ts(failure) if now is None else now
        for _ in range(_DECIDE_ATTEMPTS):
            strategy = self.strategy()  # refreshes: the state of every event up to the cursor
            decision = strategy.on_failure(now)
            point(RESTART_BEFORE_DECISION)  # another decider may append meanwhile
            try:
                self.history.append_if_head(  # folded into the state by the next refresh
                    self._head(),
                    RESTART,
                    level=level,
                    run_id=self.run_id,
                    strategy=strategy.name,
                    options=_jsonable(strategy.options()),
                    restart=bool(decision.restart),
                    delay_s=float(decision.delay_s),
                    attempt=int(decision.attempt),
                    strategy_state=strategy.state_dict(),
                    cause=cause,
                    failure_ts=now,
                )
                break
            except HistoryMovedError:
                continue  # appended meanwhile: decide again on top of it
        else:
            raise MetadataError(
                f"could not record the restart decision of run {self.run_id}: the history "
                f"of {self.history.layout.job} moved {_DECIDE_ATTEMPTS} times while deciding")
        log.info(
            "%s failure of run %s (%s): strategy %s says %s (attempt %d, delay %.3f s)",
            level, self.run_id, cause, strategy.describe(),
            "restart" if decision.restart else "no restart", decision.attempt, decision.delay_s,
        )
        return decision

    def _head(self) -> int:
        """The number of the newest event the state was folded from (0: none)."""
        return seq_of_key(self._cursor) if self._cursor else 0

    def restarts(self) -> list[HistoryEvent]:
        """This supervision's ``RESTART`` events, oldest first."""
        return list(self.refresh().restarts)

    def failures(self) -> list[HistoryEvent]:
        """This supervision's ``FAILURE`` events, oldest first."""
        return list(self.refresh().failures)

    def last_submit_attempt(self) -> int:
        """The newest ``JOB_SUBMITTED`` attempt of this supervision (0 if none)."""
        return self.refresh().last_submit_attempt

    def next_attempt(self) -> int:
        """The attempt number of the run's next submission: 1 when its newest submission
        ended with a terminal event (the run ended: a cleared task starts it again),
        else the newest attempt + 1 (a task retry continues the supervision)."""
        state = self.refresh()
        return 1 if state.attempt_end is not None else state.last_submit_attempt + 1


def format_restart_history(events: list[HistoryEvent]) -> str:
    """One line per ``RESTART`` event, for logs and error messages."""
    lines = []
    for event in events:
        data = event.data
        verdict = f"restart after {data.get('delay_s', 0):.3f} s" if data.get("restart") \
            else "no restart"
        lines.append(
            f"  {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(event.ts))} "
            f"[{data.get('level')}] attempt {data.get('attempt')}: {verdict} "
            f"({data.get('strategy')}) - {data.get('cause')}"
        )
    return "\n".join(lines) if lines else "  (none)"


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON so in-memory options compare equal to stored ones."""
    return json.loads(json.dumps(value, default=str))
