"""
Fault-injection scenarios that try to lose messages, the same for every broker.

Each scenario publishes ``count`` messages (``{"n": i, "even": ..., "poison": ...}``, 1% poison)
to a fresh upstream of one broker, runs several watchers on it through the real
``SharedStreamManager`` with a persistence stub (:mod:`tests.reliability.triggerer`), injects
its fault, and runs until every watcher has persisted every message it matches, every poison
message is dead-lettered and nothing is left on the broker (or a deadline passes). Every
watcher rejects poison (``reject="body.poison"``); ``all`` matches everything, ``even`` the
even numbers, and a scenario may add a ``slow`` or ``hang`` watcher.

What a :class:`Result` counts, per scenario:

* produced, and poison among them;
* persisted per watcher (distinct messages / events written, so duplicates show);
* lost: messages a watcher matches that it never persisted. Must be 0 (the ``hang`` watcher is
  not counted: Airflow fails it after the ack timeout and it sees nothing more, core limit 4);
* duplicates: events persisted more than once (at-least-once: bounded, reported);
* dead-lettered: distinct poison messages in the dead-letter destination; a non-poison message
  there, or a poison one missing, is a failure; copies beyond one are reported;
* over the broker's limit: distinct messages the broker itself dead-lettered past its delivery
  limit (the leased queues' streams are created with one, :data:`~tests.reliability.brokers.DELIVERY_LIMIT`,
  with a destination of its own). Must be 0, poison included: the reject dead-letters poison
  itself, so only a lease lost again and again or a redelivery loop gets there;
* kills: for each SIGKILL, how many messages had a trigger event bound but not yet persisted
  at the kill (in flight: received, not settled). Each must be > 0, or the kill proved nothing;
* the same count when ``broker_restart`` takes the broker out, which must be > 0 too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.reliability.brokers import REPO, BrokerRig
from tests.reliability.triggerer import (
    BOUND,
    ERRORS,
    PERSISTED,
    PersistingTriggerer,
    TriggererSpec,
    WatcherSpec,
)
from tests.support.processes import running_threads
from tests.support.statsd import statsd_listening


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kills: int = 0
    broker_restart: bool = False
    extra_watcher: str | None = None
    """``slow`` or ``hang``: a fourth watcher with that behaviour."""
    slow_delay: float = 0.02
    sync_interval: float = 1.0
    """Seconds between persistence cycles (Airflow's state sync is 1-1.4 s)."""
    short_lease: bool = False
    """Leases at the broker's minimum, with persistence delayed past them."""
    ack_timeout: float = 300.0
    max_in_flight: int = 200
    """Small enough that a stream of thousands takes many persistence cycles."""


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("baseline", "no fault"),
        Scenario(
            "sigkill",
            "SIGKILL of the triggerer process mid-flight, restart (3 kills)",
            kills=3,
            max_in_flight=100,
        ),
        Scenario(
            "broker_restart",
            "broker out mid-stream, back with its state (stopped 2 s and started again; Pub/Sub: frozen)",
            broker_restart=True,
        ),
        Scenario("hung_watcher", "a watcher hangs on its first event", extra_watcher="hang", ack_timeout=6.0),
        Scenario("slow_watcher", "a watcher slower than the stream (20 ms per event)", extra_watcher="slow"),
        Scenario("short_lease", "leases at the broker minimum, persistence 2 s past them", short_lease=True),
        Scenario("slow_database", "confirmations only every 5 s", sync_interval=5.0),
    )
}


@dataclass
class WatcherResult:
    expected: int
    persisted_distinct: int
    persisted_events: int
    lost: int

    @property
    def duplicates(self) -> int:
        return self.persisted_events - self.persisted_distinct


@dataclass
class Result:
    broker: str
    scenario: str
    produced: int
    poison: int
    watchers: dict[str, WatcherResult] = field(default_factory=dict)
    dead_lettered: int = 0
    dead_letter_copies: int = 0
    wrongly_dead_lettered: int = 0
    delivery_limit: int | None = None
    """The broker's delivery limit on the run's stream, as the broker reported it (None: none)."""
    over_limit: int = 0
    """Distinct messages the broker dead-lettered past its delivery limit (must be 0)."""
    in_flight_at_kills: list[int] = field(default_factory=list)
    in_flight_at_outage: int | None = None
    """Messages received and not settled when ``broker_restart`` took the broker out."""
    watcher_failures: dict[str, int] = field(default_factory=dict)
    left_on_broker: int | None = None
    seconds: float = 0.0
    metrics: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    finished: bool = False
    note: str = ""

    @property
    def lost(self) -> int:
        return sum(w.lost for name, w in self.watchers.items() if name != "hang")

    @property
    def duplicates(self) -> int:
        return sum(w.duplicates for w in self.watchers.values())

    def problems(self) -> list[str]:
        """Everything that makes this run a failure (empty: it passed)."""
        found = []
        if not self.finished:
            found.append(f"did not finish: {self.note}")
        if self.lost:
            found.append(f"{self.lost} message(s) lost: {self.watchers}")
        if self.dead_lettered != self.poison:
            found.append(f"{self.dead_lettered} of {self.poison} poison messages dead-lettered")
        if self.wrongly_dead_lettered:
            found.append(f"{self.wrongly_dead_lettered} good message(s) dead-lettered")
        if self.over_limit:
            found.append(
                f"{self.over_limit} message(s) dead-lettered by the broker past its delivery limit "
                f"({self.delivery_limit}): delivered that often without being settled"
            )
        if self.in_flight_at_kills and min(self.in_flight_at_kills) == 0:
            found.append(f"a kill landed with nothing in flight: {self.in_flight_at_kills}")
        if self.in_flight_at_outage == 0:
            found.append("the broker outage landed with nothing in flight")
        if self.left_on_broker:
            found.append(f"{self.left_on_broker} message(s) left on the broker")
        return found


def make_bodies(count: int, rng: random.Random) -> tuple[list[dict[str, Any]], set[int]]:
    """``count`` bodies, exactly 1% of them (at least one) poison, at random positions."""
    poison = set(rng.sample(range(count), max(1, count // 100)))
    return [{"n": n, "even": n % 2 == 0, "poison": n in poison} for n in range(count)], poison


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut by the kill
            records.append(json.loads(line))
    return records


def in_flight(out: Path, incarnation: int) -> int:
    """
    Messages with an event bound by ``incarnation`` and not persisted: never confirmed, so the
    manager cannot have settled them (received from the broker, not yet acked).
    """
    bound = collections.Counter(json.dumps(r) for r in read_records(out / BOUND) if r["i"] == incarnation)
    persisted = collections.Counter(
        json.dumps(r) for r in read_records(out / PERSISTED) if r["i"] == incarnation
    )
    return len({json.loads(line)["n"] for line in bound - persisted})


def _stopped(pid: int) -> bool:
    """Whether EVERY thread of ``pid`` is stopped (``/proc/<pid>/stat`` is the main thread's only)."""
    return not running_threads([pid])


async def _until(condition: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


class _WarningCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.messages.append(record.getMessage())


class ScenarioRun:
    """One scenario on one broker (see the module docstring)."""

    def __init__(
        self, rig: BrokerRig, scenario: Scenario, *, count: int, seed: int, workdir: Path, timeout: float
    ) -> None:
        self.rig = rig
        self.scenario = scenario
        self.count = count
        self.rng = random.Random(f"{seed}/{rig.name}/{scenario.name}")
        self.out = workdir / f"{rig.name}-{scenario.name}"
        self.timeout = timeout
        self.contract = rig.contract_for(kills=scenario.kills > 0, short_lease=scenario.short_lease)
        # A lease a killed process's messages come back after (the lease keeper extends it while
        # an event waits); at the broker's minimum, below the persistence delay, for short_lease.
        self.lease = rig.lease_seconds_min if scenario.short_lease else max(10, rig.lease_seconds_min)
        self.persist_delay = rig.lease_seconds_min + 2.0 if scenario.short_lease else 0.0
        self.bodies, self.poison = make_bodies(count, self.rng)
        self.dead: collections.Counter[int] = collections.Counter()
        self.over_limit: collections.Counter[int] = collections.Counter()
        self.result = Result(rig.name, scenario.name, produced=count, poison=len(self.poison))
        self.stream: Any = None
        self._statsd: Any = None

    # -- set-up --------------------------------------------------------------------------------

    def watcher_specs(self) -> list[WatcherSpec]:
        watchers = [("all", None, "normal"), ("even", "body.even", "normal"), ("all_2", None, "normal")]
        if self.scenario.extra_watcher:
            watchers.append((self.scenario.extra_watcher, None, self.scenario.extra_watcher))
        specs = []
        for name, match, behaviour in watchers:
            trigger = self.contract.trigger(
                self.stream,
                match=match,
                reject="body.poison",
                max_in_flight=self.scenario.max_in_flight,
                **self.rig.trigger_kwargs(),
            )
            classpath, kwargs = trigger.serialize()
            specs.append(WatcherSpec(name, classpath, kwargs, behaviour, self.scenario.slow_delay))
        return specs

    def expected(self, watcher: str) -> set[int]:
        good = [b for b in self.bodies if not b["poison"]]
        if watcher == "even":
            return {b["n"] for b in good if b["even"]}
        return {b["n"] for b in good}

    def triggerer_spec(self, incarnation: int) -> TriggererSpec:
        return TriggererSpec(
            out_dir=str(self.out),
            watchers=self._specs,
            incarnation=incarnation,
            sync_interval=self.scenario.sync_interval,
            persist_delay=self.persist_delay,
            ack_timeout=self.scenario.ack_timeout,
        )

    async def prepare(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for name in (BOUND, PERSISTED, ERRORS):
            (self.out / name).unlink(missing_ok=True)
        if self.rig.delivery_limit is None:
            self.stream = await asyncio.to_thread(self.contract.create_stream, lease_seconds=self.lease)
        else:
            self.stream = await asyncio.to_thread(
                self.contract.create_limited_stream,
                lease_seconds=self.lease,
                max_deliveries=self.rig.delivery_limit,
            )
            self.result.delivery_limit = await asyncio.to_thread(self.contract.delivery_limit, self.stream)
        for start in range(0, len(self.bodies), 100):
            await asyncio.to_thread(self.contract.publish, self.stream, self.bodies[start : start + 100])
        self._specs = self.watcher_specs()

    # -- the run -------------------------------------------------------------------------------

    async def run(self) -> Result:
        started = time.monotonic()
        await self.prepare()
        incarnation = 0
        for _ in range(self.scenario.kills):
            incarnation += 1
            self.result.in_flight_at_kills.append(await self._killed_child(incarnation))
        incarnation += 1
        counter = _WarningCounter()
        logging.getLogger().addHandler(counter)
        try:
            with statsd_listening() as statsd:
                self._statsd = statsd
                triggerer = PersistingTriggerer(self.triggerer_spec(incarnation))
                await triggerer.start()
                try:
                    if self.scenario.broker_restart:
                        await self._restart_broker_mid_stream(triggerer, incarnation)
                    await self._until_done()
                finally:
                    await triggerer.stop()
                prefix = f"airflow.shared_stream.{self.rig.name}."
                self.result.metrics = {
                    name: sum(
                        statsd.counter(line)
                        for line in {ln.split(":")[0] for ln in statsd.read()}
                        if line.startswith(prefix) and line.endswith("." + name)
                    )
                    for name in ("received", "acked", "redelivered", "dead_lettered", "watcher_failures")
                }
        finally:
            logging.getLogger().removeHandler(counter)
        self.result.warnings = counter.messages
        self.result.seconds = time.monotonic() - started
        self._collect()
        return self.result

    async def _killed_child(self, incarnation: int) -> int:
        spec_path = self.out / f"spec-{incarnation}.json"
        self.triggerer_spec(incarnation).dump(spec_path)
        with open(self.out / f"child-{incarnation}.log", "wb") as log:  # noqa: ASYNC230 - a local file
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.reliability.triggerer", str(spec_path),
                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            bound = self.out / BOUND
            await _until(
                lambda: any(r["i"] == incarnation for r in read_records(bound)),
                timeout=120,
                what=f"the triggerer process (incarnation {incarnation}) to receive messages",
            )
            # A random point of the stream, then the first moment something is in flight.
            await asyncio.sleep(self.rng.uniform(0.0, 1.5 * self.scenario.sync_interval))
            await self._stop_with_something_in_flight(proc.pid, incarnation)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        # The process is dead: its files are final. Bound-but-unpersisted events were never
        # confirmed, so the manager could not have settled their messages.
        return in_flight(self.out, incarnation)

    async def _stop_with_something_in_flight(self, pid: int, incarnation: int) -> None:
        """
        Leave the child stopped (SIGSTOP) at a moment it holds messages in flight.

        Seeing something in flight in the files and then killing raced the child: on a short
        stream it could persist its last in-flight events between the look and the kill, which
        then landed with nothing in flight (seen once in CI, Pub/Sub's short form). A stopped
        child changes nothing, so what the files say while it is stopped is what the kill lands
        on; if nothing is in flight then, it goes on and the next moment is tried.
        """
        deadline = time.monotonic() + 60
        while True:
            await _until(
                lambda: in_flight(self.out, incarnation) > 0,
                timeout=max(0.1, deadline - time.monotonic()),
                what="a message in flight",
            )
            os.kill(pid, signal.SIGSTOP)
            await _until(lambda: _stopped(pid), timeout=5, what=f"process {pid} to stop", interval=0.001)
            if await asyncio.to_thread(in_flight, self.out, incarnation) > 0:
                return
            os.kill(pid, signal.SIGCONT)

    async def _restart_broker_mid_stream(self, triggerer: PersistingTriggerer, incarnation: int) -> None:
        """
        Take the broker out for the rig's ``outage_seconds``, mid-stream and mid-flight.

        Once a fifth of the stream's events are bound, at the first moment a message is in
        flight (an event bound and not persisted: received, not settled), as for a kill: an
        outage with nothing at risk would prove nothing. Waiting for persisted events instead
        let the outage land after the last one on a short stream (100 messages fit one window
        and one persistence cycle), when only ACKs were left. Persistence is held from the look
        until the broker is out, so the look stays true (a persistence cycle in between would
        settle what it saw); the held events are then persisted during the outage, and their
        settlements meet the broker out. How the broker goes out depends on the rig: stopped
        and started again on its port with its state, or (the Pub/Sub emulator, memory-only)
        frozen and resumed, long enough that its calls time out and its leases expire.
        """
        first = max(1, self.count // 5)
        await _until(
            lambda: len(read_records(self.out / BOUND)) >= first,
            timeout=120,
            what=f"{first} bound events before taking the broker out",
        )
        async with triggerer.persistence_held():
            await _until(lambda: in_flight(self.out, incarnation) > 0, timeout=60, what="a message in flight")
            self.result.in_flight_at_outage = await asyncio.to_thread(in_flight, self.out, incarnation)
            await asyncio.to_thread(self.rig.stop_broker)
        try:
            await asyncio.sleep(self.rig.outage_seconds)
        finally:  # a cancelled or failed run must not leave the broker out for the next scenario
            await asyncio.to_thread(self.rig.start_broker)

    def _done(self) -> bool:
        if self._statsd is not None:
            self._statsd.read()  # drain the UDP socket as we go: its buffer would drop lines
        self._take_dead_letters()
        # What the broker dead-lettered past its limit will not come back: not waited for (it is
        # a failure of its own, and lost if no watcher persisted it).
        gone = set(self.over_limit)
        persisted = read_records(self.out / PERSISTED)
        seen: dict[str, set[int]] = collections.defaultdict(set)
        for record in persisted:
            seen[record["w"]].add(record["n"])
        for spec in self._specs:
            if spec.behaviour != "hang" and not self.expected(spec.name) - gone <= seen[spec.name]:
                return False
        if not self.poison - gone <= set(self.dead):
            return False
        return self._left_on_broker() in (0, None)

    def _take_dead_letters(self) -> None:
        letters = self.contract.take_dead_letters(self.stream)
        for body in letters.rejected:
            self.dead[body["n"]] += 1
        for body in letters.over_limit:
            self.over_limit[body["n"]] += 1

    def _left_on_broker(self) -> int | None:
        if self.scenario.kills and self.rig.name == "pubsub":
            return None  # acks made by the killed processes are not in this process's ledger
        return self.contract.remaining(self.stream)

    async def _until_done(self) -> None:
        try:
            await _until(self._done, timeout=self.timeout, what="the stream to finish", interval=0.5)
            self.result.finished = True
        except TimeoutError as exc:
            self.result.note = str(exc)

    def _collect(self) -> None:
        persisted = read_records(self.out / PERSISTED)
        for spec in self._specs:
            numbers = [r["n"] for r in persisted if r["w"] == spec.name]
            expected = self.expected(spec.name)
            self.result.watchers[spec.name] = WatcherResult(
                expected=len(expected),
                persisted_distinct=len(set(numbers)),
                persisted_events=len(numbers),
                lost=len(expected - set(numbers)),
            )
        # Copies that reached the dead-letter destination after the last check of the run (a
        # message redelivered while its first copy was on the wire, as through an outage)
        # would not be counted otherwise; the triggerer has stopped, so this read is the last.
        with contextlib.suppress(Exception):
            self._take_dead_letters()
        self.result.over_limit = len(self.over_limit)
        self.result.dead_lettered = len(set(self.dead) & self.poison)
        self.result.wrongly_dead_lettered = len(set(self.dead) - self.poison)
        self.result.dead_letter_copies = sum(self.dead.values()) - len(self.dead)
        for record in read_records(self.out / ERRORS):
            key = f"{record['w']}: {record['error']}"
            self.result.watcher_failures[key] = self.result.watcher_failures.get(key, 0) + 1
        with contextlib.suppress(Exception):
            self.result.left_on_broker = self._left_on_broker()


async def run_scenario(
    rig: BrokerRig, scenario: Scenario, *, count: int, seed: int, workdir: Path, timeout: float = 180.0
) -> Result:
    return await ScenarioRun(rig, scenario, count=count, seed=seed, workdir=workdir, timeout=timeout).run()


# -- the table ----------------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    """One markdown table of results (one row per run)."""
    header = (
        "| scenario | produced (poison) | persisted per watcher: distinct/events | lost | duplicates "
        "| dead-lettered (extra copies) | dead-lettered by the broker's delivery limit (limit) "
        "| messages in flight at each kill (or outage) | watcher failures | left on broker | s |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    rows = [header]
    for r in results:
        watchers = ", ".join(
            f"{name} {w.persisted_distinct}/{w.persisted_events}" for name, w in r.watchers.items()
        )
        failures = ", ".join(f"{k} x{v}" for k, v in sorted(r.watcher_failures.items())) or "0"
        kills = ", ".join(str(n) for n in r.in_flight_at_kills) or "-"
        if r.in_flight_at_outage is not None:
            kills = f"outage: {r.in_flight_at_outage}"
        left = "n/m" if r.left_on_broker is None else str(r.left_on_broker)
        over_limit = "no limit" if r.delivery_limit is None else f"{r.over_limit} ({r.delivery_limit})"
        status = "" if not r.problems() else " **FAILED: " + "; ".join(r.problems()) + "**"
        rows.append(
            f"| {r.scenario}{status} | {r.produced} ({r.poison}) | {watchers} | {r.lost} | {r.duplicates} "
            f"| {r.dead_lettered} ({r.dead_letter_copies}) | {over_limit} | {kills} | {failures} | {left} "
            f"| {r.seconds:.0f} |"
        )
    return "\n".join(rows)
