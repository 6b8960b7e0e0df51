"""
High availability (issue 13): one Kafka topic and one SQS queue, six watchers each, spread three
and three over TWO real triggerer processes sharing one PostgreSQL metadata database.

How the watchers are spread, deterministically: the Dags are born paused; ``ha_first`` (three
Kafka and three SQS watchers) is unpaused and triggerer A starts with ``--capacity 6``, so it
takes exactly those six; then ``ha_second`` is unpaused and triggerer B starts (capacity 12, room
for A's watchers after a failover). Each watcher has its own asset, so the asset events say
which watcher saw which message; the tests print that table.

What must hold:

* Kafka: every watcher sees every record of the 3-partition topic, whichever triggerer runs it,
  and still does after triggerer A is SIGKILLed mid-stream and its watchers move to B.
* SQS (a leased queue cannot broadcast): each message reaches the watchers of one triggerer only;
  that is detected and reported loudly (an ERROR naming the queue in the triggerer log, and the
  ``triggerers`` gauge of the stream at 2), and the report clears once one triggerer runs them all.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
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
FIRST, SECOND = "triggerer-a", "triggerer-b"
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
        """Triggerer job ids in start order: the first is A's, the second B's."""
        with self.airflow.db() as conn:
            rows = conn.execute("SELECT id FROM job WHERE job_type = 'TriggererJob' ORDER BY id").fetchall()
        return [r["id"] for r in rows]

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
        names = {job: label for job, label in zip(jobs, ("A", "B"), strict=False)}
        placement = self.placement()
        seen = self.seen(body_key, ids)
        lines = [f"{'watcher':<22} triggerer  saw / sent  partitions"]
        for watcher, asset in sorted(watchers.items()):
            got = seen.get(asset, {"ids": set(), "partitions": set()})
            job = placement.get(watcher)
            where = f"{names.get(job, '?')} (job {job})" if job is not None else "-"
            parts = ",".join(str(p) for p in sorted(x for x in got["partitions"] if x is not None)) or "-"
            lines.append(f"{watcher:<22} {where:<10} {len(got['ids']):>3} / {len(ids):<4}  {parts}")
        return "\n".join(lines)


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
        _start_triggerer(airflow, FIRST, 6, DAG_WATCHERS["ha_first"])
        _unpause(airflow, "ha_second")
        _start_triggerer(airflow, SECOND, 12, DAG_WATCHERS["ha_second"])
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


def test_kafka_watchers_lose_nothing_when_a_triggerer_is_sigkilled(ha: HaStack) -> None:
    airflow = ha.airflow
    events = _events("ha-kafka-2", 40)
    ids = {e["event_id"] for e in events}

    published_at: list[float] = []

    def publish() -> None:
        for event in events:
            ha.kafka.produce(TOPIC, [event], key_field="event_id")
            published_at.append(time.time())
            time.sleep(0.1)

    def delivered() -> int:
        return len({i for s in ha.seen("value", ids).values() for i in s["ids"]})

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        wait_until(lambda: delivered() >= 5, 60, "the first records to become asset events", interval=0.5)
        airflow.kill_triggerer(FIRST)
        killed_at = time.time()
    finally:
        publisher.join()
    assert sum(t > killed_at for t in published_at) > 0, "the kill came after the whole stream was published"
    all_watchers = set(KAFKA_WATCHERS) | set(SQS_WATCHERS)
    second = ha.triggerer_jobs()[1]

    def moved() -> bool:
        placement = ha.placement()
        return all(placement.get(w) == second for w in all_watchers)

    wait_until(moved, 120, "triggerer B to take over A's watchers", interval=1)
    for name in ("dag-processor", "scheduler", SECOND):
        assert airflow.procs[name].poll() is None, tail(airflow.log_path(name))

    def everyone_saw_everything() -> bool:
        seen = ha.seen("value", ids)
        return all(seen.get(asset, {}).get("ids") == ids for asset in KAFKA_WATCHERS.values())

    try:
        wait_until(
            everyone_saw_everything, 120, "every Kafka watcher to see every record after failover", interval=1
        )
    finally:
        after = sum(t > killed_at for t in published_at)
        print(f"\nKafka, 40 records, triggerer A SIGKILLed mid-stream ({after} published after the kill):")
        print(ha.share_table(KAFKA_WATCHERS, "value", ids))
    # The placement check follows the move: the SQS stream now runs on one triggerer.
    gauge = "airflow.shared_stream.sqs.ha-orders.triggerers:1|g"
    wait_until(lambda: gauge in ha.statsd.read(), 30, gauge, interval=0.5)
