"""
The one-command demo: a broker, Spark and Airflow on this machine, and a stream of order events.

Run through ``scripts/demo.sh`` (which builds ``.venv/`` first). It starts, on free loopback
ports and in a fresh work directory:

* a broker: noida-db speaking the Kafka protocol (default), moto's SQS server (``--broker sqs``),
  or the Service Bus test server, a protocol-level AMQP fake (``--broker servicebus``);
* a Spark standalone cluster (master with a JWS-protected REST API, one worker);
* Airflow 3.3 (dag-processor, scheduler, triggerer, api-server) serving that broker's example
  pipeline from ``example_dags/``;

then publishes a realistic stream of order events, shows the pipeline's progress, prints a
summary (events, asset events, Dag runs, Spark applications, rows written, latencies) and where
to open the Airflow UI, and stops every process it started, also on Ctrl-C or failure
(``--keep`` leaves everything running until Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
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
from tests.support.order_events import expectation, order_stream  # noqa: E402
from tests.support.pipeline import (  # noqa: E402
    SPARK_TASKS,
    PipelineState,
    latencies,
    parquet_event_ids,
    summarize_runs,
    wait_for_pipeline,
)
from tests.support.servicebus_server import ServiceBusServer  # noqa: E402
from tests.support.spark import spark_standalone_cluster  # noqa: E402

BROKERS = {
    # broker -> (Dag file, Dag id, envelope key of the message body)
    "kafka": ("kafka_orders_pipeline.py", "kafka_orders_pipeline", "value"),
    "sqs": ("sqs_orders_pipeline.py", "sqs_orders_pipeline", "body"),
    "servicebus": ("servicebus_orders_pipeline.py", "servicebus_orders_pipeline", "body"),
}
BROKER_NAMES = {
    "kafka": "noida-db, Kafka protocol",
    "sqs": "moto, SQS",
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
        self._extra = 0

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

    def next_message(self) -> set[str]:
        """The stream's next message, for asset events that wait for one (see ``pipeline.stranded``)."""
        self._extra += 1
        event = {
            **order_stream(1, tag=f"demo-next{self._extra}", seed=1000 + self._extra)[0],
            "type": "order_created",
            "amount": 99.0,
        }
        event["order_id"] = event.get("order_id") or f"o-next-{self._extra}"
        self._send(event)
        return {event["event_id"]}


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
    _, dag_id, body_key = BROKERS[args.broker]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="airflow-shared-stream-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    data_dir = work / "data"
    say(f"work directory: {work}")

    with contextlib.ExitStack() as stack:
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

            def broker_state() -> str:
                end = kafka.end_offsets("orders")
                committed = kafka.committed("airflow-orders-pipeline", "orders")
                dead = len(kafka.read_all("orders.dlq", timeout=2))
                return f"topic orders end offsets {end}, group committed {committed}; {dead} on orders.dlq"
        elif args.broker == "servicebus":
            servicebus = stack.enter_context(ServiceBusServer())
            servicebus.create_queue("orders")
            env["AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT"] = json.dumps(servicebus.connection())
            env["ORDERS_SERVICEBUS_QUEUE"] = "orders"

            def send(batch: list[dict[str, Any]]) -> None:
                servicebus.send("orders", batch)

            def broker_state() -> str:
                waiting = len(servicebus.messages("orders"))
                dead = len(servicebus.dead_letters("orders"))
                return f"queue orders holds {waiting}; {dead} on orders/$DeadLetterQueue"
        else:
            sqs = stack.enter_context(sqs_server_process())
            dlq_url = sqs.create_queue("orders-dlq")
            queue_url = sqs.create_queue("orders", dead_letter_queue_url=dlq_url)
            env["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(sqs.connection())
            env["ORDERS_SQS_QUEUE_URL"] = queue_url
            env["ORDERS_SQS_DEAD_LETTER_QUEUE_URL"] = dlq_url

            def send(batch: list[dict[str, Any]]) -> None:
                sqs.send(queue_url, batch)

            def broker_state() -> str:
                depth = sqs.depth(queue_url)
                dead = sqs.depth(dlq_url).visible
                return f"queue orders {depth}; {dead} on orders-dlq"

        say("starting Spark standalone (master with JWS-protected REST API, one worker)")
        spark = stack.enter_context(spark_standalone_cluster(work / "spark", worker_cores=4))
        env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(
            {"conn_type": "spark", "host": "local[1]", "extra": {}}
        )
        env["AIRFLOW_CONN_SPARK_CLUSTER"] = spark.connection_json()
        env["SHARED_STREAM_SPARK_DEFERRABLE_CONN_ID"] = "spark_cluster"

        say("starting Airflow 3.3: db migrate, dag-processor, scheduler, triggerer, api-server (~1 min)")
        airflow = AirflowDeployment(
            home=work / "airflow", dags_folder=_dags_folder(work, args.broker), env=env
        )
        stack.callback(airflow.stop)
        airflow.start()
        airflow.wait_for_dags({dag_id})
        watchers = {n for n in airflow.watcher_trigger_ids() if n.startswith(f"{args.broker}_")}
        airflow.wait_for_watchers(watchers)
        say(f"Airflow UI: {airflow.api_url}  (Dag {dag_id}, {len(watchers)} watchers sharing one stream)")

        events = order_stream(args.events, tag="demo", seed=int(time.time()))
        publisher = Publisher(send, events, args.rate)
        say(f"publishing {len(events)} order events at {args.rate:g}/s")
        started = time.monotonic()
        publisher.start()
        ids = {e["event_id"] for e in events}
        rows = expectation(args.broker, events).rows
        state = wait_for_pipeline(
            airflow,
            dag_id,
            args.broker,
            body_key,
            ids,
            rows,
            timeout=args.timeout,
            nudge=lambda: set() if publisher.is_alive() else publisher.next_message(),
            progress=_progress_printer(publisher, len(events)),
        )
        publisher.join()
        if publisher.error is not None:
            raise publisher.error
        elapsed = time.monotonic() - started
        _summary(args, airflow, state, publisher, data_dir, broker_state(), elapsed)
        if args.keep:
            say(f"--keep: everything keeps running. Airflow UI {airflow.api_url}. Ctrl-C stops it all.")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        say("stopping every process the demo started")
    if not args.keep and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


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
    for name, latency in latencies(state, publisher.published_at, want.rows & state.event_ids).items():
        print(f"  latency            message -> {name}: {latency}")
    print(f"  broker             {broker}")
    print(f"  Airflow UI         {airflow.api_url}/dags/{BROKERS[args.broker][1]}  (no login needed)")
    print("=" * 78 + "\n", flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted: everything the demo started has been stopped")
        sys.exit(130)
