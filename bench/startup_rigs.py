"""
What each trigger of ``bench/startup.py`` needs: its broker, its Dag's trigger expression, its
connections, and how to publish a canary. One per trigger under test (issue 50).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Rig:
    """What a trigger needs: its Dag's trigger expression, connections, and how to publish."""

    imports: str
    trigger: str
    env: dict[str, str]
    publish: Callable[[dict[str, Any]], object]
    payload_id: Callable[[dict[str, Any]], str | None]


def _own_match(field: str) -> str:
    """A ``match`` of its own per watcher, always true: identical triggers would be ONE trigger."""
    return f"match=f\"{field}.canary != 'none-{{n}}'\""


def _sqs_rig(stack: contextlib.ExitStack, official: bool, visibility_timeout: int = 30) -> Rig:
    from tests.support.brokers import SqsServer, moto_server

    server = stack.enter_context(moto_server(own_process=True))
    sqs = SqsServer(port=server.port)
    queue_url = sqs.create_queue(f"startup-{uuid.uuid4().hex[:8]}", visibility_timeout=visibility_timeout)
    conn = json.dumps(sqs.connection())
    if official:
        imports = "from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger"
        trigger = (
            f"MessageQueueTrigger(scheme='sqs', sqs_queue={queue_url!r}, aws_conn_id='aws_default', "
            "waiter_delay=1 + n)"
        )
    else:
        imports = "from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger"
        trigger = f"SqsSharedStreamTrigger({queue_url!r}, aws_conn_id='aws_default', {_own_match('body')})"

    def payload_id(extra: dict[str, Any]) -> str | None:
        payload = extra.get("payload") or extra
        body = payload.get("body")
        if body is None and "message_batch" in payload:  # the official trigger's batch
            body = (payload["message_batch"] or [{}])[0].get("Body")
        if isinstance(body, str):
            with contextlib.suppress(ValueError):
                body = json.loads(body)
        return body.get("canary") if isinstance(body, dict) else None

    return Rig(
        imports=imports,
        trigger=trigger,
        env={"AIRFLOW_CONN_AWS_DEFAULT": conn},
        publish=lambda body: sqs.send(queue_url, [body]),
        payload_id=payload_id,
    )


def sqs_rig(stack: contextlib.ExitStack, visibility_timeout: int) -> Rig:
    """Ours on SQS, on a queue whose leases (visibility timeout) last ``visibility_timeout`` seconds."""
    return _sqs_rig(stack, False, visibility_timeout)


def _kafka_rig(stack: contextlib.ExitStack, official: bool, broker: str = "noida-db") -> Rig:
    """
    ``broker``: noida-db answers an empty fetch at once, where Kafka (and Tansu) hold it up to
    ``fetch.max.wait.ms``; ``kafka-tansu`` measures the stream against a broker that waits as Kafka does.
    """
    from tests.support.brokers import kafka_broker_process

    data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="startup-kafka-")))
    kafka = stack.enter_context(kafka_broker_process(data_dir, broker))
    topic = f"startup-{uuid.uuid4().hex[:8]}"
    kafka.create_topics([topic])
    conn = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.bootstrap}})
    if official:
        imports = "from airflow.providers.apache.kafka.triggers.await_message import AwaitMessageTrigger"
        trigger = (
            f"AwaitMessageTrigger(topics=[{topic!r}], kafka_config_id='kafka_default', "
            "apply_function='bench.startup_trivial.kafka_value', "
            "poll_interval=0.2 + n / 100, poll_timeout=0.2)"
        )
        env = {
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                {
                    "conn_type": "kafka",
                    "extra": {
                        "bootstrap.servers": kafka.bootstrap,
                        "group.id": f"official-{topic}",
                        "auto.offset.reset": "earliest",
                    },
                }
            )
        }
    else:
        imports = "from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger"
        own = _own_match("value")
        trigger = f"KafkaSharedStreamTrigger([{topic!r}], kafka_config_id='kafka_default', {own})"
        env = {"AIRFLOW_CONN_KAFKA_DEFAULT": conn}

    def payload_id(extra: dict[str, Any]) -> str | None:
        payload = extra.get("payload") or extra
        value = payload.get("value", payload)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        return value.get("canary") if isinstance(value, dict) else None

    return Rig(
        imports=imports,
        trigger=trigger,
        env=env,
        publish=lambda body: kafka.produce(topic, [body]),
        payload_id=payload_id,
    )


def _trivial_rig(stack: contextlib.ExitStack, official: bool) -> Rig:
    return Rig(
        imports="from bench.startup_trivial import FireAtOnceTrigger",
        trigger="FireAtOnceTrigger(n)",
        env={},
        publish=lambda body: None,
        payload_id=lambda extra: "fired",
    )


def _pubsub_rig(stack: contextlib.ExitStack, official: bool) -> Rig:
    from tests.support.pubsub_emulator import pubsub_emulator_process

    data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="startup-pubsub-")))
    emulator = stack.enter_context(pubsub_emulator_process(data_dir))
    topic, subscription = emulator.topic_with_subscription(ack_deadline_seconds=30)
    return Rig(
        imports="from airflow_shared_stream.pubsub.trigger import PubSubSharedStreamTrigger",
        trigger=(
            f"PubSubSharedStreamTrigger({subscription!r}, gcp_conn_id='google_cloud_default', "
            f"{_own_match('body')})"
        ),
        env={
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(emulator.connection()),
            **emulator.env(),
        },
        publish=lambda body: emulator.publish(topic, [body]),
        payload_id=_body_canary,
    )


def _servicebus_rig(stack: contextlib.ExitStack, official: bool) -> Rig:
    from tests.support.servicebus_server import ServiceBusServerProcess

    server = ServiceBusServerProcess()
    stack.callback(server.close)
    queue = f"startup-{uuid.uuid4().hex[:8]}"
    server.call("create_queue", queue)
    return Rig(
        imports="from airflow_shared_stream.servicebus.trigger import ServiceBusSharedStreamTrigger",
        trigger=(
            f"ServiceBusSharedStreamTrigger(queue_name={queue!r}, "
            f"azure_service_bus_conn_id='azure_service_bus_default', {_own_match('body')})"
        ),
        env={"AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT": json.dumps(server.connection())},
        publish=lambda body: server.call("send", queue, [body]),
        payload_id=_body_canary,
    )


def _body_canary(extra: dict[str, Any]) -> str | None:
    payload = extra.get("payload") or extra
    body = payload.get("body")
    if isinstance(body, str):
        with contextlib.suppress(ValueError):
            body = json.loads(body)
    return body.get("canary") if isinstance(body, dict) else None


RIGS: dict[str, Callable[[contextlib.ExitStack], Rig]] = {
    "trivial": lambda stack: _trivial_rig(stack, False),
    "sqs": lambda stack: _sqs_rig(stack, False),
    "sqs-official": lambda stack: _sqs_rig(stack, True),
    "kafka": lambda stack: _kafka_rig(stack, False),
    "kafka-official": lambda stack: _kafka_rig(stack, True),
    "kafka-tansu": lambda stack: _kafka_rig(stack, False, "tansu"),
    "kafka-official-tansu": lambda stack: _kafka_rig(stack, True, "tansu"),
    "pubsub": lambda stack: _pubsub_rig(stack, False),
    "servicebus": lambda stack: _servicebus_rig(stack, False),
}
