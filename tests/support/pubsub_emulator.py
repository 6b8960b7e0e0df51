"""
Google's Pub/Sub emulator on loopback, for the integration suite, the e2e suite and the demo.

The emulator ships with the Google Cloud CLI (Debian package ``google-cloud-cli-pubsub-emulator``);
it cannot be installed from PyPI, so a machine without it FAILS the tests that need it with a
message saying what to install (never a skip). Its launcher script execs java, so the PID we
hold is the JVM's and stopping by PID stops the emulator. The JVM forks no helper process: it is
alone in the process group :func:`~tests.support.processes.running` gives it (checked with
``ps -g <pid>``), which is what :meth:`PubSubEmulator.freeze` signals.

Helpers are synchronous (the generated GAPIC clients on an insecure channel to the emulator),
because the e2e suite and the demo drive a whole deployment from plain, blocking code. They do
not read or set ``PUBSUB_EMULATOR_HOST``: the code under test is pointed at the emulator through
:meth:`PubSubEmulator.env`, so the helpers can never hide a producer that ignores it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.ports import PortNotOursError, family, port_ownership
from tests.support.processes import free_port, running, tail, wait_for_port, wait_until_stopped

EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
PROJECT = "shared-stream-test"
READY_LINE = "Server started"
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
"""The helpers' channels take messages of any size, as Google's transports' do (a pull of a
dead-letter copy of 10 MB is over gRPC's default 4 MiB)."""


class EmulatorMissingError(RuntimeError):
    """The Pub/Sub emulator is not installed on this machine."""


@dataclass(frozen=True)
class PubSubEmulator:
    """A running Pub/Sub emulator on 127.0.0.1, with synchronous admin/publish/pull helpers."""

    port: int
    log_path: Path
    project: str = PROJECT
    pid: int | None = None
    """The JVM's PID (also its process group's id), when this process started the emulator."""

    @property
    def host(self) -> str:
        """``host:port``, the value of ``PUBSUB_EMULATOR_HOST``."""
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment that points Google's client libraries (and so our producer) at the emulator."""
        return {"PUBSUB_EMULATOR_HOST": self.host}

    def connection(self, **extra: Any) -> dict[str, Any]:
        """A ``google_cloud_platform`` connection (JSON form) naming this emulator's project."""
        return {"conn_type": "google_cloud_platform", "extra": {"project": self.project, **extra}}

    # -- outage --------------------------------------------------------------------------------

    def freeze(self) -> None:
        """
        SIGSTOP the emulator: an outage it survives with its state (it keeps everything in memory).

        The port stays open and the kernel still accepts connections and bytes, but nothing
        answers: every call in flight or made meanwhile (pull, acknowledge, modify_ack_deadline)
        hangs until its own deadline, as against a broker that stopped responding. The whole
        process group is stopped, so a helper the launcher might fork in a later release could
        not keep answering alone. The emulator's clock keeps running: ack deadlines that pass
        while it is frozen have expired when it resumes, and those messages are redelivered.

        It first checks that the port is served by this emulator's process and nobody else's
        (:mod:`tests.support.ports`): stopping our PID while another process answers on the port
        would be no outage at all, and a test would "prove" calls go through a frozen broker.

        It returns once every thread of the emulator is stopped (``/proc``), not when the signal
        is sent: SIGSTOP stops a multi-threaded process asynchronously, and a JVM still running
        right after ``kill()`` answered the calls a test made "during the outage"
        (:func:`~tests.support.processes.wait_until_stopped`).
        """
        if self.pid is None:
            raise RuntimeError("this emulator was not started here: its PID is unknown")
        port_ownership(self.port, self.pid).check(f"freezing the emulator (pid {self.pid})")
        self._signal(signal.SIGSTOP)
        wait_until_stopped(family(self.pid), what=f"the emulator (pid {self.pid})")

    def resume(self) -> None:
        """SIGCONT the emulator after :meth:`freeze`; it answers what was queued meanwhile."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        if self.pid is None:
            raise RuntimeError("this emulator was not started here: its PID is unknown")
        if os.getpgid(self.pid) == self.pid:
            os.killpg(self.pid, signum)  # its own group (start_new_session): the JVM and any child
        else:
            os.kill(self.pid, signum)  # never the group of whoever started it (ours)

    # -- clients -------------------------------------------------------------------------------

    @functools.cached_property
    def publisher(self) -> Any:
        import grpc
        from google.pubsub_v1 import PublisherClient
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

        return PublisherClient(
            transport=PublisherGrpcTransport(channel=grpc.insecure_channel(self.host, CHANNEL_OPTIONS))
        )

    @functools.cached_property
    def subscriber(self) -> Any:
        import grpc
        from google.pubsub_v1 import SubscriberClient
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        return SubscriberClient(
            transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(self.host, CHANNEL_OPTIONS))
        )

    # -- admin ---------------------------------------------------------------------------------

    def topic_path(self, name: str) -> str:
        return f"projects/{self.project}/topics/{name}"

    def subscription_path(self, name: str) -> str:
        return f"projects/{self.project}/subscriptions/{name}"

    def create_topic(self, name: str | None = None) -> str:
        """Create a topic (a fresh unique name by default); return its full path."""
        path = self.topic_path(name or f"t-{uuid.uuid4().hex[:12]}")
        self.publisher.create_topic(name=path)
        return path

    def create_subscription(
        self,
        topic: str,
        name: str | None = None,
        *,
        ack_deadline_seconds: int = 10,
        ordering: bool = False,
        dead_letter_topic: str | None = None,
        max_delivery_attempts: int = 5,
    ) -> str:
        """Create a pull subscription on ``topic``; return its full path."""
        from google.pubsub_v1 import DeadLetterPolicy, Subscription

        path = self.subscription_path(name or f"s-{uuid.uuid4().hex[:12]}")
        subscription = Subscription(
            name=path,
            topic=topic,
            ack_deadline_seconds=ack_deadline_seconds,
            enable_message_ordering=ordering,
        )
        if dead_letter_topic is not None:
            subscription.dead_letter_policy = DeadLetterPolicy(
                dead_letter_topic=dead_letter_topic, max_delivery_attempts=max_delivery_attempts
            )
        self.subscriber.create_subscription(request=subscription)
        return path

    def topic_with_subscription(self, **subscription_options: Any) -> tuple[str, str]:
        """A fresh topic and one subscription on it: ``(topic path, subscription path)``."""
        topic = self.create_topic()
        return topic, self.create_subscription(topic, **subscription_options)

    # -- data ----------------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payloads: Iterable[Any],
        *,
        ordering_key: str | None = None,
        attributes: dict[str, str] | None = None,
    ) -> list[str]:
        """
        Publish payloads in order (one request of up to 100); return their message ids.

        A ``bytes`` payload is sent as is, a ``str`` as UTF-8, anything else as JSON.
        """
        from google.pubsub_v1 import PubsubMessage

        ids: list[str] = []
        batch = list(payloads)
        for start in range(0, len(batch), 100):
            messages = [
                PubsubMessage(
                    data=_encode(payload),
                    attributes=attributes or {},
                    ordering_key=ordering_key or "",
                )
                for payload in batch[start : start + 100]
            ]
            ids.extend(self.publisher.publish(topic=topic, messages=messages).message_ids)
        return ids

    def pull(self, subscription: str, *, ack: bool = True, max_messages: int = 100) -> list[Any]:
        """One pull (returns what is there now, possibly nothing); acknowledge it unless told not to."""
        from google.api_core import exceptions

        try:
            response = self.subscriber.pull(subscription=subscription, max_messages=max_messages, timeout=2.0)
        except exceptions.DeadlineExceeded:
            return []
        received = list(response.received_messages)
        if ack and received:
            self.subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in received])
        return received

    def drain(self, subscription: str, *, quiet_for: float = 1.0) -> list[Any]:
        """Pull and acknowledge until nothing arrives for ``quiet_for`` seconds; return the messages."""
        received: list[Any] = []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet_for:
            batch = self.pull(subscription)
            if batch:
                received.extend(batch)
                quiet_since = time.monotonic()
        return received


def _encode(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return json.dumps(payload).encode("utf-8")


def emulator_argv(port: int) -> list[str]:
    if not EMULATOR.exists():
        raise EmulatorMissingError(
            f"the Google Cloud Pub/Sub emulator is not installed ({EMULATOR} is missing): install the "
            "Debian package google-cloud-cli-pubsub-emulator (docs/testing.rst). The Pub/Sub tests "
            "need it and fail rather than skip without it."
        )
    return [str(EMULATOR), "--host=127.0.0.1", f"--port={port}"]


PORT_ATTEMPTS = 3
"""Ports tried before a start gives up: another process taking the one picked is rare, not never."""


@contextlib.contextmanager
def pubsub_emulator_process(data_dir: Path, *, timeout: float = 60.0) -> Iterator[PubSubEmulator]:
    """
    Run the emulator on a free loopback port for the block; stop it by PID afterwards.

    Ready when its log says "Server started" (about 3 s here; more under load) AND the listener
    on the port is its own, nobody else's (:mod:`tests.support.ports`): ``free_port()`` only says
    the port was free a moment before the JVM's bind, and an emulator started on a port another
    process took answered nothing while that process answered every call. Such a start is
    stopped and made again on another port; a start that fails otherwise or times out raises with
    the tail of the emulator's log.
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        log_path = data_dir / f"pubsub-emulator-{attempt}.log"
        with running(emulator_argv(port), log_path=log_path, cwd=data_dir) as proc:
            try:
                _wait_until_ready(proc, port, log_path, timeout)
            except PortNotOursError:
                if attempt == PORT_ATTEMPTS:
                    raise
                continue
            try:
                yield PubSubEmulator(port=port, log_path=log_path, pid=proc.pid)
            finally:
                # A frozen emulator would sit out SIGTERM until the grace period ends in SIGKILL.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
            return


def _wait_until_ready(proc: subprocess.Popen, port: int, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    what = f"the Pub/Sub emulator (pid {proc.pid}, log: {log_path})"
    while READY_LINE not in _read(log_path):
        ownership = port_ownership(port, proc.pid)
        if ownership.foreign:  # also when the JVM gave up on the port: a taken port, not a broken JVM
            ownership.check(what)
        if proc.poll() is not None:
            raise RuntimeError(
                f"the Pub/Sub emulator exited with {proc.returncode} before it was ready:\n{tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Pub/Sub emulator was not ready within {timeout}s:\n{tail(log_path)}")
        time.sleep(0.1)
    # "Server started" is no proof it bound the port: the listener must be the JVM's, and only its.
    wait_for_port(port, max(1.0, deadline - time.monotonic()), proc, what)


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")
    return ""
