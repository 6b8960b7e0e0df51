"""
One real deployment per e2e session: noida-db (Kafka protocol), moto's SQS server, the Service
Bus test server (a protocol-level AMQP fake, tests/support/servicebus_server.py), a Spark
standalone cluster (master + worker) and Airflow 3.3 serving ``example_dags/``.

Everything starts once (about a minute, most of it the Airflow api-server) and is shared by
every e2e test; each test uses its own topic/queue-independent assertions (event ids) so they
do not depend on order. Anything that cannot start fails the session loudly, never skips.
"""

from __future__ import annotations

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
SERVICEBUS_QUEUE = "orders"

WATCHERS = {
    f"{source}_{name}_watcher"
    for source in ("kafka", "sqs", "servicebus")
    for name in ("orders_created", "orders_cancelled", "large_orders")
}
DAG_IDS = {"kafka_orders_pipeline", "sqs_orders_pipeline", "servicebus_orders_pipeline"}

LATENCY_RESULTS = REPO / "bench" / "results" / "e2e_latency.md"
LATENCY_HEADER = """# End-to-end latency of the example pipelines

Recorded by `RECORD_E2E_LATENCY=1 .venv/bin/python -m pytest tests/e2e` on a 2-core, 24 GB
machine: real broker, Spark standalone (master + 1 worker, 2 cores), Airflow 3.3.2 with SQLite
and LocalExecutor (parallelism 4), all on one host. Each cell is p50 / max over the messages that
became Parquet rows, measured from the publisher's send time to: the first asset event
(persisted), the creation and the start of the Dag run that consumed it, and the end of each
Spark task of that run.
The Dags run one at a time (`max_active_runs=1`) and the two Spark tasks one after the other,
so a message that arrives while a run is busy waits for the next one.

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
    servicebus: ServiceBusServer
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
def stack(
    e2e_dir: Path, kafka: KafkaBroker, sqs: SqsServer, servicebus: ServiceBusServer, spark: SparkCluster
) -> Iterator[Stack]:
    data_dir = e2e_dir / "data"
    dlq_url = sqs.create_queue(SQS_DEAD_LETTER_QUEUE)
    queue_url = sqs.create_queue(SQS_QUEUE, dead_letter_queue_url=dlq_url)
    env = stack_env(kafka, sqs, spark, data_dir, queue_url, dlq_url, servicebus)
    with airflow_deployment(e2e_dir / "airflow", EXAMPLE_DAGS, env) as airflow:
        airflow.wait_for_dags(DAG_IDS)
        yield Stack(
            airflow=airflow,
            kafka=kafka,
            sqs=sqs,
            spark=spark,
            data_dir=data_dir,
            sqs_queue_url=queue_url,
            sqs_dead_letter_queue_url=dlq_url,
            servicebus=servicebus,
        )


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
        LATENCY_RESULTS.write_text(LATENCY_HEADER + table + "\n")
