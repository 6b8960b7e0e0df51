"""
Attacks on issue 50's off-loop SQS client (``build_client_off_loop``), against moto's SQS and STS.

FAULT_MODEL class 13 (a trigger never blocks the triggerer's loop) and class 16 (the real AWS
credential chain, not only the connection's own extras).
"""

from __future__ import annotations

import json

import pytest

from airflow_shared_stream.sqs.hook import QueueUrl, SqsSharedStreamHook
from tests.integration.sqs.conftest import ACCESS_KEY, REGION, SECRET_KEY
from tests.integration.sqs.test_sqs_client_off_loop import built_on_this_thread
from tests.integration.sqs.test_sqs_identity import EXTERNAL_ID, ROLE_ARN, _role_queue, proxy  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.fixture
def profile_role(tmp_path, monkeypatch, proxy) -> str:  # noqa: F811
    """
    A profile of the triggerer's shared AWS config that is itself a role (``role_arn`` +
    ``source_profile``), the way AWS documents assuming a role from the CLI's config; its STS is
    moto, behind the recording proxy (``AWS_ENDPOINT_URL_STS``, botocore's service endpoint setting).
    """
    (tmp_path / "credentials").write_text(
        f"[source]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    (tmp_path / "config").write_text(
        f"[profile reader]\nrole_arn = {ROLE_ARN}\nsource_profile = source\n"
        f"external_id = {EXTERNAL_ID}\nregion = {REGION}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", proxy.endpoint_url)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    connection = {
        "conn_type": "aws",
        "extra": {"region_name": REGION, "endpoint_url": proxy.endpoint_url, "profile_name": "reader"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_PROFILE_READER", json.dumps(connection))
    return "aws_profile_reader"


async def test_a_profile_roles_sts_client_is_built_off_the_event_loop(sqs, proxy, profile_role) -> None:  # noqa: F811
    """
    Class 13. Issue 50's change built "the STS client when a role is assumed" off the loop, but only
    for the connection's ``role_arn``. A ``profile_name`` whose profile is a role (``role_arn`` and
    ``source_profile`` in the shared config, which ``_session`` reads through botocore's own chain)
    is assumed by aiobotocore's ``AssumeRoleProvider``: ``build_client_off_loop`` looks its
    credentials up on the loop (deferred), and the first signed request refreshes them there,
    building an STS client on the triggerer's loop (and again at every refresh, hourly). Fixed:
    ``_session`` gives the session a ``create_client`` that builds through ``build_client_off_loop``.
    """
    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client

    url = _role_queue(sqs)
    config = await SqsSharedStreamHook(profile_role).aget_client_config(
        region_name=None, queue=QueueUrl.parse(url)
    )
    with built_on_this_thread() as seen:
        async with open_sqs_client(config, AioConfig(), on_secrets=lambda _secrets: None) as client:
            await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    assert proxy.signers()[("AssumeRole", ACCESS_KEY)] == 1, proxy.signers()
    assert seen == [], f"built on the event loop's thread: {seen}"


async def test_a_roles_keys_refreshed_after_expiry_under_concurrent_calls_assume_it_once_off_the_loop(
    sqs,
    proxy,  # noqa: F811
    monkeypatch,
) -> None:
    """
    Classes 11 and 13. The role's refreshable credentials are built in a worker thread
    (``_role_session`` under ``run_off_loop``), and their refresh lock is an ``asyncio.Lock``:
    made in that thread, used on the runner's loop. After the keys expire, calls made together
    contend for it on the loop: one ``AssumeRole``, every call signed with the new keys, and the
    new STS client built in a worker thread, never on the loop.
    """
    import asyncio
    import datetime

    from aiobotocore.config import AioConfig

    from airflow_shared_stream.sqs.credentials import open_sqs_client
    from tests.integration.sqs.test_sqs_identity import _Clock, _role_connection

    url = _role_queue(sqs)
    conn_id = _role_connection(proxy, monkeypatch, "aws_role_contended")
    config = await SqsSharedStreamHook(conn_id).aget_client_config(
        region_name=None, queue=QueueUrl.parse(url)
    )
    clock = _Clock(monkeypatch)
    async with open_sqs_client(config, AioConfig(), on_secrets=lambda _s: None, clock=clock) as client:
        await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        first = {key for (operation, key) in proxy.signers() if operation == "GetQueueAttributes"}
        proxy.reset()
        clock.offset += datetime.timedelta(hours=2)  # past the role session's hour
        with built_on_this_thread() as seen:
            await asyncio.gather(
                *(client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]) for _ in range(6))
            )
    signers = proxy.signers()
    assert signers[("AssumeRole", ACCESS_KEY)] == 1, signers
    again = {key for (operation, key) in signers if operation == "GetQueueAttributes"}
    assert len(again) == 1, signers
    assert again.isdisjoint(first), signers
    assert seen == [], f"built on the event loop's thread: {seen}"


async def test_more_streams_than_worker_threads_all_start(sqs, harness, aws_connection) -> None:
    """
    Class 13 (load). Each stream's start now takes several trips through the loop's default
    executor (import, stats warm-up, session, data files, client): min(32, cpu + 4) threads, 6 on
    a 2-core machine. With only 2 threads and 8 streams starting at once, none of that work may
    wait on another (a thread waiting for the loop, or for a thread): every stream delivers.
    """
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="starved")
    asyncio.get_running_loop().set_default_executor(executor)
    urls = [sqs.create_queue() for _ in range(8)]
    for n, url in enumerate(urls):
        sqs.send(url, [{"n": n}])
    watchers = [
        harness.add(SqsSharedStreamTrigger(url, aws_conn_id=aws_connection, wait_time_seconds=1))
        for url in urls
    ]
    await asyncio.wait_for(asyncio.gather(*(w.wait_for_events(1, timeout=120) for w in watchers)), 180)


async def test_a_stream_cancelled_while_its_client_is_built_leaves_nothing_open(
    sqs, aws_connection, monkeypatch
) -> None:
    """
    Class 13. A stream closed (a trigger moved, its watcher removed) while its SQS client is being
    built in the worker thread: the awaiting task is cancelled at once; the thread's private loop
    finishes the build and closes; the client built for nobody was never entered, so no HTTP
    session or connector is left open (no ``Unclosed`` warning, no live ``aiohttp.ClientSession``).
    """
    import asyncio
    import gc
    import threading
    import warnings

    import aiohttp
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession

    from airflow_shared_stream.sqs.credentials import open_sqs_client

    url = sqs.create_queue()
    config = await SqsSharedStreamHook(aws_connection).aget_client_config(
        region_name=None, queue=QueueUrl.parse(url)
    )
    building, release, built = threading.Event(), threading.Event(), threading.Event()
    real = AioSession._create_client

    async def gated(self, *args, **kwargs):
        building.set()
        release.wait(60)
        try:
            return await real(self, *args, **kwargs)
        finally:
            built.set()

    monkeypatch.setattr(AioSession, "_create_client", gated)

    async def stream() -> None:
        async with open_sqs_client(config, AioConfig(), on_secrets=lambda _s: None) as client:
            await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])

    task = asyncio.create_task(stream())
    await asyncio.to_thread(building.wait, 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        release.set()
        await asyncio.to_thread(built.wait, 60)
        await asyncio.sleep(0)
        gc.collect()
    assert not [w for w in caught if "nclosed" in str(w.message)], [str(w.message) for w in caught]
    assert not [o for o in gc.get_objects() if isinstance(o, aiohttp.ClientSession) and not o.closed]


async def test_a_broken_statsd_config_fails_no_stream(sqs, harness, aws_connection, monkeypatch) -> None:
    """
    Class 7/13. ``warm_up_stats`` builds Airflow's real StatsD backend in the worker thread with a
    ``[metrics]`` section Airflow cannot read (``statsd_port`` not a number: the factory raises
    ``AirflowConfigException``, which Airflow's ``_get_backend`` does not catch). The warm-up
    swallows it and the stream's metrics fail quietly: the stream still starts and delivers.
    """
    from airflow._shared.observability.metrics import stats as shared_stats
    from airflow.observability import stats
    from airflow.observability.metrics import statsd_logger

    from airflow_shared_stream.sqs.trigger import SqsSharedStreamTrigger

    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", "not-a-port")
    monkeypatch.setattr(shared_stats, "_factory", shared_stats._factory)
    monkeypatch.setattr(shared_stats, "_backend", shared_stats._backend)
    stats.initialize(factory=statsd_logger.get_statsd_logger, export_legacy_names=True)
    url = sqs.create_queue()
    sqs.send(url, [{"n": 1}, {"n": 2}])
    watcher = harness.add(SqsSharedStreamTrigger(url, aws_conn_id=aws_connection, wait_time_seconds=1))
    await watcher.wait_for_events(2, timeout=60)
    assert shared_stats._backend is None  # never built: the config really is broken


async def test_a_profile_roles_keys_never_reach_the_logs(sqs, proxy, profile_role, caplog) -> None:  # noqa: F811
    """
    Class 12. botocore logs each response body at DEBUG (``botocore.parsers``), STS's
    ``AssumeRole`` answer included: its ``SecretAccessKey`` and ``SessionToken``. The stream
    redacts them (``_install_sts_filter``) when the connection sets ``role_arn``; a
    ``profile_name`` whose profile is a role is assumed by the same STS call, through the
    session's own provider, and its keys were logged as they came; its session token, sent in
    every request, was never given to the scrubber (``botocore.auth`` logs the canonical request,
    ``x-amz-security-token`` included, at DEBUG). Fixed: the STS filter is on for every client,
    and each secret the session's own credentials return is told to the scrubber first.
    """
    import logging

    from airflow_shared_stream.common.errors import SecretScrubber
    from airflow_shared_stream.sqs.hook import open_queue_client
    from tests.integration.sqs.test_sqs_identity import _assumed_roles

    url = _role_queue(sqs)
    before = len(_assumed_roles())
    with caplog.at_level(logging.DEBUG):
        # The stream's own client: the scrubber learns each secret and sits on botocore's loggers.
        async with open_queue_client(
            aws_conn_id=profile_role,
            region_name=None,
            queue=QueueUrl.parse(url),
            wait_seconds=1,
            scrubber=SecretScrubber(),
        ) as client:
            await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
            await client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    roles = _assumed_roles()[before:]
    assert roles, "the profile's role was not assumed"
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for role in roles:
        assert role.secret_access_key not in logged
        assert role.session_token not in logged
