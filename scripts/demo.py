"""
The one-command demo: a broker, Spark and Airflow on this machine, and a stream of order events.

Run through ``scripts/demo.sh`` (which builds ``.venv/`` first). It starts, on free loopback
ports and in a fresh work directory:

* a broker: noida-db speaking the Kafka protocol (default), moto's SQS server (``--broker sqs``),
  Google's Pub/Sub emulator (``--broker pubsub``),
  or the Service Bus test server, a protocol-level AMQP fake (``--broker servicebus``);
* a Spark standalone cluster (master with a JWS-protected REST API, one worker);
* Airflow 3.3 (dag-processor, scheduler, triggerer, api-server) serving that broker's example
  pipeline from ``example_dags/``, on SQLite (default) or a throwaway PostgreSQL 15 cluster
  (``--database postgres``), with ``[shared_stream] requeue_stranded_asset_events`` on;

then publishes a realistic stream of order events (and nothing after it), shows the pipeline's
progress, prints a summary (events, asset events, Dag runs, Spark applications, rows written,
latencies) and where to open the Airflow UI, and stops every process it started, also on Ctrl-C
or failure (``--keep`` leaves everything running until Ctrl-C; ``--busy N`` spins N processes
beside it, a busy machine). A run that succeeded removes its
work directory; one that failed or was interrupted keeps it, with every log, and prints where.

It checks its own result: the exit status is 1, with what is missing, when the rows written
differ from the rows expected, a Dag run failed, a message was consumed by no run, or the broker
did not advance to its end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.airflow import AirflowDeployment  # noqa: E402
from tests.support.brokers import kafka_broker_process, sqs_server_process  # noqa: E402
from tests.support.demo_work_dir import clean_up_or_keep  # noqa: E402
from tests.support.machine_load import busy_processes, deadlocked_lines, load_average  # noqa: E402
from tests.support.order_events import expectation, order_stream  # noqa: E402
from tests.support.pipeline import (  # noqa: E402
    SPARK_TASKS,
    PipelineState,
    dag_wait_note,
    latencies,
    latency_table,
    parquet_event_ids,
    summarize_runs,
    wait_for_pipeline,
)
from tests.support.postgres import postgres_server  # noqa: E402
from tests.support.pubsub_emulator import pubsub_emulator_process  # noqa: E402
from tests.support.servicebus_server import ServiceBusServer  # noqa: E402
from tests.support.spark import spark_standalone_cluster  # noqa: E402

MITIGATION_ENV = "AIRFLOW__SHARED_STREAM__REQUEUE_STRANDED_ASSET_EVENTS"

BROKERS = {
    # broker -> (Dag file, Dag id, envelope key of the message body)
    "kafka": ("kafka_orders_pipeline.py", "kafka_orders_pipeline", "value"),
    "sqs": ("sqs_orders_pipeline.py", "sqs_orders_pipeline", "body"),
    "pubsub": ("pubsub_orders_pipeline.py", "pubsub_orders_pipeline", "body"),
    "servicebus": ("servicebus_orders_pipeline.py", "servicebus_orders_pipeline", "body"),
}
BROKER_NAMES = {
    "kafka": "noida-db, Kafka protocol",
    "sqs": "moto, SQS",
    "pubsub": "Google's Pub/Sub emulator",
    "servicebus": "the Service Bus test server: a protocol-level AMQP fake",
}
SHARED_DAG_FILES = ("order_pipeline.py", ".airflowignore", "spark_jobs")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument(
        "--broker", choices=sorted(BROKERS), default="kafka", help="default: kafka (noida-db)"
    )
    parser.add_argument("--events", type=int, default=40, help="order events to publish (default 40)")
    parser.add_argument("--rate", type=float, default=10.0, help="events per second (default 10)")
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="Airflow's metadata database (default sqlite; postgres: a throwaway PostgreSQL 15 cluster)",
    )
    parser.add_argument(
        "--core-scheduling",
        action="store_true",
        help="turn [shared_stream] requeue_stranded_asset_events off, to see Airflow 3.3's stranded events",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="run N processes spinning a core each for the whole demo (a busy machine; default 0)",
    )
    parser.add_argument("--keep", action="store_true", help="leave everything running after the summary")
    parser.add_argument("--work-dir", type=Path, help="default: a fresh directory under the system temp dir")
    parser.add_argument("--timeout", type=float, default=1500, help="seconds to wait for the pipeline")
    return parser.parse_args(argv)


def _dags_folder(work: Path, broker: str) -> Path:
    """Only this broker's Dag (and what it imports): the other broker is not running."""
    folder = work / "dags"
    folder.mkdir(parents=True)
    for name in (BROKERS[broker][0], *SHARED_DAG_FILES):
        (folder / name).symlink_to(REPO / "example_dags" / name)
    return folder


def _canary(broker: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """The first event that becomes a row: published alone, it shows when the stream consumes."""
    return next(e for e in events if expectation(broker, [e]).rows)


def _start_up(
    airflow: AirflowDeployment,
    dag_id: str,
    broker: str,
    body_key: str,
    publisher: Publisher,
    canary: dict[str, Any],
    timeout: float,
) -> float:
    """
    Publish ``canary`` and wait for its first asset event: seconds from the watchers running to
    the stream consuming. Waiting for the watchers to be assigned is not enough: a message sent
    then waits for the stream to start, and its latency would count the start-up (issue 50).
    """
    from tests.support.pipeline import snapshot

    running = time.time()
    publisher.send_now(canary)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        first = snapshot(airflow, dag_id, broker, body_key, {canary["event_id"]}).first_asset_event
        if canary["event_id"] in first:
            return first[canary["event_id"]].timestamp.timestamp() - running
        airflow.check_alive()
        time.sleep(0.2)
    raise AssertionError(f"the stream did not consume its first event within {timeout:.0f} s")


class Publisher(threading.Thread):
    """Publishes the stream at a steady rate, remembering when each event was sent."""

    def __init__(self, send: Any, events: list[dict[str, Any]], rate: float) -> None:
        super().__init__(daemon=True, name="publisher")
        self.send = send
        self.events = list(events)
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.published: list[dict[str, Any]] = []
        self.published_at: dict[str, float] = {}
        self.error: BaseException | None = None
        self.startup: float | None = None
        """Seconds from the watchers running to the stream consuming its first event."""
        self.first: str | None = None
        """The event published alone before the others, to measure the start-up."""

    def send_now(self, event: dict[str, Any]) -> None:
        """Publish one event before the stream (the start-up canary)."""
        self.first = event["event_id"]
        self._send(event)

    def run(self) -> None:
        try:
            for event in self.events:
                self._send(event)
                time.sleep(self.interval)
        except BaseException as exc:
            self.error = exc

    def _send(self, event: dict[str, Any]) -> None:
        self.published_at[event["event_id"]] = time.time()
        self.send([event])
        self.published.append(event)


def _progress_printer(publisher: Publisher, total: int) -> Any:
    last = {"line": "", "at": 0.0}

    def show(state: PipelineState) -> None:
        runs = Counter(r.state for r in state.runs)
        spark_done = sum(1 for key in state.task_end if key[1] in SPARK_TASKS)
        line = (
            f"published {len(publisher.published)} of {total}"
            f"  asset events {sum(map(len, state.asset_events.values()))}"
            f"  Dag runs {dict(runs) or 0}  Spark applications finished {spark_done}"
        )
        now = time.monotonic()
        if line != last["line"] or now - last["at"] > 15:
            say(line)
            last.update(line=line, at=now)

    return show


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _interrupt)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's per-request access log
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="airflow-shared-stream-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"work directory: {work}")
    problems: list[str] = ["the demo stopped before its summary"]
    try:
        problems = _run(args, work)
    finally:
        temporary = not args.keep and args.work_dir is None
        clean_up_or_keep(work, succeeded=not problems, temporary=temporary, say=say)
    if problems:
        say("FAILED: " + " | ".join(problems))
        return 1
    say("OK: every message reached its rows, every Dag run succeeded, the broker is at its end")
    return 0


def _run(args: argparse.Namespace, work: Path) -> list[str]:
    """Start everything, publish the stream, wait for the pipeline; what went wrong, in words."""
    _, dag_id, body_key = BROKERS[args.broker]
    data_dir = work / "data"
    with contextlib.ExitStack() as stack:
        if args.busy:
            say(f"starting {args.busy} processes spinning a core each (--busy), load {load_average()}")
            stack.enter_context(busy_processes(args.busy))
        env: dict[str, str] = {"SHARED_STREAM_DATA_DIR": str(data_dir)}
        say(f"starting the broker ({BROKER_NAMES[args.broker]})")
        if args.broker == "kafka":
            kafka = stack.enter_context(kafka_broker_process(work / "kafka"))
            kafka.create_topics(["orders", "orders.dlq"])
            env["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(
                {
                    "conn_type": "kafka",
                    "extra": {"bootstrap.servers": kafka.bootstrap, "auto.offset.reset": "earliest"},
                }
            )

            def send(batch: list[dict[str, Any]]) -> None:
                kafka.produce("orders", batch, key_field="customer_id")

            def broker_state() -> tuple[str, bool]:
                end = kafka.end_offsets("orders")
                committed = kafka.committed("airflow-orders-pipeline", "orders")
                dead = len(kafka.read_all("orders.dlq", timeout=2))
                text = f"topic orders end offsets {end}, group committed {committed}; {dead} on orders.dlq"
                return text, committed == end
        elif args.broker == "pubsub":
            (work / "pubsub").mkdir()
            pubsub = stack.enter_context(pubsub_emulator_process(work / "pubsub"))
            topic = pubsub.create_topic("orders")
            dead_letter_topic = pubsub.create_topic("orders-dlq")
            subscription = pubsub.create_subscription(topic, "orders-airflow", ack_deadline_seconds=20)
            dead_letter_reader = pubsub.create_subscription(dead_letter_topic, "orders-dlq-reader")
            env.update(pubsub.env())
            env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = json.dumps(pubsub.connection())
            env["ORDERS_PUBSUB_SUBSCRIPTION"] = "orders-airflow"
            env["ORDERS_PUBSUB_DEAD_LETTER_TOPIC"] = "orders-dlq"

            def send(batch: list[dict[str, Any]]) -> None:
                pubsub.publish(topic, batch)

            def broker_state() -> tuple[str, bool]:
                left = len(pubsub.pull(subscription, ack=False))
                dead = len(pubsub.drain(dead_letter_reader, quiet_for=0.5))
                text = f"subscription orders-airflow: {left} not acknowledged; {dead} on orders-dlq"
                return text, left == 0
        elif args.broker == "servicebus":
            servicebus = stack.enter_context(ServiceBusServer())
            servicebus.create_queue("orders")
            env["AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT"] = json.dumps(servicebus.connection())
            env["ORDERS_SERVICEBUS_QUEUE"] = "orders"

            def send(batch: list[dict[str, Any]]) -> None:
                servicebus.send("orders", batch)

            def broker_state() -> tuple[str, bool]:
                waiting = len(servicebus.messages("orders"))
                dead = len(servicebus.dead_letters("orders"))
                return f"queue orders holds {waiting}; {dead} on orders/$DeadLetterQueue", waiting == 0
        else:
            sqs = stack.enter_context(sqs_server_process())
            dlq_url = sqs.create_queue("orders-dlq")
            queue_url = sqs.create_queue("orders", dead_letter_queue_url=dlq_url)
            env["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(sqs.connection())
            env["ORDERS_SQS_QUEUE_URL"] = queue_url
            env["ORDERS_SQS_DEAD_LETTER_QUEUE_URL"] = dlq_url

            def send(batch: list[dict[str, Any]]) -> None:
                sqs.send(queue_url, batch)

            def broker_state() -> tuple[str, bool]:
                depth = sqs.depth(queue_url)
                dead = sqs.depth(dlq_url).visible
                return f"queue orders {depth}; {dead} on orders-dlq", sum(depth) == 0

        say("starting Spark standalone (master with JWS-protected REST API, one worker)")
        spark = stack.enter_context(spark_standalone_cluster(work / "spark", worker_cores=4))
        env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(
            {"conn_type": "spark", "host": "local[1]", "extra": {}}
        )
        env["AIRFLOW_CONN_SPARK_CLUSTER"] = spark.connection_json()
        env["SHARED_STREAM_SPARK_DEFERRABLE_CONN_ID"] = "spark_cluster"

        database_url = None
        if args.database == "postgres":
            say("starting PostgreSQL 15 (a throwaway cluster for Airflow's metadata database)")
            database_url = stack.enter_context(postgres_server()).url()
        env[MITIGATION_ENV] = str(not args.core_scheduling)
        say(
            "starting Airflow 3.3: db migrate, dag-processor, scheduler, triggerer, api-server (~1 min); "
            f"{args.database}, requeue_stranded_asset_events={not args.core_scheduling}"
        )
        airflow = AirflowDeployment(
            home=work / "airflow",
            dags_folder=_dags_folder(work, args.broker),
            env=env,
            database_url=database_url,
        )
        stack.callback(airflow.stop)
        airflow.start()
        airflow.wait_for_dags({dag_id})
        watchers = {n for n in airflow.watcher_trigger_ids() if n.startswith(f"{args.broker}_")}
        airflow.wait_for_watchers(watchers)
        say(f"Airflow UI: {airflow.api_url}  (Dag {dag_id}, {len(watchers)} watchers sharing one stream)")
        say(f"Streams page: {airflow.api_url}/shared-stream/  (also under Browse > Streams in the UI)")

        events = order_stream(args.events, tag="demo", seed=int(time.time()))
        canary = _canary(args.broker, events)
        publisher = Publisher(send, [e for e in events if e is not canary], args.rate)
        say(f"publishing one event alone until the stream consumes it (start-up): {canary['event_id']}")
        started = time.monotonic()
        publisher.startup = _start_up(airflow, dag_id, args.broker, body_key, publisher, canary, args.timeout)
        say(f"the stream consumed it {publisher.startup:.1f} s after the watchers ran")
        say(f"publishing the other {len(events) - 1} order events at {args.rate:g}/s")
        publisher.start()
        ids = {e["event_id"] for e in events}
        rows = set(expectation(args.broker, events).rows)
        problems: list[str] = []
        try:
            state = wait_for_pipeline(
                airflow,
                dag_id,
                args.broker,
                body_key,
                ids,
                rows,
                timeout=args.timeout,
                progress=_progress_printer(publisher, len(events)),
            )
        except AssertionError as exc:
            problems.append(str(exc))
            from tests.support.pipeline import snapshot

            state = snapshot(airflow, dag_id, args.broker, body_key, ids)
        publisher.join()
        if publisher.error is not None:
            raise publisher.error
        elapsed = time.monotonic() - started
        broker, advanced = _broker_settled(broker_state)
        problems += _check(args, state, publisher, data_dir, advanced, broker)
        _summary(args, airflow, state, publisher, data_dir, broker, elapsed)
        if args.keep:
            say(
                f"--keep: everything keeps running. Airflow UI {airflow.api_url}, Streams page "
                f"{airflow.api_url}/shared-stream/. Ctrl-C stops it all."
            )
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        say("stopping every process the demo started")
    return problems


def _broker_settled(broker_state: Any, timeout: float = 60.0) -> tuple[str, bool]:
    """The broker's state once it has advanced to its end (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    text, advanced = broker_state()
    while not advanced and time.monotonic() < deadline:
        time.sleep(2)
        text, advanced = broker_state()
    return text, advanced


def _check(
    args: argparse.Namespace,
    state: PipelineState,
    publisher: Publisher,
    data_dir: Path,
    advanced: bool,
    broker: str,
) -> list[str]:
    """What is wrong with the result, in words; empty when all is well."""
    want = expectation(args.broker, publisher.published)
    problems = []
    for task in SPARK_TASKS:
        found = parquet_event_ids(data_dir / args.broker / task / "orders")
        missing, extra = want.rows - set(found), set(found) - want.rows
        duplicates = len(found) - len(set(found))
        if missing or extra or duplicates:
            problems.append(
                f"{task} wrote {len(found)} rows for {len(want.rows)} expected: "
                f"{len(missing)} missing {sorted(missing)[:5]}, {len(extra)} unexpected, "
                f"{duplicates} duplicated"
            )
    failed = [r.run_id for r in state.runs if r.state != "success"]
    if failed:
        problems.append(f"{len(failed)} Dag runs did not succeed: {failed[:5]}")
    if not advanced:
        problems.append(f"the broker did not advance to its end: {broker}")
    return problems


def _summary(
    args: argparse.Namespace,
    airflow: AirflowDeployment,
    state: PipelineState,
    publisher: Publisher,
    data_dir: Path,
    broker: str,
    elapsed: float,
) -> None:
    want = expectation(args.broker, publisher.published)
    runs = summarize_runs(state)
    types = Counter(e["type"] for e in publisher.published)
    print("\n" + "=" * 78)
    print(f"Summary ({args.broker}, {elapsed:.0f} s from first message to last Spark application)")
    print(f"  events published   {len(publisher.published)}  {dict(types)}; {len(want.rejected)} malformed")
    for asset, found in sorted(state.asset_events.items()):
        print(f"  asset events       {asset}: {len(found)}")
    print(f"  Dag runs           {runs['dag_runs']} ({runs['succeeded']} succeeded)")
    print(f"  Spark applications {runs['spark_applications']} (stock and deferrable operator)")
    for task in SPARK_TASKS:
        table = data_dir / args.broker / task / "orders"
        found = parquet_event_ids(table)
        print(f"  rows written       {task}: {len(found)} rows ({len(set(found))} distinct) in {table}")
    print(f"  expected rows      {len(want.rows)} (valid, matched, de-duplicated)")
    # Steady state: every event but the start-up canary, published once the stream consumed.
    measured = (want.rows & state.run_of_event.keys()) - {publisher.first}
    if publisher.startup is not None:
        print(f"  start-up           {publisher.startup:.1f} s from watchers running to the stream consuming")
    print(
        f"  latency            (steady state, seconds from publishing; {args.database}; "
        "the Dag's own wait and the scheduler's are rows of their own)"
    )
    table = latency_table(
        {f"{args.broker}, {args.database}": latencies(state, publisher.published_at, measured)}
    )
    print("\n".join(f"    {line}" for line in table.splitlines()))
    if (note := dag_wait_note(state, measured, publisher.first)) is not None:
        print(f"  Dag's own wait     {note}")
    print(f"  broker             {broker}")
    deadlocked = deadlocked_lines(airflow.log_path("triggerer"))
    first = f": {deadlocked[0]}" if deadlocked else ""
    print(f"  triggerer          {len(deadlocked)} 'deadlocked' lines{first}")
    print(f"  machine            load average {load_average()} (1/5/15 min), --busy {args.busy}")
    print(f"  Airflow UI         {airflow.api_url}/dags/{BROKERS[args.broker][1]}  (no login needed)")
    print(f"  Streams page       {airflow.api_url}/shared-stream/")
    print("=" * 78 + "\n", flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted: everything the demo started has been stopped")
        sys.exit(130)
