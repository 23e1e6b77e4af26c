"""A deterministic scheduler: actors in threads, one running at a time, seeded choices.

Every actor (a driver, the Airflow supervisor, a compactor, ...) runs its program in its
own thread, but only the holder of the *baton* runs. An actor gives the baton back at
every *yield point* (each storage call, each :meth:`Scheduler.sleep`), and the scheduler
(the caller of :meth:`Scheduler.run`) picks who runs next with its seeded
:class:`random.Random`. Nothing else decides the order, so one seed replays one
schedule exactly: same choices, same storage calls, same trace.

**Time** is virtual. The scheduler keeps the true time ``now``; it moves by a small
seeded step per turn and jumps to the next wake-up when every actor sleeps. Each actor
runs on a :class:`Host` whose wall clock is ``now + skew_s``. The real classes take
their clocks and id sources through their constructors: the simulation passes
:meth:`Scheduler.wall_clock` (the calling actor's host clock), :meth:`Scheduler.monotonic`,
:meth:`Scheduler.sleep` and :meth:`Scheduler.uuid4` (seeded ids), or a
:class:`VirtualTime` / :class:`SeededUuid` where a class takes a clock object. No module's
``time`` or ``uuid`` is patched: code that reads them directly is on the real clock,
so every runtime class the simulation drives takes its clock through its constructor.

**Pauses.** An actor may pause at any yield point (``pause_p``): it keeps its place in
what it was doing (e.g. a write that passed its lease gate) and goes on when it wakes.

**Crashes.** The scheduler may kill an actor at any yield point: :class:`Crash` (a
``BaseException``, which no runtime handler swallows) is raised there, and raised again
at every later yield point of that actor, so its leftover ``finally`` code touches
nothing. A process that dies leaves what it wrote and nothing else.

**Fault sites.** With ``sites`` the scheduler draws the seed's
:class:`~airflow_ckpt.testing.sim.buggify.Swarm` first: pauses, crashes and clock jumps
(a host's wall clock stepping by up to an hour, at ``clock_jump_p`` per turn) then fire
only when the seed enables their site, and :meth:`Scheduler.chance` is how every other
part of the simulation (storage faults, the worlds) asks whether a site fires. Without
``sites`` every chance is a plain draw (the building blocks' own tests).

**Suspensions** (:meth:`Scheduler.suspend`, site ``scheduler.suspend``): a suspended host
(a VM paused by its hypervisor, a laptop lid closed) stops as a whole. None of its actors
is scheduled until the suspension ends: every thread of every process on it, so a lease's
heartbeat thread does not beat while its driver is suspended. Its monotonic clock stands
still meanwhile (Linux's ``CLOCK_MONOTONIC`` does not count a suspend): it reads the same
at the end as at the start, then runs on at its rate, and never goes back (checked at
every reading); its actors' timers stand still too (a sleep that had 3 s left wakes 3 s
after the host does). Its wall clock runs on (true time plus skew): on waking it is
right again. Requests its actors had in flight are the network's and land as they would.
"""

from __future__ import annotations

import random
import threading
import uuid as real_uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_ckpt.testing.sim.buggify import (
    SCHED_CLOCK_JUMP,
    SCHED_CRASH,
    SCHED_PAUSE,
    SCHED_SUSPEND,
    Swarm,
)

#: how long the scheduler waits for an actor to give the baton back before it calls the
#: simulation stuck (an actor blocked on something that is no yield point)
BATON_TIMEOUT_S = 60.0
#: the time steps (seconds) the true clock moves by between two turns
TICKS = (0.0, 0.001, 0.005, 0.02, 0.1, 0.3)
#: how far a host's wall clock steps when a clock jump fires (seconds)
JUMPS = (-3600.0, -30.0, -0.5, 0.5, 30.0, 3600.0)


class Crash(BaseException):
    """The actor's process died at this yield point."""


class SimulationStuck(RuntimeError):
    """An actor kept the baton without reaching a yield point."""


@dataclass(frozen=True, slots=True)
class Host:
    """A machine: its name and how far its wall clock is ahead of true time."""

    name: str
    skew_s: float = 0.0
    #: how fast its monotonic clock (and its timers) run against true time: a drifting
    #: clock, which no guarantee may rest on (1.0: the true rate)
    rate: float = 1.0


@dataclass(eq=False)
class Actor:
    """One process of the simulated system, running ``program`` in its own thread."""

    name: str
    host: Host
    program: Callable[[], None]
    crash_p: float = 0.0  # chance of dying at each of its turns
    #: chance, at each yield point, that the process pauses (a stop-the-world GC, a
    #: suspended VM) for a time drawn from ``pause_s``, in the middle of what it does
    pause_p: float = 0.0
    pause_s: tuple[float, float] = (0.0, 0.0)
    #: chance, at each yield point, that its host is suspended for a time drawn from
    #: ``pause_s``: every actor of the host stops, and its monotonic clock does not
    #: count the suspension (see :meth:`Scheduler.suspend`)
    suspend_p: float = 0.0
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    wake_at: float = 0.0
    killed: bool = False
    done: bool = False
    crashed: bool = False
    error: BaseException | None = None
    thread: threading.Thread | None = None
    parent: Actor | None = None  # a thread of that process: it dies with it

    @property
    def alive(self) -> bool:
        return not self.done


@dataclass(eq=False)
class Deferred:
    """Something the network still holds (a write whose caller gave up): it takes
    effect when the scheduler picks it."""

    label: str
    apply: Callable[[], str]
    not_before: float = 0.0  # true time before which the network still holds it


class Scheduler:
    """Runs actors one at a time in an order its seed decides (see the module doc).

    :param seed: the schedule
    :param start: true time at the start (epoch seconds)
    :param max_steps: turns before the run is cut off (reported, not a violation)
    :param deliver_p: chance, per turn, of delivering a held write when there is one
    :param sites: the fault sites of the world (its swarm is drawn from them first)
    :param clock_jump_p: base chance, per turn, that the running actor's host clock
        steps (site ``scheduler.clock-jump``)
    """

    def __init__(self, seed: int, *, start: float = 1_800_000_000.0, max_steps: int = 4000,
                 deliver_p: float = 0.15, sites: tuple[str, ...] | None = None,
                 clock_jump_p: float = 0.0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.swarm = Swarm(self.rng, sites) if sites is not None else None
        self.clock_jump_p = clock_jump_p
        self.jumps: dict[str, float] = {}  # host -> how far its clock stepped so far
        #: host -> its latest suspension, [start, end) in true time
        self.suspended: dict[str, tuple[float, float]] = {}
        #: host -> true time its earlier suspensions took (its monotonic clock missed it)
        self.missed: dict[str, float] = {}
        #: host -> its last monotonic reading (a reading never goes back)
        self.readings: dict[str, float] = {}
        self.ids = random.Random(seed ^ 0x5EED)
        self.now = start
        self.start = start
        self.max_steps = max_steps
        self.deliver_p = deliver_p
        self.step = 0
        self.actors: list[Actor] = []
        self.deferred: list[Deferred] = []
        self.trace: list[str] = []
        self.cut_off = False
        self.observers: list[Callable[[], None]] = []
        self._back = threading.Semaphore(0)
        self._local = threading.local()

    # ------------------------------------------------------------------ actors' side

    def current(self) -> Actor | None:
        """The actor whose thread calls (None: the harness itself)."""
        actor: Actor | None = getattr(self._local, "actor", None)
        return actor

    def wall_clock(self, host: Host | None = None) -> float:
        """``host``'s wall clock (default: the calling actor's host; true time for the
        harness)."""
        if host is None:
            actor = self.current()
            host = actor.host if actor is not None else None
        if host is None:
            return self.now
        return self.now + host.skew_s + self.jumps.get(host.name, 0.0)

    def chance(self, site: str, p: float) -> bool:
        """Whether fault site ``site`` fires now, at base chance ``p`` (see the module
        doc): through the seed's swarm, or a plain draw without one."""
        if self.swarm is not None:
            return self.swarm.fire(site, p)
        return p > 0.0 and self.rng.random() < p

    def alive(self, name: str) -> bool:
        """Whether an actor called ``name`` still runs."""
        return any(a.alive for a in self.actors if a.name == name)

    def monotonic(self) -> float:
        """The calling actor's host's monotonic clock: it runs at the host's ``rate``
        (drift) and stands still while the host is suspended (skew does not matter; the
        harness reads true time). Raises :class:`AssertionError` if a host's reading
        went back (a modelling error of the simulation)."""
        actor = self.current()
        if actor is None:
            return self.now
        host = actor.host.name
        start, end = self.suspended.get(host, (self.now, self.now))
        stood = self.missed.get(host, 0.0) + max(0.0, min(self.now, end) - start)
        reading = self.start + (self.now - self.start - stood) * actor.host.rate
        last = self.readings.get(host, reading)
        assert reading >= last - 1e-6, (
            f"the monotonic clock of {host} went back from {last} to {reading}")
        reading = max(reading, last)  # rounding only (asserted above)
        self.readings[host] = reading
        return reading

    def suspended_until(self, host: Host) -> float:
        """The true time at which ``host``'s latest suspension ends (its actors are not
        scheduled before)."""
        return self.suspended.get(host.name, (0.0, 0.0))[1]

    def suspend(self, seconds: float, what: str = "") -> None:
        """Suspend the calling actor's host for ``seconds`` of true time from now, then
        give the baton back (see the module doc): none of the host's actors runs
        before the suspension ends (their wake-ups move past it by as much as they had
        left: their timers stand still), and its monotonic clock stands still."""
        actor = self.current()
        if actor is None:
            raise RuntimeError("only actors suspend their host")
        self._suspend(actor.host, seconds, what)
        self._give_back(actor, what)

    def _suspend(self, host: Host, seconds: float, what: str) -> None:
        start, end = self.suspended.get(host.name, (self.now, self.now))
        # an actor of a suspended host never runs, so none suspends it again
        assert end <= self.now, f"{host.name} suspended while suspended"
        self.missed[host.name] = self.missed.get(host.name, 0.0) + end - start
        self.suspended[host.name] = (self.now, self.now + seconds)
        for actor in self.actors:
            if actor.host.name == host.name and actor.alive:
                actor.wake_at = max(actor.wake_at, self.now) + seconds
        self.log(f"host {host.name} suspended for {seconds:.1f} s (its actors stop, its "
                 f"monotonic clock stands still) before {what}")

    def uuid4(self) -> real_uuid.UUID:
        """A random id drawn from the seed (the simulation's id source)."""
        return real_uuid.UUID(int=self.ids.getrandbits(128), version=4)

    def log(self, line: str) -> None:
        actor = self.current()
        who = actor.name if actor is not None else "sim"
        self.trace.append(f"{self.step:5d} t+{self.now - 1_800_000_000.0:9.3f} {who}: {line}")

    def yield_point(self, what: str = "") -> None:
        """Give the baton back (the scheduler picks who runs next); raises
        :class:`Crash` if this actor was killed. A no-op outside actors."""
        actor = self.current()
        if actor is None:
            return
        if actor.killed:
            raise Crash(what)
        if actor.pause_p and self.chance(SCHED_PAUSE, actor.pause_p):
            actor.wake_at = self.now + self.rng.uniform(*actor.pause_s)
            self.log(f"pauses until t+{actor.wake_at - 1_800_000_000.0:.3f} before {what}")
            for thread in self.actors:  # the whole process stops: its threads too
                if thread.parent is actor and thread.alive:
                    thread.wake_at = max(thread.wake_at, actor.wake_at)
        elif actor.suspend_p and self.chance(SCHED_SUSPEND, actor.suspend_p):
            self._suspend(actor.host, self.rng.uniform(*actor.pause_s), what)
        self._give_back(actor, what)

    def _give_back(self, actor: Actor, what: str) -> None:
        self._back.release()
        actor.go.acquire()
        if actor.killed:
            raise Crash(what)

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of virtual time (a yield point)."""
        actor = self.current()
        if actor is None:
            raise RuntimeError("only actors sleep")
        actor.wake_at = self.now + max(seconds, 0.0) / actor.host.rate
        self.yield_point(f"sleep {seconds:g}")

    def spawn(self, name: str, host: Host, program: Callable[[], None], *,
              crash_p: float = 0.0, parent: Actor | None = None, pause_p: float = 0.0,
              pause_s: tuple[float, float] = (0.0, 0.0), suspend_p: float = 0.0) -> Actor:
        """Start an actor; it first runs when the scheduler picks it. With ``parent``
        it is a thread of that actor's process and ends when the parent does; with
        ``pause_p`` it may pause at any yield point (see :class:`Actor`)."""
        actor = Actor(name, host, program, crash_p, pause_p=pause_p, pause_s=pause_s,
                      suspend_p=suspend_p, parent=parent,
                      wake_at=max(self.now, self.suspended_until(host)))

        def body() -> None:
            self._local.actor = actor
            actor.go.acquire()
            try:
                if actor.killed:
                    raise Crash("before start")
                program()
            except Crash:
                actor.crashed = True
            except BaseException as exc:
                actor.error = exc
            finally:
                actor.done = True
                self._back.release()

        actor.thread = threading.Thread(target=body, name=f"sim-{name}", daemon=True)
        self.actors.append(actor)
        actor.thread.start()
        self.log(f"spawn {name} on {host.name}")
        return actor

    def defer(self, label: str, apply: Callable[[], str], not_before: float = 0.0) -> None:
        """Hold ``apply`` (a write in flight); it runs when the scheduler delivers it, at
        a turn it picks at or after true time ``not_before``."""
        self.deferred.append(Deferred(label, apply, not_before))

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Run until every actor ended and every held write was delivered."""
        while True:
            live = [a for a in self.actors if a.alive]
            if not live and not self.deferred:
                return
            self.step += 1
            if self.step > self.max_steps:
                self.cut_off = True
                self.log("step limit reached: the run is cut off")
                self.shutdown()
                return
            due = [d for d in self.deferred if d.not_before <= self.now]
            if due and (not live or self.rng.random() < self.deliver_p):
                held = due[self.rng.randrange(len(due))]
                self.deferred.remove(held)
                self.log(f"deliver {held.label}: {held.apply()}")
                self._observe()
                continue
            ready = [a for a in live if a.wake_at <= self.now]
            if not ready:
                self.now = min([a.wake_at for a in live]
                               + [d.not_before for d in self.deferred if d not in due])
                continue
            self.now += self.rng.choice(TICKS)
            actor = self.rng.choice(ready)
            assert self.suspended_until(actor.host) <= self.now, (
                f"{actor.name} scheduled while {actor.host.name} is suspended")
            if actor.crash_p and self.chance(SCHED_CRASH, actor.crash_p):
                actor.killed = True
                self.log(f"crash {actor.name}")
            if self.clock_jump_p and self.chance(SCHED_CLOCK_JUMP, self.clock_jump_p):
                jump = self.rng.choice(JUMPS)
                self.jumps[actor.host.name] = self.jumps.get(actor.host.name, 0.0) + jump
                self.log(f"the clock of {actor.host.name} jumps {jump:+g} s")
            self._hand(actor)
            if actor.done:
                how = "crashed" if actor.crashed else (
                    f"died of {type(actor.error).__name__}: {actor.error}" if actor.error
                    else "ended")
                self.log(f"{actor.name} {how}")
                self._reap(actor)
            self._observe()

    def _reap(self, ended: Actor) -> None:
        """End the threads of a process that ended."""
        for child in self.actors:
            if child.parent is ended and child.alive:
                self.kill(child)
                self._reap(child)

    def _hand(self, actor: Actor) -> None:
        actor.go.release()
        if not self._back.acquire(timeout=BATON_TIMEOUT_S):
            raise SimulationStuck(f"{actor.name} kept the baton for {BATON_TIMEOUT_S:g} s")

    def _observe(self) -> None:
        for observer in self.observers:
            observer()

    def kill(self, actor: Actor) -> None:
        """Kill ``actor`` now (the harness's decision, e.g. a triggerer restart)."""
        if actor.alive:
            actor.killed = True
            self._hand(actor)

    def shutdown(self) -> None:
        """Kill every live actor (their threads end) and drop held writes."""
        for actor in self.actors:
            self.kill(actor)
        self.deferred.clear()


class VirtualTime:
    """The simulation's clock as an object with ``time()``, ``monotonic()`` and
    ``sleep()`` (the calling actor's host clock; see the module doc)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def time(self) -> float:
        return self._scheduler.wall_clock()

    def monotonic(self) -> float:
        return self._scheduler.monotonic()

    def sleep(self, seconds: float) -> None:
        self._scheduler.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        import time

        return getattr(time, name)  # strftime, gmtime, ...: pure functions


class SeededUuid:
    """Seeded ids as an object with ``uuid4()`` (drawn from the scheduler's seed)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def uuid4(self) -> real_uuid.UUID:
        return self._scheduler.uuid4()

    def __getattr__(self, name: str) -> Any:
        return getattr(real_uuid, name)
