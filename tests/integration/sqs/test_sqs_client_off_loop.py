"""
A stream builds its aiobotocore clients (SQS, and STS for a role) in a worker thread, not on the
triggerer's event loop (issue 50): building one is synchronous work (the service model, the
client class, the endpoint rules), which held the loop for 0.26 s at a stream's start on a loaded
machine. Checked against moto: which client-building functions ran on the loop's own thread.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook
from tests.integration.sqs.test_sqs_identity import _role_connection, _role_queue
from tests.support.request_log import RecordingProxy

pytestmark = pytest.mark.integration

BUILDING = {
    # aiobotocore's synchronous client construction, by (file, function)
    ("aiobotocore/session.py", "__init__"),
    ("aiobotocore/session.py", "_create_client"),
    ("aiobotocore/client.py", "create_client"),
    ("aiobotocore/client.py", "_create_client_class"),
}


@contextlib.contextmanager
def built_on_this_thread() -> Iterator[list[str]]:
    """The client-building functions that ran on the calling thread (the loop's) in the block."""
    seen: list[str] = []
    thread = threading.get_ident()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        for path, name in BUILDING:
            if code.co_name == name and code.co_filename.replace("\\", "/").endswith(path):
                assert threading.get_ident() == thread
                seen.append(f"{path}:{name}")

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


@pytest.fixture
def proxy(sqs) -> Iterator[RecordingProxy]:
    with RecordingProxy("127.0.0.1", sqs.port) as recording:
        yield recording


async def test_the_watch_sees_a_client_built_on_the_loop(sqs) -> None:
    from aiobotocore.session import AioSession

    with built_on_this_thread() as seen:
        session = AioSession()
        async with session.create_client(
            "sqs",
            region_name="us-east-1",
            endpoint_url=sqs.endpoint_url,
            aws_access_key_id="a",
            aws_secret_access_key="b",
        ):
            pass
    assert set(seen) == {f"{path}:{name}" for path, name in BUILDING}, seen


async def test_the_sqs_client_is_built_off_the_event_loop(sqs, aws_connection) -> None:
    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client

    url = sqs.create_queue()
    config = await SqsSharedStreamHook(aws_connection).aget_client_config(
        region_name=None, queue=QueueUrl.parse(url)
    )
    with built_on_this_thread() as seen:
        async with open_sqs_client(config, AioConfig(), on_secrets=lambda _secrets: None) as client:
            attributes = await client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    assert attributes["Attributes"]["QueueArn"].endswith(url.rsplit("/", 1)[1])
    assert seen == [], f"built on the event loop's thread: {seen}"


async def test_a_roles_sts_client_is_built_off_the_event_loop(sqs, proxy, monkeypatch) -> None:
    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client

    url = _role_queue(sqs)
    conn_id = _role_connection(proxy, monkeypatch, "aws_role_off_loop")
    hook = SqsSharedStreamHook(conn_id)
    config = await hook.aget_client_config(region_name=None, queue=QueueUrl.parse(url))
    with built_on_this_thread() as seen:
        async with open_sqs_client(config, AioConfig(), on_secrets=lambda _secrets: None) as client:
            await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    assert proxy.signers()[("AssumeRole", config.aws_access_key_id)] == 1, proxy.signers()
    assert seen == [], f"built on the event loop's thread: {seen}"
