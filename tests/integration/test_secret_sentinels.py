"""
A sentinel secret in every credential field of every broker's connection never leaks.

One module for all four brokers (each on its real test broker, started by the reliability rigs of
tests/reliability/brokers.py; each broker's contract adapter builds the connections and triggers,
``use_secret_connection``): the sentinel goes into every field that holds a secret

=============  ===========================================================================
SQS            password (secret access key), extra ``aws_session_token``
Kafka          password, extra ``sasl.password`` (SASL/PLAIN: noida-db accepts any password)
Pub/Sub        extra ``keyfile_dict`` (a service-account key whose private key is the sentinel)
Service Bus    the connection string's ``SharedAccessKey`` (the fake checks the signature)
=============  ===========================================================================

and the test looks for it in everything the provider produces: logs at DEBUG (ours, Airflow's,
the SDKs'), ``serialize()`` output, trigger event payloads, metrics (a real StatsD listener),
and exception text (message, repr, the whole cause chain and traceback), on a working stream
and on failures: an endpoint where nothing listens, credentials the broker refuses, and a
credential or TLS/SASL option set wrong (which must fail with an error naming it).
The contract's ConnectionContract (tests/integration/contract/connection.py) checks each
failure's error kind for every broker; the per-broker modules (test_*errors_and_secrets.py,
Kafka's test_kafka_failures.py) keep what is broker-specific: which error class, what message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.testing import SharedStreamHarness
from tests.reliability.brokers import BROKERS, BrokerRig, broker_rig
from tests.support.statsd import StatsdListener

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SENTINEL = "SeNtInEl7c1d9e4bQ"
"""Valid in every field (an AWS secret, a SASL password, a SAS key), and found by substring."""
CONN_ID = "sentinel_conn"


@pytest.fixture(scope="module", params=BROKERS)
def rig(request: pytest.FixtureRequest) -> Iterator[BrokerRig]:
    with broker_rig(request.param) as running_rig:
        yield running_rig


@pytest.fixture
def observed(caplog: pytest.LogCaptureFixture, statsd: StatsdListener) -> Callable[[], str]:
    """Everything the provider logged or sent as metrics so far, as one text to search."""
    caplog.set_level(logging.DEBUG)
    return lambda: caplog.text + "\n" + "\n".join(statsd.read())


# -- the checks ---------------------------------------------------------------------------------


def exception_text(error: BaseException) -> str:
    """Message, repr, and the whole chain with its traceback, as a user's log would show."""
    return "\n".join([str(error), repr(error), *traceback.format_exception(error)])


def assert_no_sentinel(where: str, text: str) -> None:
    assert SENTINEL not in text, f"the secret leaked into {where}: ...{_around(text)}..."


def _around(text: str) -> str:
    at = text.find(SENTINEL)
    return text[max(0, at - 200) : at + 60]


async def test_a_working_stream_never_shows_the_secret(rig, observed, request):
    connection = rig.contract.use_secret_connection(request, CONN_ID, SENTINEL)
    stream = rig.contract.create_stream()
    trigger = rig.contract.trigger(stream, reject="body.bad", **connection)
    assert_no_sentinel("serialize()", json.dumps(trigger.serialize()))
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(trigger)
        rig.contract.publish(stream, [{"n": 1}, {"bad": True}, {"n": 2}])
        await watcher.wait_for_events(2, timeout=60)
        dead: list[Any] = []
        for _ in range(100):
            dead += rig.contract.dead_letters(stream)
            if dead:
                break
            await asyncio.sleep(0.2)
    assert dead == [{"bad": True}], "the stream did not work end to end: the test would prove nothing"
    assert_no_sentinel("trigger event payloads", json.dumps(watcher.payloads))
    assert_no_sentinel("logs or metrics", observed())
    assert "received" in observed(), "no metric reached the listener: the metrics check is blind"


@pytest.mark.parametrize("failure", ["endpoint", "auth"])
async def test_a_failing_connection_never_shows_the_secret(rig, failure, observed, request):
    stream = rig.contract.create_stream()
    connection = rig.contract.use_secret_connection(request, CONN_ID, SENTINEL, failure)
    trigger = rig.contract.trigger(stream, **connection)
    assert_no_sentinel("serialize()", json.dumps(trigger.serialize()))
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(trigger)
        error = await watcher.wait_for_error(timeout=120)
    assert_no_sentinel("the exception", exception_text(error))
    assert_no_sentinel("logs or metrics", observed())


async def test_a_misconfigured_credential_is_named_without_the_secret(rig, observed, request):
    stream = rig.contract.create_stream()
    connection, names = rig.contract.use_misconfigured_connection(request, CONN_ID, SENTINEL)
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(rig.contract.trigger(stream, **connection))
        error = await watcher.wait_for_error(timeout=60)
    assert isinstance(error, SharedStreamConfigurationError), repr(error)
    assert names in str(error)
    assert_no_sentinel("the exception", exception_text(error))
    assert_no_sentinel("logs or metrics", observed())
