"""Two lease stories of the job world (issue 25, the lease group, session 16): what a
driver does with a judgement a successor made stale while its host was suspended.
Each is drawn per seed from a generator of its own (other seeds keep their schedules)
and played at the runtime's named points, with host suspensions only (a suspended
host's monotonic clock stands still: its lease gate passes when it wakes, so safety
must come from the storage conditions).

:class:`DeposedMarker` (``coordinator.before_metadata``): a holder whose next completion
makes its retention subsume a checkpoint is suspended right before its marker PUT until
a successor's takeover is final (its adoption made without that marker); the successor
starts its run only after the holder woke. The marker lands late: it never counts, and
the deposed holder must not act on it (its confirmation after the marker sees the newer
epoch), above all not subsume what the successor adopted (``job-retention``).

:class:`StaleClaim` (``lease.before_claim_put``): a claimant that judged epoch ``E``
free and rejudged it (no newer epoch listed) is suspended before its claim PUT until a
successor claimed ``E+1``, took over and reached a completion marker; that successor is
then suspended before its marker until a newer epoch's takeover is final. The claimant
wakes with a judgement a live holder made stale: its claim of ``E+1`` must fail (never a
claim of ``max(listed) + 1`` over the epoch it did not judge, whose reserved ids and
adoptions it never read); whoever takes the silent successor over later judges its
record, so the successor's late marker (an id it reserved) never counts.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_ckpt.runtime.checkpoint.pending import PendingState
from airflow_ckpt.runtime.lease.record import lease_epochs, read_epoch
from airflow_ckpt.testing.sim.scheduler import Actor

if TYPE_CHECKING:
    from airflow_ckpt.testing.sim.job import JobWorld, SimJob


def _suspend_until_taken_over(world: JobWorld, epoch: int, seconds: float, what: str,
                              more: Callable[[], bool] = lambda: True) -> None:
    """Suspend the calling actor's host, ``seconds`` at a time, until a lease record
    newer than ``epoch`` is stored with its takeover over, or was stored at two looks
    in a row (its claimant died or lost its claim's answer: it stays behind), or
    ``more()`` is false, or 15 lease ttls passed."""
    sched = world.scheduler
    deadline, seen = sched.now + 15 * world.ttl_s, False
    while sched.now < deadline and more():
        records = [read_epoch(world.oracle, world.job, e)
                   for e in lease_epochs(world.oracle, world.job) if e > epoch]
        if (seen and records) or any(r is not None and r.adoption_final for r in records):
            return
        seen = bool(records)
        sched.suspend(seconds, what)


def _completing_a_checkpoint(job: SimJob | None) -> bool:
    """Whether ``job``'s coordinator is writing a checkpoint's marker (not a
    savepoint's: only a checkpoint's completion subsumes)."""
    coordinator = job.coordinator if job is not None else None
    return coordinator is not None and any(
        p.state is PendingState.COMPLETING and not p.is_savepoint
        for p in coordinator._pending)


class DeposedMarker:
    """Seed 254's story made common (see the module doc)."""

    def __init__(self, seed: int, world: JobWorld) -> None:
        self.world = world
        self.rng = random.Random(seed ^ 0xDE05)
        self.drawn = self.rng.random() < 0.3
        self.host: str | None = None  # the suspended holder's host
        self.woke: float | None = None  # when it woke (true time)

    @property
    def pending(self) -> bool:
        """Drawn and not played yet: the world's other suspensions before a marker wait
        (they would depose the first holders before any checkpoint counts)."""
        return self.drawn and self.host is None

    def before_marker(self, actor: Actor) -> bool:
        """At ``coordinator.before_metadata``: the newest holder, retaining
        ``num-retained`` counted checkpoints already (its completion subsumes one), is
        suspended until a successor's takeover is final (at most 15 lease ttls); once
        per seed. Returns whether it was."""
        world, sched = self.world, self.world.scheduler
        job = world._running.get(actor) or world._running.get(actor.parent)  # type: ignore[arg-type]
        record = job.lease.record if job is not None else None
        if not self.drawn or self.host is not None or world.recovering or record is None \
                or record.epoch != max(world._epochs_seen, default=0) \
                or len(world._counted_before) < max(world.num_retained, 1) \
                or not _completing_a_checkpoint(job) or not world._other_drivers(actor):
            return False
        self.host = actor.host.name
        world.coverage["deposed-marker-suspended"] += 1
        _suspend_until_taken_over(world, record.epoch, world.heartbeat_s,
                                  "a completion marker (until a successor took over)")
        self.woke = sched.now
        return True

    def before_run(self, actor: Actor) -> None:
        """A new holder's run starts only just after the suspended holder woke (its
        marker lands before the successor's first checkpoint: what it subsumes is
        still what the successor adopted)."""
        world, sched = self.world, self.world.scheduler
        if self.host is None or actor.host.name == self.host or world.recovering:
            return
        deadline = sched.now + 16 * world.ttl_s
        waited = False
        while self.woke is None and sched.now < deadline:
            waited = True
            sched.sleep(0.5)
        if waited:
            world.coverage["deposed-marker-successor-waited"] += 1
            sched.sleep(self.rng.uniform(0.5, 2 * world.heartbeat_s))


class StaleClaim:
    """A claimant waking with a judgement a live successor made stale (see the module
    doc)."""

    def __init__(self, seed: int, world: JobWorld) -> None:
        self.world = world
        self.drawn = random.Random(seed ^ 0xC1A7).random() < 0.3
        self.claimant: Actor | None = None
        self.judged = 0  # the epoch the claimant judged free
        self.successor: int | None = None  # the successor's epoch, once at its marker

    def before_claim_put(self) -> None:
        """At ``lease.before_claim_put``: once per seed, a driver's claimant (others
        living) is suspended until a holder newer than the epoch it judged reached a
        completion marker (at most 15 lease ttls)."""
        world, sched = self.world, self.world.scheduler
        actor = sched.current()
        if not self.drawn or self.claimant is not None or actor is None or world.recovering \
                or not actor.name.startswith("driver") or not world._other_drivers(actor):
            return
        judged = max(lease_epochs(world.oracle, world.job), default=0)
        if not judged:
            return  # a first claim: nobody holds an epoch to go stale
        self.claimant, self.judged = actor, judged
        world.coverage["stale-claim-suspended"] += 1
        deadline = sched.now + 15 * world.ttl_s
        while self.successor is None and sched.now < deadline:
            sched.suspend(world.heartbeat_s, "its claim (judged the lease free)")

    def before_marker(self, actor: Actor) -> bool:
        """At ``coordinator.before_metadata``: the first holder newer than the stale
        claimant's judgement is suspended (the claimant wakes) until a newer epoch's
        takeover is final, the claimant's life ended, or 4 lease ttls passed. Returns
        whether it was."""
        world = self.world
        job = world._running.get(actor) or world._running.get(actor.parent)  # type: ignore[arg-type]
        record = job.lease.record if job is not None else None
        if self.claimant is None or self.successor is not None or record is None \
                or record.epoch <= self.judged or actor.host.name == self.claimant.host.name:
            return False
        self.successor = record.epoch
        world.coverage["stale-claim-successor-suspended"] += 1
        claimant = world._running.get(self.claimant)
        _suspend_until_taken_over(world, record.epoch, world.heartbeat_s,
                                  "a completion marker (a stale claimant wakes)",
                                  lambda: claimant is not None and claimant.alive)
        return True
