"""
A stream that cannot start says why, in one of the common error kinds, and shows no secret.

:class:`ConnectionContract`: an upstream that does not exist is a
:class:`~airflow_shared_stream.common.errors.SharedStreamNotFoundError`, refused credentials a
``SharedStreamAccessError``, an endpoint that does not answer as the broker a
``SharedStreamEndpointError``, wrong arguments a ``SharedStreamConfigurationError`` before any
I/O. A user catches one kind for every broker; none of them, nor the logs, carries the
connection's secret (broker SDKs quote signed requests, SASL passwords and connection strings).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable

import pytest

from airflow_shared_stream.common.errors import (
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamEndpointError,
    SharedStreamNotFoundError,
)
from airflow_shared_stream.testing import SharedStreamHarness
from tests.integration.contract.broker import BrokenConnection, ContractBroker

pytestmark = pytest.mark.integration


async def fails_with(broken: BrokenConnection, caplog: pytest.LogCaptureFixture) -> BaseException:
    """Run the trigger until its stream fails; check the failure and every log line for the secret."""
    caplog.set_level(logging.DEBUG)
    assert broken.secret not in json.dumps(broken.trigger.serialize(), default=str)
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        error = await harness.add(broken.trigger).wait_for_error(timeout=90)
    for text in (str(error), repr(error), repr(error.__cause__), repr(error.__context__), caplog.text):
        assert broken.secret not in text, f"the secret shows in: {text[:300]}"
    return error


def wrongly_taken(builds: dict[str, Callable[[], object]]) -> list[str]:
    """The constructions that did not raise a configuration error, and what they did instead."""
    taken = []
    for name, build in builds.items():
        try:
            build()
        except SharedStreamConfigurationError:
            continue
        except Exception as exc:
            taken.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            taken.append(f"{name}: accepted")
    return taken


class ConnectionContract:
    """Error kinds for what stops a stream before its first message (subclass with ``contract_broker``)."""

    async def test_a_missing_upstream_is_a_not_found_error(
        self, contract_broker: ContractBroker, request, caplog
    ):
        error = await fails_with(contract_broker.missing_upstream(request), caplog)
        assert isinstance(error, SharedStreamNotFoundError), repr(error)

    async def test_refused_credentials_are_an_access_error_without_the_secret(
        self, contract_broker: ContractBroker, request, caplog
    ):
        error = await fails_with(contract_broker.refused_credentials(request), caplog)
        assert isinstance(error, SharedStreamAccessError), repr(error)

    async def test_an_endpoint_that_does_not_answer_is_an_endpoint_error(
        self, contract_broker: ContractBroker, request, caplog
    ):
        error = await fails_with(contract_broker.unreachable_endpoint(request), caplog)
        assert isinstance(error, SharedStreamEndpointError), repr(error)

    def test_bad_broker_arguments_are_a_configuration_error(self, contract_broker: ContractBroker):
        assert not wrongly_taken(contract_broker.bad_arguments())

    def test_bad_common_arguments_are_a_configuration_error(self, contract_broker: ContractBroker):
        stream = contract_broker.create_stream(dead_letter=False)
        wrong = {
            "match": {"match": "body.["},
            "reject": {"reject": "body.["},
            "max_in_flight out of range": {"max_in_flight": 0},
            "max_in_flight not an int": {"max_in_flight": "ten"},
            "max_payload_bytes": {"max_payload_bytes": 0},
        }
        builds = {
            name: functools.partial(contract_broker.trigger, stream, **kw) for name, kw in wrong.items()
        }
        assert not wrongly_taken(builds)
