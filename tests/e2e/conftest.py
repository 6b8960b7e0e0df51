"""
The e2e rig: noida-db (Kafka protocol), moto's SQS server, Google's Pub/Sub emulator, the Service
Bus test server (a protocol-level AMQP fake, tests/support/servicebus_server.py), a Spark
standalone cluster (master + worker) and a PostgreSQL 15 cluster, started once per session (each
only when a test module needs it); and one Airflow 3.3 deployment per test module, serving only
that module's Dags, on the metadata database the module chooses.

Which pipeline runs on which database (each pipeline once, to keep the suite's time): the Kafka
pipeline and the Pub/Sub pipeline on PostgreSQL (production's database, row locks, ``ON
CONFLICT``), the SQS and Service Bus pipelines on SQLite (the embedded default, ``merge``), all
with ``[shared_stream] requeue_stranded_asset_events`` on. The pipelines of one database share
one deployment (:data:`SHARED_DEPLOYMENTS`, :func:`pipeline_stack`): their modules run one after
the other, and a deployment costs half a minute to start. A module that needs a deployment of
its own uses ``airflow_stack(..., database="postgresql")`` (see :func:`airflow_stack`). One
Airflow (~1 GB) is alive at a time. Anything that cannot start fails loudly, never skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.airflow import AirflowDeployment, airflow_deployment
from tests.support.brokers import KafkaBroker, SqsServer, kafka_broker_process, sqs_server_process
from tests.support.pipeline import latency_table
from tests.support.postgres import PostgresServer, postgres_server
from tests.support.pubsub_emulator import PubSubEmulator, pubsub_emulator_process
from tests.support.servicebus_server import ServiceBusServer
from tests.support.spark import SparkCluster, spark_standalone_cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DAGS = REPO / "example_dags"
SITE = Path(sysconfig.get_paths()["purelib"])

KAFKA_TOPIC = "orders"
KAFKA_DEAD_LETTER_TOPIC = "orders.dlq"
KAFKA_GROUP_ID = "airflow-orders-pipeline"
SQS_QUEUE = "orders"
SQS_DEAD_LETTER_QUEUE = "orders-dlq"
PUBSUB_TOPIC = "orders"
PUBSUB_SUBSCRIPTION = "orders-airflow"
PUBSUB_DEAD_LETTER_TOPIC = "orders-dlq"
PUBSUB_DEAD_LETTER_READER = "orders-dlq-reader"

SERVICEBUS_QUEUE = "orders"

WATCHERS = {
    f"{source}_{name}_watcher"
    for source in ("kafka", "sqs", "pubsub", "servicebus")
    for name in ("orders_created", "orders_cancelled", "large_orders")
}
DAG_FILES = {
    "kafka": "kafka_orders_pipeline.py",
    "sqs": "sqs_orders_pipeline.py",
    "pubsub": "pubsub_orders_pipeline.py",
    "servicebus": "servicebus_orders_pipeline.py",
}
SHARED_DAG_FILES = ("order_pipeline.py", ".airflowignore", "spark_jobs")
MITIGATION_ENV = "AIRFLOW__SHARED_STREAM__REQUEUE_STRANDED_ASSET_EVENTS"

LATENCY_RESULTS = REPO / "bench" / "results" / "e2e_latency.md"
LATENCY_HEADER = """# End-to-end latency of the example pipelines

Recorded by `RECORD_E2E_LATENCY=1 .venv/bin/python -m pytest tests/e2e` on a 2-core, 24 GB
machine: real broker, Spark standalone (master + 1 worker), Airflow 3.3.2 with LocalExecutor
(parallelism 4), all on one host; the metadata database is named in each row, and
`[shared_stream] requeue_stranded_asset_events` is on. Each cell is p50 / p95 / max over the
messages that became Parquet rows, measured from the publisher's send time to: the first asset
event (persisted), the moment the Dag could start a run for it (its asset event exists and the
Dag is below `max_active_runs`), the creation and the start of the Dag run that consumed it, and
the end of each Spark task of that run. `scheduler wait` is run created minus could start: the
wait the scheduler adds, apart from the one the Dag's own `max_active_runs=1` imposes.

"""


@dataclass
class Stack:
    """Everything the e2e tests talk to."""

    airflow: AirflowDeployment
    kafka: KafkaBroker
    sqs: SqsServer
    spark: SparkCluster
    data_dir: Path
    sqs_queue_url: str
    sqs_dead_letter_queue_url: str
    pubsub: PubSubEmulator | None = None
    servicebus: ServiceBusServer | None = None
    servicebus_queue: str = SERVICEBUS_QUEUE


@pytest.fixture(scope="session")
def e2e_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def kafka(e2e_dir: Path) -> Iterator[KafkaBroker]:
    with kafka_broker_process(e2e_dir / "kafka") as broker:
        broker.create_topics([KAFKA_TOPIC, KAFKA_DEAD_LETTER_TOPIC])
        yield broker


@pytest.fixture(scope="session")
def sqs(e2e_dir: Path) -> Iterator[SqsServer]:
    with sqs_server_process() as server:
        yield server


@pytest.fixture(scope="session")
def pubsub(e2e_dir: Path) -> Iterator[PubSubEmulator]:
    (e2e_dir / "pubsub").mkdir()
    with pubsub_emulator_process(e2e_dir / "pubsub") as emulator:
        topic = emulator.create_topic(PUBSUB_TOPIC)
        dead_letter_topic = emulator.create_topic(PUBSUB_DEAD_LETTER_TOPIC)
        emulator.create_subscription(topic, PUBSUB_SUBSCRIPTION, ack_deadline_seconds=20)
        emulator.create_subscription(dead_letter_topic, PUBSUB_DEAD_LETTER_READER)
        yield emulator


@pytest.fixture(scope="session")
def servicebus() -> Iterator[ServiceBusServer]:
    """The Service Bus fake on a reactor thread of this process; the triggerer connects over TCP."""
    server = ServiceBusServer()
    try:
        server.start()
    except Exception as exc:
        raise RuntimeError(f"the Service Bus test server (proton) could not start: {exc}") from exc
    try:
        server.create_queue(SERVICEBUS_QUEUE)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark(e2e_dir: Path) -> Iterator[SparkCluster]:
    # 4 scheduling slots on 2 real cores: both Dags can have an application running at once.
    with spark_standalone_cluster(e2e_dir / "spark", worker_cores=4) as cluster:
        yield cluster


def stack_env(
    kafka: KafkaBroker,
    sqs: SqsServer,
    spark: SparkCluster,
    data_dir: Path,
    queue_url: str,
    dlq_url: str,
    servicebus: ServiceBusServer | None = None,
    pubsub: PubSubEmulator | None = None,
) -> dict[str, str]:
    """Connections (``AIRFLOW_CONN_*``) and settings (plain environment variables) of the example Dags."""
    return {
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {
                "conn_type": "kafka",
                "extra": {"bootstrap.servers": kafka.bootstrap, "auto.offset.reset": "earliest"},
            }
        ),
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(sqs.connection()),
        # Stock SparkSubmitOperator: a local driver inside the Airflow worker (holds its slot);
        # on two cores a client-mode executor on the cluster would only add a JVM.
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[1]", "extra": {}}),
        # Deferrable operator: cluster mode over the JWS-protected REST API.
        "AIRFLOW_CONN_SPARK_CLUSTER": spark.connection_json(),
        "SHARED_STREAM_DATA_DIR": str(data_dir),
        "SHARED_STREAM_SPARK_CONN_ID": "spark_default",
        "SHARED_STREAM_SPARK_DEFERRABLE_CONN_ID": "spark_cluster",
        "ORDERS_KAFKA_TOPIC": KAFKA_TOPIC,
        "ORDERS_KAFKA_DEAD_LETTER_TOPIC": KAFKA_DEAD_LETTER_TOPIC,
        "ORDERS_KAFKA_GROUP_ID": KAFKA_GROUP_ID,
        "ORDERS_SQS_QUEUE_URL": queue_url,
        "ORDERS_SQS_DEAD_LETTER_QUEUE_URL": dlq_url,
        # Pub/Sub: the emulator for every Google client in the deployment, and the connection
        # naming its project.
        **(
            {
                **pubsub.env(),
                "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(pubsub.connection()),
                "ORDERS_PUBSUB_SUBSCRIPTION": PUBSUB_SUBSCRIPTION,
                "ORDERS_PUBSUB_DEAD_LETTER_TOPIC": PUBSUB_DEAD_LETTER_TOPIC,
            }
            if pubsub is not None
            else {}
        ),
        **(
            {
                "AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT": json.dumps(servicebus.connection()),
                "ORDERS_SERVICEBUS_QUEUE": SERVICEBUS_QUEUE,
            }
            if servicebus is not None
            else {}
        ),
    }


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def dags_folder(root: Path, brokers: tuple[str, ...]) -> Path:
    """Only these brokers' Dags: two deployments must never run the same watchers."""
    folder = root / "dags"
    folder.mkdir(parents=True)
    for name in (*(DAG_FILES[b] for b in brokers), *SHARED_DAG_FILES):
        (folder / name).symlink_to(EXAMPLE_DAGS / name)
    return folder


@contextlib.contextmanager
def airflow_stack(
    request: pytest.FixtureRequest,
    e2e_dir: Path,
    brokers: tuple[str, ...],
    *,
    database: str,
    mitigation: bool = True,
) -> Iterator[Stack]:
    """
    An Airflow deployment serving ``brokers``' example pipelines on ``database``
    (``"sqlite"`` or ``"postgresql"``: a fresh database on the session's PostgreSQL cluster).
    """
    name = f"airflow-{'-'.join(brokers)}-{database}"
    kafka: KafkaBroker = request.getfixturevalue("kafka")
    sqs: SqsServer = request.getfixturevalue("sqs")
    spark: SparkCluster = request.getfixturevalue("spark")
    database_url = None
    if database == "postgresql":
        database_url = request.getfixturevalue("postgres").create_database(name.replace("-", "_"))
    data_dir = e2e_dir / "data"
    dlq_url = sqs.create_queue(SQS_DEAD_LETTER_QUEUE)
    queue_url = sqs.create_queue(SQS_QUEUE, dead_letter_queue_url=dlq_url)
    servicebus: ServiceBusServer | None = (
        request.getfixturevalue("servicebus") if "servicebus" in brokers else None
    )
    pubsub: PubSubEmulator | None = request.getfixturevalue("pubsub") if "pubsub" in brokers else None
    env = stack_env(kafka, sqs, spark, data_dir, queue_url, dlq_url, servicebus, pubsub)
    env[MITIGATION_ENV] = str(mitigation)
    home = e2e_dir / name
    with airflow_deployment(home, dags_folder(home, brokers), env, database_url=database_url) as airflow:
        airflow.wait_for_dags({f"{b}_orders_pipeline" for b in brokers})
        yield Stack(
            airflow=airflow,
            kafka=kafka,
            sqs=sqs,
            pubsub=pubsub,
            spark=spark,
            data_dir=data_dir,
            sqs_queue_url=queue_url,
            sqs_dead_letter_queue_url=dlq_url,
            servicebus=servicebus,
        )


SHARED_DEPLOYMENTS = {"postgresql": ("kafka", "pubsub"), "sqlite": ("servicebus", "sqs")}
"""Database -> the brokers whose example pipelines one deployment on it serves."""


def shared_deployment_of(broker: str) -> str:
    return next(database for database, brokers in SHARED_DEPLOYMENTS.items() if broker in brokers)


class SharedStacks:
    """
    The deployment of :data:`SHARED_DEPLOYMENTS` the current pipeline module uses, if any.

    Kept for the next module when that module's ``BROKER`` uses the same one (collection order:
    the modules of one deployment are adjacent), stopped otherwise, so no other deployment of
    the session ever runs beside it.
    """

    def __init__(self) -> None:
        self.database: str | None = None
        self.stack: Stack | None = None
        self._exit: contextlib.ExitStack | None = None

    def get(self, request: pytest.FixtureRequest, e2e_dir: Path, broker: str) -> Stack:
        database = shared_deployment_of(broker)
        if self.database != database:
            self.close()
            exits = contextlib.ExitStack()
            stack = exits.enter_context(
                airflow_stack(request, e2e_dir, SHARED_DEPLOYMENTS[database], database=database)
            )
            self.database, self.stack, self._exit = database, stack, exits
        assert self.stack is not None
        return self.stack

    def release_after(self, request: pytest.FixtureRequest) -> None:
        """At the end of a module: stop the deployment unless the next module uses it too."""
        items = request.session.items
        module = request.module
        later = [i for i, item in enumerate(items) if getattr(item, "module", None) is module]
        following = items[later[-1] + 1] if later and later[-1] + 1 < len(items) else None
        next_broker = getattr(getattr(following, "module", None), "BROKER", None)
        if next_broker is None or shared_deployment_of(next_broker) != self.database:
            self.close()

    def close(self) -> None:
        if self._exit is not None:
            self._exit.close()
        self.database, self.stack, self._exit = None, None, None


@pytest.fixture(scope="session")
def shared_stacks() -> Iterator[SharedStacks]:
    stacks = SharedStacks()
    try:
        yield stacks
    finally:
        stacks.close()


@contextlib.contextmanager
def pipeline_stack(
    request: pytest.FixtureRequest, e2e_dir: Path, shared_stacks: SharedStacks, broker: str
) -> Iterator[Stack]:
    """
    The deployment serving ``broker``'s pipeline, shared with the other pipelines of its database
    (the module must set ``BROKER = broker``, which is how the next module's choice is read).
    """
    try:
        yield shared_stacks.get(request, e2e_dir, broker)
    finally:
        shared_stacks.release_after(request)


@pytest.fixture(scope="session")
def latency_log() -> Iterator[dict[str, Any]]:
    """
    Latencies the pipeline tests measured, by scenario.

    With ``RECORD_E2E_LATENCY=1`` they are written to ``bench/results/e2e_latency.md`` at the
    end of the session (the docs include that file); otherwise they are only printed.
    """
    log: dict[str, Any] = {}
    yield log
    if not log:
        return
    table = latency_table(log)
    print("\n" + table)
    if os.environ.get("RECORD_E2E_LATENCY") == "1":
        LATENCY_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        from bench.machine import describe

        machine = describe(["apache-airflow", "aiokafka", "aiobotocore", "psycopg2-binary", "pyspark"])
        LATENCY_RESULTS.write_text(LATENCY_HEADER + machine + "\n\n" + table + "\n")
