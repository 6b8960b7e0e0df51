"""
High availability (issue 13): one Kafka topic and one SQS queue, six watchers each, spread three
and three over TWO real triggerer processes sharing one PostgreSQL metadata database.

How the watchers are spread, deterministically: the Dags are born paused; ``ha_first`` (three
Kafka and three SQS watchers) is unpaused and triggerer A starts with ``--capacity 6``, so it
takes exactly those six; then ``ha_second`` is unpaused and triggerer B starts (capacity 12, room
for A's watchers after a failover). Each watcher has its own asset, so the asset events say
which watcher saw which message; the tests print that table.

What must hold:

* Kafka: every watcher sees every record of the 3-partition topic, whichever triggerer runs it;
  still does after the triggerer that the ``trigger`` table says runs Kafka watchers is SIGKILLed
  mid-stream (once those watchers have persisted part of the stream, before the rest is
  produced) and they move to the survivor; and still does while two triggerers run the same
  watchers for a while (one frozen past the health-check threshold, its triggers taken over,
  then resumed). Duplicates are counted per watcher: only records produced before a watcher's
  move was complete can come twice.
* SQS (a leased queue cannot broadcast): each message reaches the watchers of one triggerer only;
  that is detected and reported loudly (an ERROR naming the queue in the triggerer log, and the
  ``triggerers`` gauge of the stream at 2), and the report clears once one triggerer runs them all.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.airflow import AirflowDeployment
from tests.support.brokers import KafkaBroker, SqsServer
from tests.support.postgres import PostgresServer
from tests.support.processes import tail, wait_until
from tests.support.statsd import StatsdListener

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

HA_DAGS = Path(__file__).parent / "ha_dags"
TOPIC = "ha-orders"
PARTITIONS = 3
QUEUE = "ha-orders"
FIRST, SECOND, THIRD = "triggerer-a", "triggerer-b", "triggerer-c"
CAPACITY = {FIRST: 6, SECOND: 12, THIRD: 12}
HEALTH_CHECK_THRESHOLD = 30
"""Seconds without a heartbeat before a triggerer's watchers move. Above the deployment's 15 s:
on a loaded 2-core machine a triggerer's loop stalled long enough for its watchers to move to
the other one before the test's kill, which then tested no failover."""
KAFKA_WATCHERS = {f"ha_kafka_w{i}_watcher": f"ha_kafka_w{i}" for i in range(1, 7)}
SQS_WATCHERS = {f"ha_sqs_w{i}_watcher": f"ha_sqs_w{i}" for i in range(1, 7)}
DAG_WATCHERS = {
    "ha_first": {f"ha_{b}_w{i}_watcher" for b in ("kafka", "sqs") for i in range(1, 4)},
    "ha_second": {f"ha_{b}_w{i}_watcher" for b in ("kafka", "sqs") for i in range(4, 7)},
}


@dataclass
class HaStack:
    airflow: AirflowDeployment
    kafka: KafkaBroker
    sqs: SqsServer
    queue_url: str
    statsd: StatsdListener

    def placement(self) -> dict[str, int | None]:
        """Watcher name -> id of the triggerer (job) running it."""
        with self.airflow.db() as conn:
            rows = conn.execute(
                "SELECT w.name, t.triggerer_id FROM asset_watcher w JOIN trigger t ON t.id = w.trigger_id"
            ).fetchall()
        return {r["name"]: r["triggerer_id"] for r in rows}

    def triggerer_jobs(self) -> list[int]:
        """Triggerer job ids in start order: the first is A's, the second B's, the third C's."""
        with self.airflow.db() as conn:
            rows = conn.execute("SELECT id FROM job WHERE job_type = 'TriggererJob' ORDER BY id").fetchall()
        return [r["id"] for r in rows]

    def triggerer_names(self) -> dict[int, str]:
        """Triggerer job id -> process name (each start adds one job row, in start order)."""
        started = [name for name in self.airflow.procs if name.startswith("triggerer-")]
        return dict(zip(self.triggerer_jobs(), started, strict=True))

    def deliveries(self, body_key: str, ids: set[str]) -> dict[str, Counter[str]]:
        """asset -> how many asset events it got for each of ``ids`` (2 or more: duplicates)."""
        found: dict[str, Counter[str]] = defaultdict(Counter)
        for event in self.airflow.asset_events():
            payload = event.payload if isinstance(event.payload, dict) else {}
            body = payload.get(body_key)
            if isinstance(body, dict) and body.get("event_id") in ids:
                found[event.asset_name][body["event_id"]] += 1
        return found

    def seen(self, body_key: str, ids: set[str]) -> dict[str, dict[str, set[Any]]]:
        """asset -> {"ids": event ids among ``ids`` it got an asset event for, "partitions": ...}."""
        found: dict[str, dict[str, set[Any]]] = defaultdict(lambda: {"ids": set(), "partitions": set()})
        for event in self.airflow.asset_events():
            payload = event.payload if isinstance(event.payload, dict) else {}
            body = payload.get(body_key)
            if isinstance(body, dict) and body.get("event_id") in ids:
                found[event.asset_name]["ids"].add(body["event_id"])
                found[event.asset_name]["partitions"].add(payload.get("partition"))
        return found

    def share_table(self, watchers: dict[str, str], body_key: str, ids: set[str]) -> str:
        """Which watcher, on which triggerer, saw how much of ``ids`` (printed by every test)."""
        jobs = self.triggerer_jobs()
        names = {job: label for job, label in zip(jobs, ("A", "B", "C"), strict=False)}
        placement = self.placement()
        seen = self.seen(body_key, ids)
        deliveries = self.deliveries(body_key, ids)
        lines = [f"{'watcher':<22} triggerer  saw / sent  duplicates  partitions"]
        for watcher, asset in sorted(watchers.items()):
            got = seen.get(asset, {"ids": set(), "partitions": set()})
            job = placement.get(watcher)
            where = f"{names.get(job, '?')} (job {job})" if job is not None else "-"
            parts = ",".join(str(p) for p in sorted(x for x in got["partitions"] if x is not None)) or "-"
            twice = _duplicates(deliveries.get(asset, Counter()))
            lines.append(
                f"{watcher:<22} {where:<10} {len(got['ids']):>3} / {len(ids):<4}  {twice:>10}  {parts}"
            )
        return "\n".join(lines)


def _duplicates(deliveries: Counter[str]) -> int:
    """Asset events beyond the first of each record."""
    return sum(count - 1 for count in deliveries.values())


def _events(tag: str, count: int) -> list[dict[str, Any]]:
    return [{"event_id": f"{tag}-{i:03d}", "type": "order_created", "amount": i} for i in range(count)]


def _start_triggerer(airflow: AirflowDeployment, name: str, capacity: int, watchers: set[str]) -> None:
    airflow.start_component("triggerer", "--capacity", str(capacity), name=name)

    def running() -> bool:
        airflow.check_alive()
        ids = airflow.watcher_trigger_ids()
        return watchers <= ids.keys() and {ids[w] for w in watchers} <= airflow.assigned_trigger_ids()

    def kafka_watchers_joined() -> bool:
        # Assigned is not yet started: a brand-new Kafka watcher starts at the stream's read
        # position when its triggerer starts it (docs/ha.rst), so records produced before this
        # line would be, by design, before its start.
        ids = airflow.watcher_trigger_ids()
        log = airflow.log_path(name).read_text(errors="replace")
        return all(f"Kafka watcher trigger {ids[w]} joined" in log for w in watchers if w in KAFKA_WATCHERS)

    try:
        wait_until(running, 120, f"{name} to run {sorted(watchers)}", interval=0.5)
        wait_until(kafka_watchers_joined, 120, f"the Kafka watchers on {name} to join", interval=0.5)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{tail(airflow.log_path(name))}") from None


def _unpause(airflow: AirflowDeployment, dag_id: str) -> None:
    airflow.cli("dags", "unpause", dag_id)

    def registered() -> bool:
        airflow.check_alive()
        return DAG_WATCHERS[dag_id] <= airflow.watcher_trigger_ids().keys()

    wait_until(registered, 120, f"the watchers of {dag_id} to be registered", interval=0.5)


@pytest.fixture(scope="module")
def ha(e2e_dir: Path, kafka: KafkaBroker, sqs: SqsServer, postgres: PostgresServer) -> Iterator[HaStack]:
    kafka.create_topics([TOPIC], partitions=PARTITIONS)
    queue_url = sqs.create_queue(QUEUE)
    statsd = StatsdListener()
    # Drain the socket all along: a full receive buffer would drop the datagrams the test waits for.
    draining = threading.Event()

    def drain() -> None:
        while not draining.wait(0.2):
            statsd.read()

    drainer = threading.Thread(target=drain, name="statsd-drain", daemon=True)
    drainer.start()
    home = e2e_dir / "airflow-ha-postgresql"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "ha_watchers.py").symlink_to(HA_DAGS / "ha_watchers.py")
    env = {
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {
                "conn_type": "kafka",
                "extra": {"bootstrap.servers": kafka.bootstrap, "auto.offset.reset": "earliest"},
            }
        ),
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(sqs.connection()),
        "HA_KAFKA_TOPIC": TOPIC,
        "HA_SQS_QUEUE_URL": queue_url,
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3",
        "AIRFLOW__SHARED_STREAM__SPLIT_STREAM_CHECK_INTERVAL": "5",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(HEALTH_CHECK_THRESHOLD),
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    airflow = AirflowDeployment(
        home=home,
        dags_folder=dags,
        env=env,
        database_url=postgres.create_database("airflow_ha"),
    )
    try:
        airflow.migrate()
        airflow.start_component("dag-processor")
        airflow.start_component("scheduler")
        airflow.wait_for_dags(set(DAG_WATCHERS))
        _unpause(airflow, "ha_first")
        _start_triggerer(airflow, FIRST, CAPACITY[FIRST], DAG_WATCHERS["ha_first"])
        _unpause(airflow, "ha_second")
        _start_triggerer(airflow, SECOND, CAPACITY[SECOND], DAG_WATCHERS["ha_second"])
        yield HaStack(airflow=airflow, kafka=kafka, sqs=sqs, queue_url=queue_url, statsd=statsd)
    finally:
        airflow.stop()
        draining.set()
        drainer.join()
        statsd.socket.close()


def test_each_stream_has_three_watchers_on_each_triggerer(ha: HaStack) -> None:
    assert ha.airflow.database == "postgresql"
    first, second = ha.triggerer_jobs()
    placement = ha.placement()
    for watchers in (KAFKA_WATCHERS, SQS_WATCHERS):
        where = [placement[w] for w in watchers]
        assert sorted(where) == [first] * 3 + [second] * 3, placement


def test_every_kafka_watcher_sees_every_record_on_either_triggerer(ha: HaStack) -> None:
    events = _events("ha-kafka-1", 30)
    ha.kafka.produce(TOPIC, events, key_field="event_id")
    ids = {e["event_id"] for e in events}

    def everyone_saw_everything() -> bool:
        seen = ha.seen("value", ids)
        return all(seen.get(asset, {}).get("ids") == ids for asset in KAFKA_WATCHERS.values())

    try:
        wait_until(everyone_saw_everything, 90, "every Kafka watcher to see every record", interval=1)
    finally:
        print("\nKafka, 30 records over 3 partitions, watchers 3/3 on two triggerers:")
        print(ha.share_table(KAFKA_WATCHERS, "value", ids))
    partitions = set().union(*(s["partitions"] for s in ha.seen("value", ids).values()))
    assert partitions == set(range(PARTITIONS)), "the records did not cover every partition"


def test_sqs_watchers_on_two_triggerers_are_reported_loudly(ha: HaStack) -> None:
    events = _events("ha-sqs-1", 30)
    ha.sqs.send(ha.queue_url, events)
    ids = {e["event_id"] for e in events}

    def every_message_arrived() -> bool:
        seen = ha.seen("body", ids)
        return set().union(*(s["ids"] for s in seen.values())) == ids if seen else False

    try:
        wait_until(every_message_arrived, 90, "every SQS message to reach some watcher", interval=1)
    finally:
        print("\nSQS, 30 messages, watchers 3/3 on two triggerers (a queue cannot broadcast):")
        print(ha.share_table(SQS_WATCHERS, "body", ids))

    # The detection: an ERROR in each triggerer's log naming the queue, and the gauge at 2.
    def reported() -> bool:
        logs = [ha.airflow.log_path(name).read_text(errors="replace") for name in (FIRST, SECOND)]
        return all("run on 2 triggerers" in text and QUEUE in text for text in logs)

    wait_until(reported, 60, "both triggerers to report the split SQS stream", interval=1)
    gauge = "airflow.shared_stream.sqs.ha-orders.triggerers"
    try:
        wait_until(lambda: f"{gauge}:2|g" in ha.statsd.read(), 30, gauge, interval=0.5)
    except RuntimeError:
        ours = sorted({line.split(":")[0] for line in ha.statsd.read() if "shared_stream" in line})
        raise AssertionError(f"no {gauge}:2|g among {len(ha.statsd.lines)} lines; ours: {ours}") from None
    # Kafka watchers are spread just as much, but every triggerer reads the whole topic: no alarm.
    text = ha.airflow.log_path(FIRST).read_text(errors="replace")
    assert not any("ERROR" in line and TOPIC in line and "triggerers" in line for line in text.splitlines())


def _ids(events: list[dict[str, Any]]) -> set[str]:
    return {e["event_id"] for e in events}


def _kafka_watchers_on(ha: HaStack, job: int) -> set[str]:
    placement = ha.placement()
    return {w for w in KAFKA_WATCHERS if placement.get(w) == job}


def _the_triggerer_running_kafka_watchers(ha: HaStack) -> tuple[str, int, str, int]:
    """
    From the ``trigger`` table: the live triggerer that runs the most Kafka watchers and whose
    triggers the other live triggerer has room for. Returns (name, job, survivor name, job).
    """
    live = {job: name for job, name in ha.triggerer_names().items() if ha.airflow.procs[name].poll() is None}
    load = Counter(ha.placement().values())
    choices = [
        (len(_kafka_watchers_on(ha, job)), name, job, other_name, other_job)
        for job, name in live.items()
        for other_job, other_name in live.items()
        if other_job != job and CAPACITY[other_name] - load[other_job] >= load[job]
    ]
    choices = [c for c in choices if c[0] > 0]
    if not choices:
        table = ha.share_table(KAFKA_WATCHERS, "value", set())
        raise AssertionError(f"no live triggerer runs Kafka watchers that another can take over:\n{table}")
    _, name, job, other_name, other_job = max(choices)
    return name, job, other_name, other_job


def _log_size(airflow: AirflowDeployment, name: str) -> int:
    return len(airflow.log_path(name).read_text(errors="replace"))


def _log_since(airflow: AirflowDeployment, name: str, mark: int) -> str:
    return airflow.log_path(name).read_text(errors="replace")[mark:]


def _wait_for_the_move(ha: HaStack, moved: set[str], survivor: str, job: int, mark: int) -> None:
    """The ``trigger`` table puts ``moved`` on ``job`` and its log says each Kafka watcher joined."""
    airflow = ha.airflow
    triggers = airflow.watcher_trigger_ids()

    def moved_and_joined() -> bool:
        placement = ha.placement()
        log = _log_since(airflow, survivor, mark)
        return all(placement.get(w) == job for w in moved) and all(
            f"Kafka watcher trigger {triggers[w]} joined" in log for w in moved
        )

    try:
        wait_until(moved_and_joined, HEALTH_CHECK_THRESHOLD + 150, f"{survivor} to take over {sorted(moved)}")
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{ha.share_table(KAFKA_WATCHERS, 'value', set())}") from None
    assert airflow.procs[survivor].poll() is None, tail(airflow.log_path(survivor))


def _wait_until_every_kafka_watcher_saw(ha: HaStack, ids: set[str], what: str) -> None:
    def everyone_saw_everything() -> bool:
        seen = ha.seen("value", ids)
        return all(seen.get(asset, {}).get("ids") == ids for asset in KAFKA_WATCHERS.values())

    wait_until(everyone_saw_everything, 180, what, interval=1)


def _duplicates_report(ha: HaStack, batches: dict[str, list[dict[str, Any]]], settled: str) -> None:
    """
    Print the duplicates of each Kafka watcher, per batch; assert none in batch ``settled``: it
    was produced once every move was complete, and no disruption can deliver it twice.
    """
    ids = {name: _ids(events) for name, events in batches.items()}
    deliveries = ha.deliveries("value", set().union(*ids.values()))
    per_batch = {
        w: {
            name: _duplicates(Counter({i: n for i, n in deliveries.get(a, Counter()).items() if i in batch}))
            for name, batch in ids.items()
        }
        for w, a in KAFKA_WATCHERS.items()
    }
    worst = max(sum(b.values()) for b in per_batch.values())
    print(f"duplicates per watcher and batch: {per_batch}; worst {worst} of {sum(map(len, ids.values()))}")
    twice = {w: b[settled] for w, b in per_batch.items() if b[settled]}
    assert not twice, f"records of the batch {settled!r}, produced after the move, came twice: {twice}"


def test_kafka_watchers_fail_over_when_the_triggerer_running_them_is_sigkilled(ha: HaStack) -> None:
    """
    Mid-stream by what was observed, not by wall time: the victim is the triggerer the
    ``trigger`` table says runs Kafka watchers; it is killed once each of those watchers has
    persisted part of the first batch (the rest may still be in flight), the second batch is
    produced while they have no triggerer, the third once they joined the survivor's stream.
    """
    airflow = ha.airflow
    victim, victim_job, survivor, survivor_job = _the_triggerer_running_kafka_watchers(ha)
    moved = _kafka_watchers_on(ha, victim_job)
    before, homeless, after = _events("ha-kill-1", 30), _events("ha-kill-2", 15), _events("ha-kill-3", 15)
    ids = _ids(before) | _ids(homeless) | _ids(after)
    ha.kafka.produce(TOPIC, before, key_field="event_id")

    def each_moved_watcher_persisted_some() -> bool:
        seen = ha.seen("value", _ids(before))
        return all(seen.get(KAFKA_WATCHERS[w], {}).get("ids") for w in moved)

    wait_until(each_moved_watcher_persisted_some, 120, f"{sorted(moved)} to persist records on {victim}")
    assert _kafka_watchers_on(ha, victim_job) == moved, "the watchers moved before the kill"
    mark = _log_size(airflow, survivor)
    airflow.kill_triggerer(victim)
    at_kill = {
        w: len(ha.seen("value", _ids(before)).get(KAFKA_WATCHERS[w], {}).get("ids", ())) for w in moved
    }
    ha.kafka.produce(TOPIC, homeless, key_field="event_id")
    _wait_for_the_move(ha, moved, survivor, survivor_job, mark)
    ha.kafka.produce(TOPIC, after, key_field="event_id")
    try:
        _wait_until_every_kafka_watcher_saw(ha, ids, "every Kafka watcher to see every record after failover")
    finally:
        print(
            f"\nKafka, {len(ids)} records; {victim} (job {victim_job}) SIGKILLed when its Kafka watchers"
            f" had persisted {at_kill} of the first {len(before)}; {len(homeless)} produced while they"
            f" had no triggerer, {len(after)} once they joined {survivor}:"
        )
        print(ha.share_table(KAFKA_WATCHERS, "value", ids))
    _duplicates_report(ha, {"before": before, "homeless": homeless, "after": after}, settled="after")
    # The placement check follows the move: the SQS stream now runs on one triggerer.
    gauge = "airflow.shared_stream.sqs.ha-orders.triggerers:1|g"
    wait_until(lambda: gauge in ha.statsd.read(), 60, gauge, interval=0.5)


def _signal_group(airflow: AirflowDeployment, name: str, signum: signal.Signals) -> None:
    os.killpg(airflow.procs[name].pid, signum)


def test_kafka_watchers_run_by_two_triggerers_at_once_lose_nothing(ha: HaStack) -> None:
    """
    The overlap a loaded machine produced by itself: a triggerer misses its heartbeats past the
    threshold (here: frozen with SIGSTOP), another takes its watchers over and starts them, then
    it wakes up and runs the same watchers until its next look at the ``trigger`` table. Every
    watcher still sees every record; what both ran may come twice, and nothing after.
    """
    airflow = ha.airflow
    airflow.start_component("triggerer", "--capacity", str(CAPACITY[THIRD]), name=THIRD)
    wait_until(lambda: len(ha.triggerer_jobs()) == 3, 120, f"{THIRD} to register its job", interval=0.5)
    frozen, frozen_job, peer, peer_job = _the_triggerer_running_kafka_watchers(ha)
    moved = _kafka_watchers_on(ha, frozen_job)
    before, while_frozen, overlapping, after = (_events(f"ha-overlap-{i}", 15) for i in range(1, 5))
    ids = _ids(before) | _ids(while_frozen) | _ids(overlapping) | _ids(after)
    ha.kafka.produce(TOPIC, before, key_field="event_id")
    _wait_until_every_kafka_watcher_saw(ha, _ids(before), "every Kafka watcher to see the first batch")

    mark = _log_size(airflow, peer)
    _signal_group(airflow, frozen, signal.SIGSTOP)
    try:
        ha.kafka.produce(TOPIC, while_frozen, key_field="event_id")
        _wait_for_the_move(ha, moved, peer, peer_job, mark)
        frozen_mark = _log_size(airflow, frozen)
    finally:
        _signal_group(airflow, frozen, signal.SIGCONT)
    # Both triggerers run the moved watchers now, until the one that woke up drops them.
    ha.kafka.produce(TOPIC, overlapping, key_field="event_id")

    triggers = airflow.watcher_trigger_ids()

    def dropped() -> bool:
        # Once each moved Kafka trigger has left its loop there, it can fire no event any more.
        lines = [
            line
            for line in _log_since(airflow, frozen, frozen_mark).splitlines()
            if "Trigger cancelled by user action" in line
        ]
        return all(any(re.search(rf"\bID {triggers[w]}\b", line) for line in lines) for w in moved)

    wait_until(dropped, 120, f"{frozen} to drop the watchers it no longer owns", interval=0.5)
    assert airflow.procs[frozen].poll() is None, tail(airflow.log_path(frozen))
    ha.kafka.produce(TOPIC, after, key_field="event_id")
    try:
        _wait_until_every_kafka_watcher_saw(
            ha, ids, "every Kafka watcher to see every record through the overlap"
        )
    finally:
        print(
            f"\nKafka, {len(ids)} records; {frozen} (job {frozen_job}) frozen past the health-check"
            f" threshold, its watchers started on {peer}, then woken up: both ran them until it dropped"
            " them:"
        )
        print(ha.share_table(KAFKA_WATCHERS, "value", ids))
    batches = {"before": before, "frozen": while_frozen, "overlap": overlapping, "after": after}
    _duplicates_report(ha, batches, settled="after")
