#!/usr/bin/env python
"""
Prove the shared contract suite catches the bugs it is named after.

Each mutant is one deliberate bug (delete on receipt, no credit window, dead-letter after the
delete, dead-letter skipped when the send fails, one lane per message on an ordered queue, a
lane's received messages not held back behind its redelivery, leases not renewed; for Kafka:
commit on receipt, no credit window, dead-letter fire-and-forget or after the commit,
dead-letter skipped when the send fails, stale records handed out after a seek, the
no-subscriber pause skipped or never lifted; for the MessageQueueTrigger schemes, ``--broker queues``:
a scheme that collides or matches loosely, a URI claimed, our trigger wrapped, unknown arguments
dropped, each naming its own tests; for Spark: the deferrable operator's guarantees, each
caught by its own module's tests). For each, this script copies the
package and the tests to a temporary directory, applies the mutant there (the working tree is
never touched), runs the contract tests that must catch it against the real broker, and checks
that they FAIL. A mutant that survives
is a hole in the suite: the script exits non-zero and names it.

Usage::

    .venv/bin/python scripts/mutants.py              # every mutant of every broker
    .venv/bin/python scripts/mutants.py --broker sqs
    .venv/bin/python scripts/mutants.py --short      # the quick subset the test suite runs
    .venv/bin/python scripts/mutants.py --name "in flight"   # the mutants whose name says so
    .venv/bin/python scripts/mutants.py --name "nobody saw"   # the mutants whose name has this

A mutant whose source snippet no longer occurs exactly once fails loudly too: refactor the
code, then update the snippet, so no mutant silently stops being applied.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = "tests/integration/{broker}/test_{broker}_contract.py::Test{Broker}Contract::{test}"
SQS_IDENTITY = "tests/integration/sqs/test_sqs_identity.py"
PUBSUB_STREAM_TESTS = "tests/integration/pubsub/test_pubsub_envelope_and_dead_letters.py"
PUBSUB_LIMIT_TESTS = "tests/integration/pubsub/test_pubsub_limits.py"
PUBSUB_RAW_STUB_TESTS = "tests/integration/pubsub/test_pubsub_raw_stubs.py"
PUBSUB_DEAD_LETTER_COPY_TESTS = "tests/unit/pubsub/test_pubsub_dead_letter_copy.py"
SERVICEBUS_LOCKS = "tests/integration/servicebus/test_servicebus_lock_from_broker.py"
SERVICEBUS_RANGES = "tests/integration/servicebus/test_servicebus_range_completion.py"
SERVICEBUS_SESSION_BUDGET = "tests/integration/servicebus/test_servicebus_session_budget.py"
SERVICEBUS_SESSION_ATTACK = "tests/integration/servicebus/test_servicebus_session_attack.py"
TWO_SCHEDULERS = "tests/integration/scheduling/test_sweep_with_two_schedulers.py"
STRANDED = "tests/integration/scheduling/test_stranded_asset_events.py"
KAFKA_CLUSTER_CHANGES = "tests/integration/kafka/test_kafka_cluster_changes.py"
SPARK_UNIT = "tests/unit/spark/test_operator_trigger.py"
SPARK_RECORDING = "tests/integration/spark/test_recording_master.py"
SPARK_CLUSTER = "tests/integration/spark/test_deferrable_operator.py"
SPARK_MOVES = "tests/integration/spark/test_trigger_moves.py"
SPARK_FORGOTTEN = "tests/integration/spark/test_forgotten_driver.py"
CONSOLE_E2E = "tests/e2e/test_streams_page.py"
CONSOLE_FIGURES = "tests/unit/console/test_figures.py"
CONSOLE_STREAMS = "tests/unit/console/test_streams.py"
CONSOLE_REDRIVE_FORM = "tests/unit/console/test_redrive_form.py"
CONSOLE_ACCESS = "tests/unit/console/test_access.py"
CONSOLE_TEAMS_E2E = "tests/e2e/test_streams_page_teams.py"
REDRIVE_GRANT = "tests/unit/test_redrive_grant.py"
SQS_REDRIVE_ROUTES = "tests/integration/sqs/test_sqs_redrive_routes.py"
PUBSUB_REDRIVE_ROUTES = "tests/integration/pubsub/test_pubsub_redrive_routes.py"
CONSOLE_KAFKA = "tests/integration/kafka/test_kafka_console_figures.py"
CONSOLE_FIGURES_E2E = "tests/e2e/test_console_figures_triggerers.py"

SUITE = {"kafka": "Kafka", "sqs": "Sqs", "pubsub": "PubSub", "servicebus": "ServiceBus"}
"""The name of each broker's contract class (``Test<name>Contract``)."""


REFRESH_IF_AGREED = (
    "            if not self._refused(cursor, committed):\n                committer.refresh()\n"
)
"""Kafka's position refresh: a watcher's position is committed again unless another shape writes it."""

KAFKA_ADVANCE = "tests/unit/kafka/test_producer_advance.py"
"""Kafka's advance against a recording consumer (pure settlement logic)."""

KAFKA_POSITIONS = "tests/integration/kafka/test_kafka_positions.py"
"""Kafka watchers' own positions across triggerers (guarantees no other broker has)."""

KAFKA_LOSS_PATHS = "tests/integration/kafka/test_kafka_loss_paths.py"
"""Kafka's loss paths on a real broker: first position, group sharing, dead-letter sizes."""

TIMED_DEAD_LETTER = (
    "        if dead:\n"
    "            with self.metrics.timed(m.ADVANCE_LATENCY):  # the one broker call an advance makes\n"
)
SERVICEBUS_IDENTITY = "tests/integration/servicebus/test_servicebus_stream_identity.py"
SERVICEBUS_IDENTITY_UNIT = "tests/unit/servicebus/test_stream_identity.py"
DEAD_LETTER_SEND = TIMED_DEAD_LETTER + "                await self._dead_letter(dead)\n"
"""Kafka's advance sending its dead letters and waiting for the broker's acknowledgement."""

QUEUES_TESTS = "tests/unit/test_queues.py::"
INSTALL_TESTS = "tests/integration/test_install_quickstart.py"
TRIGGER_CLASS = "    def trigger_class(self) -> type[BaseEventTrigger]:\n"
TRIGGER_IMPORT = "        trigger: type[BaseEventTrigger] = import_string(self.trigger_path)\n"
"""The MessageQueueTrigger scheme providers' trigger lookup (airflow_shared_stream/queues.py)."""
REDRIVE_COPY_THEN_REMOVE = (
    "            accepted = list(await source.copy(selected)) if selected else []\n"
    "            if checkpoint is not None:\n"
    '                await checkpoint("copied", accepted)\n'
    "            await source.remove(accepted, skipped)\n"
)
"""The redrive loop's order: copy, (the kill tests' checkpoint), then remove what was accepted."""


@dataclass(frozen=True)
class Mutant:
    name: str
    broker: str
    path: str
    original: str
    mutated: str
    caught_by: tuple[str, ...]
    short: bool = False
    module: str = ""
    """The test module of ``caught_by`` when it is not the broker's contract suite."""

    def test_ids(self) -> list[str]:
        """Contract tests by name, tests of ``module`` by name, any other test by node id (``path::name``)."""
        broker = self.broker
        if self.module:
            return [test if "::" in test else f"{self.module}::{test}" for test in self.caught_by]
        return [
            test if "::" in test else CONTRACT.format(broker=broker, Broker=SUITE[broker], test=test)
            for test in self.caught_by
        ]


PUBSUB_SERVICE = "tests/integration/pubsub/test_pubsub_service_fidelity.py::TestPubSubServiceDeliveryBudget::"
"""The Pub/Sub delivery budgets on the stand-in that behaves like the service (fix/pubsub-hold)."""
PUBSUB_LOCKS_LANES = (
    "    locks_lanes = False  # an ordering key is not locked: a pull may bring a key's later message first\n"
)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="delete on receipt",
        broker="sqs",
        path="airflow_shared_stream/sqs/producer.py",
        original='        return [self._delivery(message) for message in response.get("Messages", ())]\n',
        mutated=(
            '        deliveries = [self._delivery(message) for message in response.get("Messages", ())]\n'
            "        await self.ack(deliveries)\n"
            "        return deliveries\n"
        ),
        caught_by=("test_advance_only_after_persistence",),
        short=True,
    ),
    Mutant(
        name="no credit window",
        broker="sqs",
        path="airflow_shared_stream/common/flow_control.py",
        original="        return self.max_in_flight - self.in_flight - self._reserved\n",
        mutated="        return 10**9  # mutant: every credit is always free\n",
        caught_by=("test_credit_window_bounds_what_is_received_from_the_broker",),
    ),
    Mutant(
        name="dead-letter after the delete",
        broker="sqs",
        path="airflow_shared_stream/sqs/producer.py",
        original="        entries = [self._dead_letter_entry(i, letter) for i, letter in enumerate(letters)]\n",  # noqa: E501
        mutated=(
            "        await self._delete([letter.delivery.handle for letter in letters])\n"
            "        entries = [self._dead_letter_entry(i, letter) for i, letter in enumerate(letters)]\n"
        ),
        caught_by=("test_a_failed_dead_letter_copy_keeps_the_message_on_the_stream",),
    ),
    Mutant(
        name="dead-letter skipped when the send fails",
        broker="sqs",
        path="airflow_shared_stream/sqs/producer.py",
        original=(
            "        response = await self._call(\n"
            '            "SendMessageBatch", queue=dead_letter_queue, QueueUrl=dead_letter_queue.url, Entries=entries\n'  # noqa: E501
            "        )\n"
        ),
        mutated=(
            "        try:\n"
            "            response = await self._call(\n"
            '                "SendMessageBatch", queue=dead_letter_queue, QueueUrl=dead_letter_queue.url, Entries=entries\n'  # noqa: E501
            "            )\n"
            "        except Exception:\n"
            "            response = {}\n"
        ),
        caught_by=("test_a_failed_dead_letter_copy_keeps_the_message_on_the_stream",),
        short=True,
    ),
    Mutant(
        name="one lane per message on a FIFO queue",
        broker="sqs",
        path="airflow_shared_stream/sqs/producer.py",
        original="            lane=group_id if self._queue.is_fifo else None,\n",
        mutated='            lane=message["MessageId"] if self._queue.is_fifo else None,\n',
        caught_by=("test_a_redelivery_holds_back_the_rest_of_its_lane",),
    ),
    Mutant(
        name="a lane's received messages not held back behind its redelivery",
        broker="sqs",
        path="airflow_shared_stream/common/lanes.py",
        original="        return self._redelivered.get(lane, -1) > stamp\n",
        mutated="        return False  # mutant: only what was handed out is held back\n",
        caught_by=("test_a_message_received_but_not_yet_handed_out_is_held_back_behind_a_redelivery",),
    ),
    Mutant(
        name="leases not renewed",
        broker="sqs",
        path="airflow_shared_stream/common/leased_queue.py",
        original="        self._leases.start()\n",
        mutated="        pass  # mutant: the lease keeper never runs\n",
        caught_by=("test_lease_held_past_the_brokers_own_timeout",),
    ),
    # Delivery budgets: a message no watcher has seen is held, not given back (one per broker,
    # each with its own delivery limit), and Service Bus gives one back without counting it.
    *(
        Mutant(
            name="a message nobody saw is given back at once",
            broker=broker,
            path="airflow_shared_stream/common/leased_advance.py",
            original="                and _nobody(item)\n",
            mutated="                and False  # mutant: redelivered, spending a delivery attempt\n",
            caught_by=("test_a_stuck_watcher_spends_no_delivery_attempt_of_messages_nobody_saw",),
        )
        for broker in ("sqs", "pubsub", "servicebus")
    ),
    Mutant(
        name="held messages given back by letting their locks run out",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/producer.py",
        original="            if link is None or not link.can_join(message):\n",
        mutated="            if True:  # mutant: never released\n",
        caught_by=("test_a_stream_whose_watchers_all_left_gives_back_what_nobody_saw",),
    ),
    *(
        Mutant(
            name="a queued ACK's lease forgotten on the general advance path",
            broker=broker,
            path="airflow_shared_stream/common/leased_advance.py",
            original="            kept = {d.lease for d in later}\n",
            mutated="            kept = set()  # mutant: the lease keeper no longer finds the queued ACKs\n",
            caught_by=("test_a_queued_ack_keeps_its_lease_when_its_batch_also_settles_a_reject",),
        )
        for broker in ("sqs", "servicebus")
    ),
    Mutant(
        name="only the first batch of leases renewed",
        broker="sqs",
        path="airflow_shared_stream/common/leases.py",
        original=(
            "        chunks = [handles[start : start + size] for start in range(0, len(handles), size)]\n"
        ),
        mutated="        chunks = [handles[:size]]  # mutant: leases past one batch are never renewed\n",
        caught_by=("test_more_leases_than_one_settle_batch_are_all_renewed",),
    ),
    # Kafka: commits instead of deletes, no leases, no ordered-lane variant (a partition is a lane).
    Mutant(
        name="commit on receipt",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original="                    credits.take()\n",
        mutated=(
            "                    credits.take()\n"
            "                    self.committer.queue(tp, record.offset + 1)\n"
        ),
        caught_by=("test_advance_only_after_persistence",),
    ),
    Mutant(
        name="no credit window",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original="            available = credits.available or await self._wait_for_credit()\n",
        mutated="            available = 500\n            credits.max_in_flight = 10**9\n",
        caught_by=("test_credit_window_bounds_what_is_received_from_the_broker",),
    ),
    Mutant(
        name="dead-letter sent fire-and-forget",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original=DEAD_LETTER_SEND,
        mutated=f"{TIMED_DEAD_LETTER}                asyncio.ensure_future(self._dead_letter(dead))\n",
        caught_by=("test_a_failed_dead_letter_copy_keeps_the_message_on_the_stream",),
    ),
    Mutant(
        name="dead-letter after the commit",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original=DEAD_LETTER_SEND,
        mutated=(
            TIMED_DEAD_LETTER + "                self.committer.queue(tp, dead[-1].offset + 1)\n"
            "                await self.committer.flush()\n"
            "                await self._dead_letter(dead)\n"
        ),
        caught_by=("test_a_failed_dead_letter_copy_keeps_the_message_on_the_stream",),
    ),
    Mutant(
        name="dead-letter skipped when the send fails",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original=DEAD_LETTER_SEND,
        mutated=(
            TIMED_DEAD_LETTER + "                try:\n"
            "                    await self._dead_letter(dead)\n"
            "                except Exception:\n"
            "                    pass\n"
        ),
        caught_by=("test_a_failed_dead_letter_copy_keeps_the_message_on_the_stream",),
    ),
    Mutant(
        name="records fetched before a redelivery's seek still handed out",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original=(
            "                    if fetch_epochs.get(tp, 0) != fetch_epoch:\n"
            "                        break  # sought back meanwhile: the rest is stale\n"
        ),
        mutated="",
        caught_by=("test_a_message_received_but_not_yet_handed_out_is_held_back_behind_a_redelivery",),
    ),
    Mutant(
        name="a record nobody saw read again without a pause",
        broker="kafka",
        path="airflow_shared_stream/kafka/settler.py",
        original="            self.backoff.nobody_subscribed()  # no spinning on it until somebody is\n",
        mutated="            pass  # mutant: read again at once\n",
        caught_by=("test_nobody_subscribed_redelivers_after_a_pause_that_ends_once_someone_is",),
        module=KAFKA_ADVANCE,
    ),
    Mutant(
        name="the no-subscriber pause kept after a watcher took a record",
        broker="kafka",
        path="airflow_shared_stream/kafka/settler.py",
        original="        if backoff.delay:\n            backoff.someone_subscribed()\n",
        mutated="",
        caught_by=("test_nobody_subscribed_redelivers_after_a_pause_that_ends_once_someone_is",),
        module=KAFKA_ADVANCE,
    ),
    Mutant(
        name="a commit passes a record held for redelivery",
        broker="kafka",
        path="airflow_shared_stream/kafka/offsets.py",
        original="        target = last_settled + 1 if floor is None else min(last_settled + 1, floor)\n",
        mutated="        target = last_settled + 1  # mutant: the floor no longer bounds the commit\n",
        caught_by=("test_redeliver_holds_floor_and_seeks_back",),
        module="tests/unit/kafka/test_offsets.py",
    ),
    Mutant(
        name="a partition's start not committed before its first record",
        broker="kafka",
        path="airflow_shared_stream/kafka/anchors.py",
        original="            await consumer.commit({tp: position})\n",
        mutated="            pass  # mutant: the group has no position until a record settles\n",
        caught_by=("test_first_start_position_is_committed_and_survives_a_restart",),
        module=KAFKA_LOSS_PATHS,
    ),
    Mutant(
        name="the consumer left on aiokafka's default auto-commit",
        broker="kafka",
        path="airflow_shared_stream/kafka/hook.py",
        original='        kwargs["enable_auto_commit"] = False\n',
        mutated='        kwargs["enable_auto_commit"] = True\n',
        caught_by=("test_a_record_read_but_never_persisted_is_not_committed_when_the_stream_closes",),
        module=KAFKA_LOSS_PATHS,
    ),
    Mutant(
        name="a dead letter too large for its topic fails the stream on it forever",
        broker="kafka",
        path="airflow_shared_stream/kafka/dead_letter.py",
        original="TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)\n",
        mutated="TOO_LARGE: tuple[type[Exception], ...] = ()  # mutant: no pointer record\n",
        caught_by=("test_record_too_large_for_the_dead_letter_topic_still_leaves_the_stream",),
        module=KAFKA_LOSS_PATHS,
    ),
    Mutant(
        name="dead-letter batches not split by bytes",
        broker="sqs",
        path="airflow_shared_stream/common/delivery.py",
        original="        too_big = max_bytes is not None and batch and batch_bytes + item_bytes > max_bytes\n",  # noqa: E501
        mutated="        too_big = False  # mutant: one batch over the broker's request size\n",
        caught_by=("test_dead_letter_batches_are_split_by_bytes",),
        module="tests/integration/sqs/test_sqs_loss_fixes.py",
    ),
    Mutant(
        name="role_arn ignored: the stream runs as the keys that should only assume the role",
        broker="sqs",
        path="airflow_shared_stream/sqs/credentials.py",
        original="    if config.role_arn:\n        _install_sts_filter()\n",
        mutated="    if config.role_arn and False:\n        _install_sts_filter()\n",
        caught_by=("test_role_arn_is_assumed_and_every_sqs_call_is_signed_as_the_role",),
        module=SQS_IDENTITY,
    ),
    Mutant(
        name="the role is assumed once and never again: its keys expire on an idle stream",
        broker="sqs",
        path="airflow_shared_stream/sqs/credentials.py",
        original="    refresh = _assume_role(config, _session(config), botocore_config, on_secrets)\n",
        mutated=(
            "    assume = _assume_role(config, _session(config), botocore_config, on_secrets)\n"
            "    first: dict[str, Any] = {}\n"
            "\n"
            "    async def refresh() -> dict[str, Any]:\n"
            "        if not first:\n"
            "            first.update(await assume())\n"
            "        return first\n"
        ),
        caught_by=("test_the_role_is_assumed_again_before_its_keys_expire_on_a_stream_idle_for_days",),
        module=SQS_IDENTITY,
    ),
    Mutant(
        name="STS responses logged with the role's secret key",
        broker="sqs",
        path="airflow_shared_stream/sqs/credentials.py",
        original="        _install_sts_filter()\n        session = _role_session(",
        mutated="        session = _role_session(",
        caught_by=("test_role_arn_is_assumed_and_every_sqs_call_is_signed_as_the_role",),
        module=SQS_IDENTITY,
    ),
    Mutant(
        name="an unknown connection extra (a misspelt role_arn) silently ignored",
        broker="sqs",
        path="airflow_shared_stream/sqs/credentials.py",
        original="        elif key not in READ_EXTRAS:\n",
        mutated="        elif False:\n",
        caught_by=("test_an_unsupported_setting_is_refused_by_name",),
        module="tests/unit/sqs/test_sqs_connection_settings.py",
    ),
    Mutant(
        name="a reject nacked to the subscription's dead-letter policy",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/producer.py",
        original=(
            "        if self.dead_letter_topic is None:\n"
            "            await self._acknowledge_with_nowhere_to_go(letters)\n"
        ),
        mutated=(
            "        if True:\n            await self.redeliver([letter.delivery for letter in letters])\n"
        ),
        caught_by=(
            "test_a_reject_without_dead_letter_topic_goes_to_the_policy_topic_and_fires_no_watcher_again",
        ),
        module=PUBSUB_STREAM_TESTS,
    ),
    Mutant(
        name="a reject with nowhere to dead-letter not refused",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/trigger.py",
        original="                rejects=self.reject is not None,\n",
        mutated="                rejects=False,\n",
        caught_by=("test_a_reject_with_nowhere_to_dead_letter_is_refused_at_start",),
        module=PUBSUB_STREAM_TESTS,
    ),
    Mutant(
        name="emulator channel with gRPC's default 4 MiB receive limit",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/client.py",
        original="        return grpc.aio.insecure_channel(target, options=list(options))\n",
        mutated="        return grpc.aio.insecure_channel(target)\n",
        caught_by=("test_a_backlog_whose_pull_is_over_grpcs_default_receive_limit_is_read",),
        module=PUBSUB_LIMIT_TESTS,
    ),
    Mutant(
        name="dead-letter copy over Pub/Sub's 100 attributes",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/dead_letter.py",
        original="    room = MAX_ATTRIBUTES - len(ours) - len(markers)\n",
        mutated="    room = MAX_ATTRIBUTES + len(ours)\n",
        caught_by=(
            "test_a_message_with_100_attributes_gets_a_copy_with_100_ours_kept_and_the_dropped_counted",
        ),
        module=PUBSUB_DEAD_LETTER_COPY_TESTS,
    ),
    Mutant(
        name="dead-letter copy over Pub/Sub's 10 MB publish request",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/dead_letter.py",
        original="        markers[DEAD_LETTER_TRUNCATED_FROM] = str(len(data))\n",
        mutated="        pass\n",
        caught_by=("test_a_copy_of_a_message_close_to_10_mb_is_cut_to_fit_the_publish_request",),
        module=PUBSUB_DEAD_LETTER_COPY_TESTS,
    ),
    Mutant(
        name="an ack id refused for good fails the call (exactly-once delivery)",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/client.py",
        original="                    failures = ack_id_failures(exc, pending)\n",
        mutated="                    failures: dict[str, str] = {}\n",
        caught_by=("test_ack_ids_refused_for_good_on_an_exactly_once_subscription_do_not_fail_the_call",),
        module=PUBSUB_RAW_STUB_TESTS,
    ),
    # Stream identity: every spelling of one entity is one stream (docs/concepts.rst).
    Mutant(
        name="Service Bus stream keyed by the connection id",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/trigger.py",
        original="        return (self._namespace, self._entity.identity)\n",
        mutated="        return (self.azure_service_bus_conn_id, self._entity.identity)\n",
        caught_by=(
            f"{SERVICEBUS_IDENTITY}::test_spellings_of_one_namespace_share_one_receiver_and_every_watcher_sees_everything",
        ),
    ),
    Mutant(
        name="Service Bus emulator's default port left out of the namespace",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/hook.py",
        original='    return f"{hostname}:{port or EMULATOR_AMQP_PORT}"\n',
        mutated='    return f"{hostname}:{port}" if port else hostname\n',
        caught_by=(f"{SERVICEBUS_IDENTITY_UNIT}::test_two_connections_naming_one_namespace_are_one_stream",),
    ),
    Mutant(
        name="split-stream check grouped by connection id",
        broker="servicebus",
        path="airflow_shared_stream/placement.py",
        original="            key = trigger.shared_stream_key()\n",
        mutated='            key = (trigger.shared_stream_key(), kwargs.get("azure_service_bus_conn_id"))\n',
        caught_by=(
            f"{SERVICEBUS_IDENTITY}::test_the_split_stream_check_groups_two_connection_ids_of_one_entity",
        ),
    ),
    Mutant(
        name="last resolved endpoint not standing in where a connection cannot be read",
        broker="servicebus",
        path="airflow_shared_stream/common/trigger.py",
        original="            return known\n",
        mutated="            return None\n",
        caught_by=(
            f"{SERVICEBUS_IDENTITY_UNIT}::test_the_last_endpoint_read_stands_in_where_a_connection_cannot_be_read",
        ),
    ),
    Mutant(
        name="SQS legacy global host not the us-east-1 queue",
        broker="sqs",
        path="airflow_shared_stream/sqs/hook.py",
        original="    if hostname == _LEGACY_US_EAST_1_HOST:\n",
        mutated="    if False:  # mutant: queue.amazonaws.com is a host of its own\n",
        caught_by=(
            "tests/integration/sqs/test_sqs_stream_identity.py::test_two_aws_spellings_of_one_queue_share_one_receiver",
        ),
    ),
    Mutant(
        name="SQS second connection id of one queue not refused",
        broker="sqs",
        path="airflow_shared_stream/sqs/trigger.py",
        original="        shape = super().normalized_shape()\n",
        mutated='        shape = super().normalized_shape()\n        shape.pop("aws_conn_id")\n',
        caught_by=(
            "tests/integration/sqs/test_sqs_stream_identity.py::test_a_second_connection_id_for_one_queue_fails_naming_both",
        ),
    ),
    Mutant(
        name="Pub/Sub second connection id of one project not refused",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/trigger.py",
        original="        shape = super().normalized_shape()\n",
        mutated='        shape = super().normalized_shape()\n        shape.pop("gcp_conn_id")\n',
        caught_by=(
            "tests/integration/pubsub/test_pubsub_stream_identity.py::"
            "test_two_connection_ids_of_one_project_are_one_stream_and_the_second_fails_naming_both",
        ),
    ),
    Mutant(
        name="Kafka derived group shared by two connection ids",
        broker="kafka",
        path="airflow_shared_stream/kafka/identity.py",
        original=(
            "    identity = repr((GROUP_DIGEST_TAG, tuple(normalise_topics(topics)), kafka_config_id))\n"
        ),
        mutated="    identity = repr((GROUP_DIGEST_TAG, tuple(normalise_topics(topics))))\n",
        caught_by=(
            "tests/unit/kafka/test_stream_identity.py::test_two_connection_ids_of_one_cluster_never_share_a_derived_group",
        ),
    ),
    # common.messaging's MessageQueueTrigger schemes (airflow_shared_stream/queues.py).
    Mutant(
        name="a scheme the official Amazon provider claims",
        broker="queues",
        path="airflow_shared_stream/queues.py",
        original='    scheme = "shared+sqs"\n',
        mutated='    scheme = "sqs"\n',
        caught_by=(QUEUES_TESTS + "test_no_scheme_of_the_official_providers_or_a_near_miss_is_ours",),
    ),
    Mutant(
        name="a scheme matched by suffix",
        broker="queues",
        path="airflow_shared_stream/queues.py",
        original="        return isinstance(scheme, str) and scheme.lower() == self.scheme\n",
        mutated="        return isinstance(scheme, str) and self.scheme.endswith(scheme.lower())\n",
        caught_by=(QUEUES_TESTS + "test_no_scheme_of_the_official_providers_or_a_near_miss_is_ours",),
    ),
    Mutant(
        name="a scheme matched case-sensitively",
        broker="queues",
        path="airflow_shared_stream/queues.py",
        original="        return isinstance(scheme, str) and scheme.lower() == self.scheme\n",
        mutated="        return isinstance(scheme, str) and scheme == self.scheme\n",
        caught_by=(QUEUES_TESTS + "test_a_scheme_is_case_insensitive",),
    ),
    Mutant(
        name="a queue URI claimed",
        broker="queues",
        path="airflow_shared_stream/queues.py",
        original=TRIGGER_CLASS,
        mutated="    def queue_matches(self, queue: str) -> bool:\n        return True\n\n" + TRIGGER_CLASS,
        caught_by=(QUEUES_TESTS + "test_no_queue_uri_is_ours",),
    ),
    Mutant(
        name="our trigger wrapped in a subclass of its own",
        broker="queues",
        path="airflow_shared_stream/queues.py",
        original=TRIGGER_IMPORT,
        mutated=(
            "        base = import_string(self.trigger_path)\n"
            '        trigger: type[BaseEventTrigger] = type("Queued" + base.__name__, (base,), {})\n'
        ),
        caught_by=(
            QUEUES_TESTS + "test_the_serialized_dag_names_our_trigger_class",
            "tests/integration/sqs/test_sqs_message_queue.py::TestSqsMessageQueue::"
            "test_watchers_declared_through_message_queue_trigger_share_one_consumer",
        ),
    ),
    Mutant(
        name="unknown arguments dropped",
        broker="queues",
        path="airflow_shared_stream/queues.py",
        original=TRIGGER_IMPORT,
        mutated=(
            "        import inspect\n"
            "        base = import_string(self.trigger_path)\n"
            "        known = inspect.signature(base).parameters\n"
            "        trigger: Any = lambda **kw: base(**{k: v for k, v in kw.items() if k in known})\n"
        ),
        caught_by=(QUEUES_TESTS + "test_an_unknown_argument_fails_the_dag_parse_naming_it_and_our_trigger",),
    ),
    Mutant(
        name="watcher moved by records in flight it never received",
        broker="kafka",
        path="airflow_shared_stream/kafka/watcher_positions.py",
        original="                if payload.offset == position and payload.seq >= since:\n",
        mutated="                if payload.offset == position:\n",
        caught_by=("test_a_watcher_admitted_behind_is_not_moved_by_records_in_flight_it_never_received",),
        module=KAFKA_POSITIONS,
    ),
    Mutant(
        name="idle watcher positions not committed again",
        broker="kafka",
        path="airflow_shared_stream/kafka/watcher_positions.py",
        original=REFRESH_IF_AGREED,
        mutated="            self._refused(cursor, committed)\n",
        caught_by=("test_an_idle_watchers_position_is_committed_again_so_retention_never_expires_it",),
        module=KAFKA_POSITIONS,
    ),
    Mutant(
        name="idle stream start not committed again",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original="            self.committer.refresh()\n            await self.positions.refresh()\n",
        mutated="            await self.positions.refresh()\n",
        caught_by=("test_an_idle_watchers_position_is_committed_again_so_retention_never_expires_it",),
        module=KAFKA_POSITIONS,
    ),
    Mutant(
        name="a refresh sends an older target than one in flight",
        broker="kafka",
        path="airflow_shared_stream/kafka/committer.py",
        original="        self._pending[tp] = self._known[tp] = offset\n",
        mutated="        self._pending[tp] = offset\n",
        caught_by=("test_a_refresh_while_a_newer_target_is_in_flight_never_sends_an_older_one",),
        module="tests/unit/kafka/test_marks.py",
    ),
    Mutant(
        name="another triggerer's shape not checked on admission",
        broker="kafka",
        path="airflow_shared_stream/kafka/watcher_positions.py",
        original="            if not self._refused(cursor, committed):\n                loaded.append(",
        mutated="            if True:\n                loaded.append(",
        caught_by=(
            "test_watchers_differing_only_in_shape_on_two_triggerers_fail_loudly_not_share_a_position",
        ),
        module=KAFKA_POSITIONS,
    ),
    Mutant(
        name="another triggerer's shape not checked on refresh",
        broker="kafka",
        path="airflow_shared_stream/kafka/watcher_positions.py",
        original=REFRESH_IF_AGREED,
        mutated="            if True:\n                committer.refresh()\n",
        caught_by=(
            "test_a_watcher_whose_position_another_shape_starts_writing_is_refused_at_the_next_refresh",
        ),
        module=KAFKA_POSITIONS,
    ),
    Mutant(
        name="partitions read one after another",
        broker="kafka",
        path="airflow_shared_stream/kafka/fair_fetch.py",
        original="    if 1 < len(partitions) <= max_records:\n",
        mutated="    if False:  # mutant: each fetch drains the first buffered partition first\n",
        caught_by=("test_a_backlog_on_several_partitions_is_read_side_by_side",),
        module="tests/integration/kafka/test_kafka_partitions_read_evenly.py",
    ),
    Mutant(
        name="a whole window of records taken from the buffer at once",
        broker="kafka",
        path="airflow_shared_stream/kafka/fair_fetch.py",
        original="    max_records = min(max_records, RECORDS_PER_PARTITION * max(1, len(partitions)))\n",
        mutated="",
        caught_by=("test_a_large_window_takes_a_few_records_per_partition_at_a_time",),
        module="tests/integration/kafka/test_kafka_partitions_read_evenly.py",
    ),
    Mutant(
        name="a JSON record's envelope loses its headers",
        broker="kafka",
        path="airflow_shared_stream/kafka/envelope.py",
        original=(
            '                    "headers": '
            "{name: _text(data) for name, data in headers} if headers else {},\n"
        ),
        mutated='                    "headers": {},\n',
        caught_by=("test_every_record_gets_the_general_builders_envelope",),
        module="tests/unit/kafka/test_envelope_fast_path.py",
    ),
    Mutant(
        name="a refused watcher keeps running silently",
        broker="kafka",
        path="airflow_shared_stream/kafka/watchers.py",
        original="        if self.conflict is not None:\n            raise self.conflict\n",
        mutated="",
        caught_by=(
            "test_watchers_differing_only_in_shape_on_two_triggerers_fail_loudly_not_share_a_position",
        ),
        module=KAFKA_POSITIONS,
    ),
    Mutant(
        name="a watcher that left still marks its position live",
        broker="kafka",
        path="airflow_shared_stream/kafka/watcher_positions.py",
        original="        live = cursor.refs > 0 and not self.closing",
        mutated="        live = True",
        caught_by=("test_a_redeploy_with_other_tuning_on_another_triggerer_resumes_the_same_position",),
        module=KAFKA_POSITIONS,
    ),
    # Service Bus: locks renewed from what the broker says, ranges that never over-settle.
    Mutant(
        name="lock renewals planned from an assumed lock, not the broker's",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/locks.py",
        original="    keeper.renew_every = max(MIN_RENEW_INTERVAL_SECONDS, renew_interval(max(left)))\n",
        mutated="    return  # mutant: the keeper keeps its assumed 60 s lock\n",
        caught_by=(
            f"{SERVICEBUS_LOCKS}::test_message_locks_are_renewed_from_the_brokers_lock_not_the_default",
        ),
    ),
    Mutant(
        name="a short lock does not bring the next renewal pass forward",
        broker="servicebus",
        path="airflow_shared_stream/common/leases.py",
        original="        self._woken.set()\n",
        mutated="        pass  # mutant: the pass already planned is kept\n",
        caught_by=(
            f"{SERVICEBUS_LOCKS}::test_message_locks_are_renewed_from_the_brokers_lock_not_the_default",
        ),
    ),
    Mutant(
        name="the lease keeper's wait swallows the cancel that stops it",
        broker="servicebus",
        path="airflow_shared_stream/common/leases.py",
        original=(
            "                woken = asyncio.ensure_future(self._woken.wait())\n"
            "                try:\n"
            "                    await asyncio.wait([woken], timeout=delay)\n"
            "                finally:\n"
            "                    woken.cancel()\n"
        ),
        mutated=(
            "                with contextlib.suppress(TimeoutError):\n"
            "                    await asyncio.wait_for(self._woken.wait(), delay)\n"
        ),
        caught_by=("tests/unit/common/test_leases.py::test_stop_returns_when_it_meets_a_wake_up",),
    ),
    Mutant(
        name="session locks not read from the session",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/locks.py",
        original='        return seconds_until(getattr(session, "locked_until_utc", None))\n',
        mutated="        return None  # mutant: a session message says nothing about its lock\n",
        caught_by=(f"{SERVICEBUS_LOCKS}::test_session_locks_are_renewed_from_the_brokers_lock",),
    ),
    Mutant(
        name="a range spans a delivery still in flight",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/ranges.py",
        original="        if run and delivery_id(item) != delivery_id(run[-1]) + 1:\n",
        mutated="        if False:  # mutant: a gap does not end a run\n",
        caught_by=(f"{SERVICEBUS_RANGES}::test_a_range_never_covers_a_delivery_still_in_flight",),
    ),
    Mutant(
        name="a range's outcome awaited for the SDK's whole timeout",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/ranges.py",
        original="                outcome_timeout=outcome_timeout(lock_seconds_left, self.outcome_timeout),\n",  # noqa: E501
        mutated="                outcome_timeout=self.outcome_timeout,\n",
        caught_by=(f"{SERVICEBUS_RANGES}::test_a_broker_that_ignores_ranges_costs_speed_not_redeliveries",),
    ),
    Mutant(
        name="an unconfirmed range left to its locks",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/completion.py",
        original="            await self._complete_unconfirmed(what, deliveries)\n",
        mutated="            pass  # mutant: the messages come back when their locks run out\n",
        caught_by=(f"{SERVICEBUS_RANGES}::test_a_broker_that_ignores_ranges_costs_speed_not_redeliveries",),
    ),
    Mutant(
        name="stranded-event sweep without the Dag's row lock",
        broker="scheduling",
        path="airflow_shared_stream/scheduling.py",
        original="        with_row_locks(\n            select(DagModel.is_paused,",
        mutated="        (lambda query, **_: query)(\n            select(DagModel.is_paused,",
        caught_by=(
            f"{TWO_SCHEDULERS}::test_a_sweep_while_another_scheduler_creates_the_run_does_nothing",
            f"{TWO_SCHEDULERS}::test_a_run_created_while_a_sweep_is_uncommitted_waits_for_its_rows",
        ),
    ),
    Mutant(
        name="stranded-event sweep waits for the Dag's row lock",
        broker="scheduling",
        path="airflow_shared_stream/scheduling.py",
        original="            skip_locked=True,\n",
        mutated="",
        caught_by=(f"{TWO_SCHEDULERS}::test_a_sweep_while_another_scheduler_creates_the_run_does_nothing",),
    ),
    Mutant(
        name="stranded-event queue row stamped with the scheduler's clock only",
        broker="scheduling",
        path="airflow_shared_stream/scheduling.py",
        original="        queued_at = max(timezone.utcnow(), *(s.newest_event for s in stranded))\n",
        mutated="        queued_at = timezone.utcnow()\n",
        caught_by=(
            f"{TWO_SCHEDULERS}::test_a_stranded_event_stamped_ahead_of_the_schedulers_clock_is_in_the_next_run",
        ),
    ),
    Mutant(
        name="stranded-event sweep floored by manual runs too",
        broker="scheduling",
        path="airflow_shared_stream/scheduling.py",
        original=(
            "        select(func.max(DagRun.run_after)).where(\n"
            "            DagRun.dag_id == dag_id, DagRun.run_type == DagRunType.ASSET_TRIGGERED\n"
            "        )\n"
        ),
        mutated="        select(func.max(DagRun.run_after)).where(DagRun.dag_id == dag_id)\n",
        caught_by=(f"{STRANDED}::test_a_manual_run_dated_after_the_stranded_events_does_not_hide_them",),
    ),
    # ``--broker console``: the Streams page's guarantees (its auth against a real api-server).
    # (Dropping the redrive route's own permission check survives: Airflow's REST API, which
    # creates the run with the person's own token, refuses the viewer too.)
    Mutant(
        name="Kafka lag per watcher ignores the watcher's position",
        broker="console",
        path="airflow_shared_stream/kafka/lag.py",
        original='[f"{tp.topic}/{tp.partition}"] = max(0, end - position)\n',
        mutated='[f"{tp.topic}/{tp.partition}"] = max(0, end)\n',
        caught_by=("test_each_watchers_lag_per_partition_reaches_zero_when_it_has_everything",),
        module=CONSOLE_KAFKA,
    ),
    Mutant(
        name="Kafka lag noted only after a commit round (stale while nothing settles)",
        broker="console",
        path="airflow_shared_stream/kafka/producer.py",
        original="                self._note_lag(consumer)\n",
        mutated="",
        caught_by=("test_a_watcher_that_settles_nothing_shows_its_lag_without_a_commit",),
        module=CONSOLE_KAFKA,
    ),
    Mutant(
        name="Kafka lag kept by the triggerer but not written with the figures",
        broker="console",
        path="airflow_shared_stream/console/figures.py",
        original='            "lag": self.lag,\n',
        mutated='            "lag": {},\n',
        caught_by=("test_the_lag_a_producer_notes_is_written_with_the_next_flush",),
        module=CONSOLE_FIGURES,
    ),
    Mutant(
        name="Kafka lag of one triggerer hides another's partitions",
        broker="console",
        path="airflow_shared_stream/console/streams.py",
        original="            lag.setdefault(watcher, {}).update(partitions)\n",
        mutated="            lag[watcher] = dict(partitions)\n",
        caught_by=("test_kafka_lag_of_two_triggerers_is_each_ones_partitions_together",),
        module=CONSOLE_STREAMS,
    ),
    Mutant(
        name="Kafka dead-letter depth counts what a redrive already took",
        broker="console",
        path="airflow_shared_stream/console/backlog.py",
        original="ends[tp] - max(starts[tp], taken or 0)",
        mutated="ends[tp] - starts[tp]",
        caught_by=("test_dead_letter_depth_is_what_the_redrive_group_has_not_taken",),
        module=CONSOLE_KAFKA,
    ),
    Mutant(
        name="Service Bus dead-letter depth peeks the queue, not its dead letters",
        broker="console",
        path="airflow_shared_stream/console/backlog.py",
        original="client.get_queue_receiver(entity.queue_name, sub_queue=ServiceBusSubQueue.DEAD_LETTER)",
        mutated="client.get_queue_receiver(entity.queue_name)",
        caught_by=("test_a_queues_dead_letters_are_counted_and_left_as_they_were",),
        module="tests/integration/servicebus/test_servicebus_dead_letter_depth.py",
    ),
    Mutant(
        name="Service Bus dead-letter depth counted by receiving (locks the dead letters)",
        broker="console",
        path="airflow_shared_stream/console/backlog.py",
        original="await receiver.peek_messages(max_message_count=want, sequence_number=next_sequence)",
        mutated="await receiver.receive_messages(max_message_count=want, max_wait_time=1)",
        caught_by=("test_a_queues_dead_letters_are_counted_and_left_as_they_were",),
        module="tests/integration/servicebus/test_servicebus_dead_letter_depth.py",
    ),
    Mutant(
        name="Service Bus dead-letter depth counts one peek only",
        broker="console",
        path="airflow_shared_stream/console/backlog.py",
        original="                count += len(batch)\n",
        mutated="                count += len(batch)\n                break\n",
        caught_by=("test_a_subscriptions_dead_letters_are_its_own_and_counted_up_to_the_limit",),
        module="tests/integration/servicebus/test_servicebus_dead_letter_depth.py",
    ),
    Mutant(
        name="SQS dead-letter depth leaves out the messages in flight",
        broker="console",
        path="airflow_shared_stream/console/backlog.py",
        original='"depth": visible + in_flight}',
        mutated='"depth": visible}',
        caught_by=("test_the_queue_and_its_dead_letter_queue_are_counted",),
        module="tests/integration/sqs/test_sqs_console_backlog.py",
    ),
    Mutant(
        name="the page sends the source as a list the redrive Dag refuses",
        broker="console",
        path="airflow_shared_stream/console/streams.py",
        original='        source, dead_letter = upstream.get("queue_url"), stream.dead_letter\n',
        mutated='        source, dead_letter = [upstream.get("queue_url")], stream.dead_letter\n',
        caught_by=("test_each_brokers_run_conf_is_valid_for_the_dag",),
        module=CONSOLE_REDRIVE_FORM,
    ),
    Mutant(
        name="the redrive form names a field the Dag has no param for",
        broker="console",
        path="airflow_shared_stream/console/static/streams.html",
        original='name: "max_messages", min: 1',
        mutated='name: "max_count", min: 1',
        caught_by=("test_the_pages_form_has_a_field_for_each_choice_the_person_makes",),
        module=CONSOLE_REDRIVE_FORM,
    ),
    Mutant(
        name="the Streams page missing from the UI's Browse menu",
        broker="console",
        path="airflow_shared_stream/console/plugin.py",
        original='            "category": "browse",\n',
        mutated='            "category": "streams",\n',
        caught_by=("test_the_page_in_a_browser_shows_moving_figures_and_starts_a_redrive",),
        module=CONSOLE_E2E,
    ),
    Mutant(
        name="the redrive form offered to a viewer",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="    if not may_trigger(user, redrive.dag_id, redrive.team):\n",
        mutated="    if False:\n",
        caught_by=("test_the_viewer_sees_the_stream_but_cannot_start_a_redrive",),
        module=CONSOLE_E2E,
    ),
    Mutant(
        name="the Streams page open to anonymous requests",
        broker="console",
        path="airflow_shared_stream/console/api.py",
        original='can_read = Depends(requires_access_dag("GET"))\n',
        mutated="can_read = Depends(lambda: None)\n",
        caught_by=("test_anonymous_requests_are_refused",),
        module=CONSOLE_E2E,
    ),
    Mutant(
        name="a URL's user part shown on the Streams page",
        broker="console",
        path="airflow_shared_stream/console/streams.py",
        original='    if not isinstance(value, str) or "@" not in value or "://" not in value:\n',
        mutated="    if True:\n",
        caught_by=("test_a_url_never_shows_its_user_part",),
        module=CONSOLE_STREAMS,
    ),
    Mutant(
        name="stream figures written on every flush",
        broker="console",
        path="airflow_shared_stream/console/figures.py",
        original="and now - self.published_at >= self.interval",
        mutated="and now >= 0",
        caught_by=("test_writes_are_bounded_and_the_last_change_still_lands",),
        module=CONSOLE_FIGURES,
    ),
    Mutant(
        name="a stream's last figures never written",
        broker="console",
        path="airflow_shared_stream/console/figures.py",
        original="                figures.pending = loop.call_later(wait, self._publish_pending, figures)\n",
        mutated="                pass\n",
        caught_by=("test_writes_are_bounded_and_the_last_change_still_lands",),
        module=CONSOLE_FIGURES,
    ),
    Mutant(
        name="a leased queue split across triggerers not reported",
        broker="console",
        path="airflow_shared_stream/console/streams.py",
        original="    if len(per_triggerer) > 1:\n",
        mutated="    if False:\n",
        caught_by=("test_a_leased_queue_split_across_triggerers_is_a_warning",),
        module=CONSOLE_STREAMS,
    ),
    Mutant(
        name="figures of a dead triggerer counted",
        broker="console",
        path="airflow_shared_stream/console/streams.py",
        original="        if job is None or job not in alive:\n",
        mutated="        if job is None:\n",
        caught_by=("test_figures_of_dead_triggerers_are_left_out_and_live_ones_summed",),
        module=CONSOLE_STREAMS,
    ),
    # ``--broker install``: what a user's pip install brings (tests/integration/test_install_quickstart.py).
    Mutant(
        name="sqs extra without boto3 (pip leaves the Amazon provider's boto3 broken)",
        broker="install",
        path="pyproject.toml",
        original='sqs = ["aiobotocore>=3.10,<4", "boto3>=1.43.115,<1.44"]\n',
        mutated='sqs = ["aiobotocore>=3.10,<4"]\n',
        caught_by=("test_pip_check_passes_after_adding_the_sqs_extra_to_the_amazon_provider",),
        module=INSTALL_TESTS,
    ),
    Mutant(
        name="the Spark provider a base dependency",
        broker="install",
        path="pyproject.toml",
        original='    "httpx>=0.27",\n]\n',
        mutated='    "httpx>=0.27",\n    "apache-airflow-providers-apache-spark>=6.3.4",\n]\n',
        caught_by=(
            "test_the_base_install_brings_no_spark",
            "tests/unit/test_distribution.py::test_the_wheel_publishes_user_extras_only_and_no_spark_in_the_base",
        ),
        module=INSTALL_TESTS,
    ),
    Mutant(
        name="the Spark operator not naming its extra",
        broker="install",
        path="airflow_shared_stream/spark/operators.py",
        original='require_sdk("airflow.providers.apache.spark", "spark")\n',
        mutated="",
        caught_by=(
            "tests/unit/spark/test_spark_extra.py::test_the_operator_without_the_spark_provider_names_the_extra",
        ),
    ),
    # Spark: the deferrable operator's guarantees, against the real cluster or the recording master.
    Mutant(
        name="post_submit_commands dropped on the REST path",
        broker="spark",
        path="airflow_shared_stream/spark/operators.py",
        original='    "post_submit_commands": "post_submit_commands",\n',
        mutated="",
        caught_by=("test_spark_submit_only_arguments_are_refused_on_the_rest_path",),
        module=SPARK_UNIT,
    ),
    Mutant(
        name="use_krb5ccache dropped on the REST path",
        broker="spark",
        path="airflow_shared_stream/spark/operators.py",
        original='    "_use_krb5ccache": "use_krb5ccache",\n',
        mutated="",
        caught_by=("test_spark_submit_only_arguments_are_refused_on_the_rest_path",),
        module=SPARK_UNIT,
    ),
    Mutant(
        name="remote Python files submitted to a driver that cannot read them",
        broker="spark",
        path="airflow_shared_stream/spark/rest.py",
        original="        if match and match.group(1).lower() not in LOCAL_SCHEMES:\n",
        mutated="        if False:\n",
        caught_by=("test_python_files_the_cluster_cannot_read_are_refused_at_submit",),
        module=SPARK_CLUSTER,
    ),
    Mutant(
        name="a moved trigger's on_kill kills the driver",
        broker="spark",
        path="airflow_shared_stream/spark/triggers.py",
        original='        if state == "deferred":\n',
        mutated='        if state == "moved":\n',
        caught_by=("test_a_moved_trigger_keeps_its_driver",),
        module=SPARK_MOVES,
    ),
    Mutant(
        name="on_kill never kills",
        broker="spark",
        path="airflow_shared_stream/spark/triggers.py",
        original="        if state == _UNREADABLE:\n",
        mutated="        if True:\n",
        caught_by=("test_marking_the_deferred_task_failed_kills_its_driver",),
        module=SPARK_MOVES,
    ),
    Mutant(
        name="on_kill cut off by the triggerer's repeated cancel",
        broker="spark",
        path="airflow_shared_stream/spark/triggers.py",
        original="        await asyncio.shield(work)\n",
        mutated="        await work\n",
        caught_by=("test_on_kill_finishes_the_kill_when_the_triggerer_cancels_it_again",),
        module=SPARK_RECORDING,
    ),
    Mutant(
        name="on_kill kills when the task state cannot be read",
        broker="spark",
        path="airflow_shared_stream/spark/triggers.py",
        original="        if state == _UNREADABLE:\n",
        mutated="        if False:\n",
        caught_by=("test_on_kill_kills_only_when_the_task_is_no_longer_deferred",),
        module=SPARK_RECORDING,
    ),
    Mutant(
        name="a forgotten driver is submitted again",
        broker="spark",
        path="airflow_shared_stream/spark/operators.py",
        original='        if self.on_unknown_outcome == "resubmit":\n',
        mutated="        if True:\n",
        caught_by=("test_a_retry_never_resubmits_a_driver_the_master_forgot",),
        module=SPARK_FORGOTTEN,
    ),
    Mutant(
        name="an unanswered create is submitted again when it cannot be looked up",
        broker="spark",
        path="airflow_shared_stream/spark/operators.py",
        original='            self._unknown_outcome(\n                "An earlier create request',
        mutated='            self.log.warning(\n                "An earlier create request',
        caught_by=("test_an_unanswered_create_without_master_ui_is_resubmitted_only_by_choice",),
        module=SPARK_RECORDING,
    ),
    Mutant(
        name="shared poller at the longest interval",
        broker="spark",
        path="airflow_shared_stream/spark/poller.py",
        original="                    interval = self._interval = min(\n",
        mutated="                    interval = self._interval = max(\n",
        caught_by=("test_the_shared_poller_runs_at_the_shortest_interval_among_its_watches",),
        module=SPARK_RECORDING,
    ),
    Mutant(
        name="a faster watch joining a sleeping poller waits out its sleep",
        broker="spark",
        path="airflow_shared_stream/spark/poller.py",
        original="            self._wake.set()  # sleep no longer than the new watch wants (joins otherwise wait a round)\n",  # noqa: E501
        mutated="            pass\n",
        caught_by=("test_the_shared_poller_runs_at_the_shortest_interval_among_its_watches",),
        module=SPARK_RECORDING,
    ),
    Mutant(
        name="a failed demo run deletes its work directory and its logs",
        broker="scripts",
        path="scripts/demo.py",
        original="    if succeeded:\n",
        mutated="    if True:\n",
        caught_by=("test_a_failed_run_keeps_its_work_directory_and_names_its_logs",),
        module="tests/unit/test_demo_work_dir.py",
    ),
    Mutant(
        name="the package loads on an Airflow older than it needs",
        broker="package",
        path="airflow_shared_stream/__init__.py",
        original="    if Version(Version(version).base_version) < Version(MIN_AIRFLOW_VERSION):\n",
        mutated="    if False:\n",
        caught_by=("test_importing_the_package_on_an_older_airflow_raises_naming_both_versions",),
        module="tests/unit/test_airflow_version_guard.py",
    ),
    Mutant(
        name="a deprecation raised as a plain DeprecationWarning",
        broker="package",
        path="airflow_shared_stream/common/trigger.py",
        original="        AirflowProviderDeprecationWarning,\n",
        mutated="        DeprecationWarning,\n",
        caught_by=("test_the_package_names_no_plain_deprecation_warning_class",),
        module="tests/unit/test_deprecation_warnings.py",
    ),
    Mutant(
        name="a Markdown result table included as a literal block",
        broker="docs",
        path="docs/benchmarks.rst",
        original=".. include:: ../bench/results/sqs_lanes.md\n   :parser: myst_parser.sphinx_\n",
        mutated=".. literalinclude:: ../bench/results/sqs_lanes.md\n   :language: markdown\n",
        caught_by=("test_every_page_fits_the_window_shows_no_raw_markdown_and_loads_its_images",),
        module="tests/docs/test_rendering.py",
    ),
    Mutant(
        name="inline literals that cannot wrap widen the page",
        broker="docs",
        path="docs/_static/responsive.css",
        original="div.body code span.pre {\n  white-space: pre-wrap;\n",
        mutated="div.body code span.pre {\n  white-space: nowrap;\n",
        caught_by=("test_every_page_fits_the_window_shows_no_raw_markdown_and_loads_its_images",),
        module="tests/docs/test_rendering.py",
    ),
    # Dead-letter redrive: a message leaves the dead-letter source only after its copy is accepted.
    # The redrive child is killed at the checkpoint between its two steps: with the steps swapped,
    # the messages it removed never reached the origin.
    *(
        Mutant(
            name="redrive removes from the dead-letter source before the copy is accepted",
            broker=broker,
            path="airflow_shared_stream/common/redrive.py",
            original=REDRIVE_COPY_THEN_REMOVE,
            mutated=(
                "            await source.remove(selected, skipped)\n"
                "            if checkpoint is not None:\n"
                '                await checkpoint("copied", selected)\n'
                "            accepted = list(await source.copy(selected)) if selected else []\n"
            ),
            caught_by=(test,),
            module=f"tests/integration/{broker}/test_{broker}_redrive.py",
        )
        for broker, test in (
            ("sqs", "test_a_redrive_killed_between_copy_and_delete_loses_nothing"),
            ("kafka", "test_a_redrive_killed_between_produce_and_commit_loses_nothing"),
            ("pubsub", "test_a_redrive_killed_between_publish_and_ack_loses_nothing"),
            ("servicebus", "test_a_redrive_killed_between_send_and_complete_loses_nothing"),
        )
    ),
    # The engine refuses a redrive whose destination feeds its own dead-letter source, from the
    # route each broker's source states: when built, and once open (what only the broker knows).
    Mutant(
        name="redrive moves dead letters into the source they are read from",
        broker="sqs",
        path="airflow_shared_stream/common/redrive.py",
        original="    if route.read_from is not None and route.read_from == route.write_to:\n",
        mutated="    if False:\n",
        caught_by=(
            "test_the_engine_refuses_a_destination_that_is_the_dead_letter_source_before_connecting",
            "test_bad_arguments_fail_when_the_dag_is_parsed",
        ),
        module="tests/unit/test_redrive_operator.py",
    ),
    Mutant(
        name="redrive checks its route only before the broker says which topic it reads",
        broker="pubsub",
        path="airflow_shared_stream/common/redrive.py",
        original=(
            "        refuse_loop(source)  # what only the broker knows (a subscription's topic), now known\n"
        ),
        mutated="        pass\n",
        caught_by=(
            "test_a_dead_letter_subscription_of_the_destination_topic_is_refused_once_open",
            "tests/unit/test_redrive_operator.py::test_the_engine_refuses_a_loop_it_learns_of_only_once_open",
        ),
        module="tests/integration/pubsub/test_pubsub_redrive.py",
    ),
    Mutant(
        name="redrive commits past a Kafka record it could not copy",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original="            while passed < len(pending) and pending[passed] in handled:\n",
        mutated="            while passed < len(pending):\n",
        caught_by=("test_a_record_that_cannot_be_copied_is_never_committed_past",),
        module="tests/integration/kafka/test_kafka_redrive.py",
    ),
    Mutant(
        name="redrive deletes from the SQS dead-letter queue before SendMessageBatch",
        broker="sqs",
        path="airflow_shared_stream/sqs/redrive.py",
        original="        entries = [self._entry(str(i), item.handle) for i, item in enumerate(items)]\n",
        mutated=(
            "        await self.remove(items, [])\n"
            "        entries = [self._entry(str(i), item.handle) for i, item in enumerate(items)]\n"
        ),
        caught_by=("test_a_copy_sqs_refuses_stays_in_the_dead_letter_queue",),
        module="tests/integration/sqs/test_sqs_redrive.py",
    ),
    Mutant(
        name="redrive acknowledges a Pub/Sub dead letter whose publish was refused",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/redrive.py",
        original=(
            '                log.warning("Pub/Sub refused the copy of %s: %s", item.key, exc)\n'
            "                continue\n"
        ),
        mutated='                log.warning("Pub/Sub refused the copy of %s: %s", item.key, exc)\n',
        caught_by=("test_a_copy_pubsub_refuses_stays_in_the_dead_letter_subscription",),
        module="tests/integration/pubsub/test_pubsub_redrive.py",
    ),
    # The contract's shape-conflict, close and telemetry guarantees (tests/integration/contract).
    Mutant(
        name="a watcher that disagrees with its stream's consumer is let in",
        broker="servicebus",
        path="airflow_shared_stream/common/trigger.py",
        original="        if conflicts:\n            raise StreamShapeConflictError(\n",
        mutated="        if False:\n            raise StreamShapeConflictError(\n",
        caught_by=("test_watchers_that_disagree_with_the_stream_fail_naming_the_argument",),
    ),
    Mutant(
        name="a closing Pub/Sub stream keeps what it holds until the ack deadline",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/producer.py",
        original=(
            "            await asyncio.wait_for(self.redeliver(deliveries), timeout=CLOSE_NACK_SECONDS)\n"
        ),
        mutated="            pass\n",
        caught_by=("test_a_closing_stream_sends_what_was_done_and_gives_back_the_rest_at_once",),
    ),
    Mutant(
        name="watcher deliveries of a leased queue's advance not counted",
        broker="servicebus",
        path="airflow_shared_stream/common/metrics.py",
        original="        self.incr(FANNED_OUT, fanned_out)\n",
        mutated="        pass\n",
        caught_by=("test_stream_metrics_count_each_outcome_and_carry_no_secret",),
    ),
    Mutant(
        name="a closing SQS stream keeps what it holds until the visibility timeout",
        broker="sqs",
        path="airflow_shared_stream/sqs/producer.py",
        original="        handles = [d.handle for d in deliveries]\n        await asyncio.wait_for(\n",
        mutated=(
            "        return  # mutant: nothing given back on close\n"
            "        handles = [d.handle for d in deliveries]\n        await asyncio.wait_for(\n"
        ),
        caught_by=("test_a_closing_stream_sends_what_was_done_and_gives_back_the_rest_at_once",),
    ),
    Mutant(
        name="a closing SQS stream gives back while its receive still polls",
        broker="sqs",
        path="airflow_shared_stream/sqs/producer.py",
        original="    receives_take_given_back = True\n",
        mutated="    receives_take_given_back = False\n",
        caught_by=("test_a_closing_stream_spends_no_delivery_attempt_of_its_own",),
    ),
    Mutant(
        name="a closing Pub/Sub stream nacks while its pulls still wait",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/producer.py",
        original="    receives_take_given_back = True\n",
        mutated="    receives_take_given_back = False\n",
        caught_by=("test_a_closing_stream_spends_no_delivery_attempt_of_its_own",),
    ),
    Mutant(
        name="a closing SQS stream gives back only its first batch call",
        broker="sqs",
        path="airflow_shared_stream/sqs/producer.py",
        original="for chunk in chunked(handles, max_count=SQS_BATCH_LIMIT))\n",
        mutated="for chunk in list(chunked(handles, max_count=SQS_BATCH_LIMIT))[:1])\n",
        caught_by=("test_a_closing_stream_gives_back_more_than_one_batch_call",),
    ),
    Mutant(
        name="a refused Kafka login reported as an unreachable endpoint",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original="            cause = await login_refusal_behind(consumer._client, exc)\n",
        mutated="            cause = exc\n",
        caught_by=("test_refused_credentials_are_an_access_error_without_the_secret",),
    ),
    Mutant(
        name="Kafka auto-commit in the connection taken",
        broker="kafka",
        path="airflow_shared_stream/kafka/hook.py",
        original=(
            '    if "enable.auto.commit" in extra and '
            '_flag("enable.auto.commit", extra["enable.auto.commit"]):\n'
        ),
        mutated="    if False:  # mutant: auto-commit let through\n",
        caught_by=("test_auto_commit_refused",),
        module="tests/unit/kafka/test_hook.py",
    ),
    Mutant(
        name="Kafka reads aborted transactions by default",
        broker="kafka",
        path="airflow_shared_stream/kafka/hook.py",
        original='    isolation = str(extra.get("isolation.level", "read_committed")).strip().lower()\n',
        mutated='    isolation = str(extra.get("isolation.level", "read_uncommitted")).strip().lower()\n',
        caught_by=("test_aborted_transactions_are_not_read_by_default",),
        module=KAFKA_LOSS_PATHS,
    ),
    # fix/kafka-dlq-positions: dead letters never take the stream down; a watcher the manager
    # no longer serves is not moved (issue 46, items 1-4)
    Mutant(
        name="Kafka pointer of a keyless record sent with neither key nor value",
        broker="kafka",
        path="airflow_shared_stream/kafka/dead_letter.py",
        original="        key = payload.key if keep_key else POINTER_EMPTY_KEY\n",
        mutated="        key = payload.key if keep_key else None\n",
        caught_by=("test_a_keyless_record_too_large_for_the_dead_letter_topic_becomes_a_pointer",),
        module="tests/integration/kafka/test_kafka_dead_letter_sizing.py",
    ),
    Mutant(
        name="Kafka dead letters batched past the dead-letter topic's limit",
        broker="kafka",
        path="airflow_shared_stream/kafka/dead_letter.py",
        original="            sized[name] = limit\n",
        mutated="            pass  # mutant: aiokafka's own batch and request sizes\n",
        caught_by=("test_records_that_fit_the_dead_letter_topic_are_copied_whole",),
        module="tests/integration/kafka/test_kafka_dead_letter_sizing.py",
    ),
    Mutant(
        name="Kafka pointer keeps a key that does not fit the dead-letter topic",
        broker="kafka",
        path="airflow_shared_stream/kafka/dead_letter.py",
        original="        if key != POINTER_EMPTY_KEY:  # the key may not fit the topic: the pointer goes without it\n",  # noqa: E501
        mutated="        if False:  # mutant: the pointer is sent with its key, or bare\n",
        caught_by=("test_a_pointer_whose_key_does_not_fit_the_topic_goes_without_it",),
        module="tests/integration/kafka/test_kafka_dead_letter_sizing.py",
    ),
    Mutant(
        name="Kafka watcher moved over records its subscriber never finished",
        broker="kafka",
        path="airflow_shared_stream/kafka/watcher_positions.py",
        original="                    position += 1 if cursor.finished(payload.seq) else 0\n",
        mutated="                    position += 1  # mutant: every settled record moves every watcher\n",
        caught_by=(
            "test_a_watcher_failed_by_the_ack_timeout_keeps_its_position",
            "test_a_cancelled_watcher_is_not_moved_while_core_holds_its_filter",
        ),
        module="tests/integration/kafka/test_kafka_watcher_leaves.py",
    ),
    Mutant(
        name="Kafka watcher leaves only when core closes its cancelled filter",
        broker="kafka",
        path="airflow_shared_stream/kafka/trigger.py",
        original="                task.add_done_callback(leave)\n",
        mutated="                pass  # mutant: no leave at the task's end\n",
        caught_by=("test_a_cancelled_watcher_is_not_moved_while_core_holds_its_filter",),
        module="tests/integration/kafka/test_kafka_watcher_leaves.py",
    ),
    # fix/sb-sessions: issue 47 items 1-3, a session message no watcher saw spends no delivery;
    # the azure-servicebus floor.
    Mutant(
        name="a Service Bus session with nothing in flight loses its lock behind a full window",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/sessions.py",
        original="            self._start_keeping_locks()\n",
        mutated="            pass  # mutant: a session is renewed only through its messages in flight\n",
        caught_by=("test_a_session_held_behind_a_full_window_keeps_its_lock",),
        module=SERVICEBUS_SESSION_BUDGET,
    ),
    Mutant(
        name="held Service Bus session messages given back by abandoning them",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/producer.py",
        original="        rest = await self._release([d for d in deliveries if d.handle.session is None])\n",
        mutated="        rest = await self._release(deliveries)  # mutant: session messages abandoned\n",
        caught_by=("test_held_session_messages_given_back_past_the_bound_spend_no_attempt",),
        module=SERVICEBUS_SESSION_BUDGET,
    ),
    Mutant(
        name="a Service Bus session message held back behind its redelivery abandoned",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/producer.py",
        original=(
            "        abandon = [d for d in deliveries if d.handle.session is None "
            "or not d.handle.session.restarting]\n"
        ),
        mutated="        abandon = list(deliveries)  # mutant: abandoned, counting a delivery\n",
        caught_by=("test_a_message_held_back_behind_its_sessions_redelivery_spends_no_attempt",),
        module=SERVICEBUS_SESSION_BUDGET,
    ),
    Mutant(
        name="the servicebus extra allows an azure-servicebus below the floor",
        broker="servicebus",
        path="pyproject.toml",
        original='servicebus = ["azure-servicebus>=7.15.0"]\n',
        mutated='servicebus = ["azure-servicebus>=7.12"]\n',
        caught_by=(
            "tests/unit/servicebus/test_sdk_floor.py::test_the_servicebus_extra_requires_the_floor_the_stream_checks",
            "tests/unit/test_distribution.py::test_the_servicebus_extra_installs_no_sdk_below_the_floor",
        ),
    ),
    Mutant(
        name="an azure-servicebus below the floor taken without a word",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/errors.py",
        original="    if Version(installed) < Version(MIN_SDK_VERSION):\n",
        mutated="    if False:  # mutant: any SDK taken\n",
        caught_by=("test_an_sdk_below_the_floor_is_refused_by_name",),
        module="tests/unit/servicebus/test_sdk_floor.py",
    ),
    # fix/kafka-metadata: Kafka positions when the cluster changes (issue 46, items 5-8)
    Mutant(
        name="Kafka position below the log start not moved to it",
        broker="kafka",
        path="airflow_shared_stream/kafka/log_bounds.py",
        original="    if position < bounds.start:\n",
        mutated="    if position < bounds.start - 2**62:\n",
        caught_by=("test_a_position_below_the_log_start_moves_to_it_loudly_and_restarts_skip_nothing",),
        module=KAFKA_CLUSTER_CHANGES,
    ),
    Mutant(
        name="Kafka coordinator loading answer read as no position",
        broker="kafka",
        path="airflow_shared_stream/kafka/positions.py",
        original='        self._raise_for(group, getattr(response, "error_code", 0))  # request-level, v2+\n',
        mutated="",
        caught_by=("test_a_coordinator_loading_answer_is_asked_again_not_taken_for_a_new_watcher",),
        module=KAFKA_CLUSTER_CHANGES,
    ),
    Mutant(
        name="Kafka new topic id not taken for a topic created again",
        broker="kafka",
        path="airflow_shared_stream/kafka/cluster_watch.py",
        original="(before is not None and before.topic_id != now.topic_id)",
        mutated="(False)",
        caught_by=("test_a_topic_created_again_while_the_stream_runs_is_read_from_its_start",),
        module=KAFKA_CLUSTER_CHANGES,
    ),
    Mutant(
        name="Kafka partitions added while running not read",
        broker="kafka",
        path="airflow_shared_stream/kafka/cluster_watch.py",
        original="            for partition in range(shape.partitions)\n",
        mutated="            for partition in range(0)\n",
        caught_by=("test_a_partition_added_while_the_stream_runs_is_read_from_its_start",),
        module=KAFKA_CLUSTER_CHANGES,
    ),
    Mutant(
        name="Kafka partition added while down anchored at auto.offset.reset",
        broker="kafka",
        path="airflow_shared_stream/kafka/log_bounds.py",
        original="        elif tp.topic in known_topics and tp in bounds:\n",
        mutated="        elif False:\n",
        caught_by=("test_a_partition_added_while_the_stream_is_down_is_read_from_its_start_on_restart",),
        module=KAFKA_CLUSTER_CHANGES,
    ),
    # fix/redrive-bounds: issue 45 items 1, 5, 10, 11 -- a redrive stops at its snapshot, keeps what
    # its filter skipped reachable (Kafka) or hidden while it reads on (queues), holds one batch on a
    # log, reports what it left; a blank count is the default, a bad filter is refused on POST.
    Mutant(
        name="Kafka redrive reads past the end offsets of its snapshot",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original=(
            "                    if record.offset >= self._ends[tp] and "
            "record.timestamp > self._started_ms:\n"
        ),
        mutated="                    if False:\n",
        caught_by=("test_a_redrive_stops_at_the_end_offsets_it_started_with",),
        module="tests/integration/kafka/test_kafka_redrive_bounds.py",
    ),
    Mutant(
        name="redrive examines past the depth of its snapshot",
        broker="sqs",
        path="airflow_shared_stream/common/redrive.py",
        original=(
            "        while summary.moved < limit and (snapshot.depth is None or "
            "summary.examined < snapshot.depth):\n"
        ),
        mutated="        while summary.moved < limit:\n",
        caught_by=("test_an_sqs_redrive_stops_at_the_depth_it_started_with",),
        module="tests/integration/sqs/test_sqs_redrive_bounds.py",
    ),
    Mutant(
        name="Pub/Sub redrive takes messages published after it started",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/redrive.py",
        original="        past = self._started_ns is not None and published_ns > self._started_ns\n",
        mutated="        past = False\n",
        caught_by=("test_a_pubsub_redrive_never_chases_its_own_copies",),
        module="tests/integration/pubsub/test_pubsub_redrive_bounds.py",
    ),
    Mutant(
        name="Service Bus redrive takes dead letters enqueued after it started",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/redrive.py",
        original=(
            "            past = self._started is not None and enqueued is not None and "
            "enqueued > self._started\n"
        ),
        mutated="            past = False\n",
        caught_by=("test_a_service_bus_redrive_never_chases_its_own_copies",),
        module="tests/integration/servicebus/test_servicebus_redrive_bounds.py",
    ),
    Mutant(
        name="Kafka redrive commits past skipped records without appending them again",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original=(
            "        appended = await self._append_again([item for item in skipped if item.leave is None])\n"
        ),
        mutated="        appended = [item for item in skipped if item.leave is None]\n",
        caught_by=("test_a_filtered_redrive_leaves_the_skipped_records_to_the_next_one",),
        module="tests/integration/kafka/test_kafka_redrive_bounds.py",
    ),
    Mutant(
        name="Kafka redrive appends another stream's records again (they reach that stream twice)",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original=(
            "        appended = await self._append_again([item for item in skipped if item.leave is None])\n"
        ),
        mutated="        appended = await self._append_again(list(skipped))\n",
        caught_by=("test_a_dead_letter_topic_shared_by_two_streams_sends_each_record_home",),
        module="tests/integration/kafka/test_kafka_redrive_routes.py",
    ),
    Mutant(
        name="Kafka redrive holds every record its dry run read",
        broker="kafka",
        path="airflow_shared_stream/common/redrive.py",
        original=(
            '    """A queue holds what stays until the end (each read once); a log has nothing to hold."""\n'
            "    if source.lease_seconds is not None:\n"
        ),
        mutated=(
            '    """A queue holds what stays until the end (each read once); a log has nothing to hold."""\n'
            "    if True:\n"
        ),
        caught_by=("test_a_dry_run_holds_one_batch_whatever_the_depth",),
        module="tests/integration/kafka/test_kafka_redrive_bounds.py",
    ),
    Mutant(
        name="redrive never renews the leases of what it holds",
        broker="sqs",
        path="airflow_shared_stream/common/redrive.py",
        original="            self._task = asyncio.create_task(self._renew_every())\n",
        mutated="            pass\n",
        caught_by=("test_a_filtered_redrive_keeps_what_it_skipped_hidden_and_reads_on_to_its_snapshot",),
        module="tests/integration/sqs/test_sqs_redrive_bounds.py",
    ),
    Mutant(
        name="redrive ends at the first read of messages it already holds",
        broker="sqs",
        path="airflow_shared_stream/common/redrive.py",
        original="                if returning_reads >= RETURNING_READS_LIMIT:\n",
        mutated="                if True:\n",
        caught_by=("test_a_read_of_messages_already_held_does_not_end_the_redrive",),
        module="tests/unit/test_redrive_operator.py",
    ),
    Mutant(
        name="redrive without max_messages is unbounded",
        broker="sqs",
        path="airflow_shared_stream/common/redrive.py",
        original="    if max_messages is None:\n        return DEFAULT_MAX_MESSAGES\n",
        mutated="    if max_messages is None:\n        return 10**9\n",
        caught_by=("test_no_maximum_is_the_default_maximum_never_unbounded",),
        module="tests/unit/test_redrive_operator.py",
    ),
    Mutant(
        name="the page sends a blank max_messages over the redrive Dag's default",
        broker="sqs",
        path="airflow_shared_stream/console/api.py",
        original="        return self.model_dump(exclude_none=True)\n",
        mutated="        return self.model_dump()\n",
        caught_by=("test_a_blank_max_messages_leaves_the_dags_default",),
        module=CONSOLE_REDRIVE_FORM,
    ),
    Mutant(
        name="the page accepts a redrive filter that does not compile",
        broker="sqs",
        path="airflow_shared_stream/console/api.py",
        original="        compile_filter(value or None)\n",
        mutated="        pass\n",
        caught_by=("test_a_filter_that_does_not_compile_is_refused_where_the_redrive_is_asked_for",),
        module=CONSOLE_REDRIVE_FORM,
    ),
    Mutant(
        name="redrive report leaves out what it left",
        broker="sqs",
        path="airflow_shared_stream/common/redrive.py",
        original="    summary.left = _left(summary, exhausted)\n",
        mutated="    summary.left = None\n",
        caught_by=("test_the_operator_reports_examined_moved_skipped_left",),
        module="tests/integration/sqs/test_sqs_redrive_bounds.py",
    ),
    # fix/console-auth: the Streams page and the redrive Dag authorized per Dag and team (issue 45, 6 and 7)
    Mutant(
        name="console auth: a stream listed with every watcher to whoever reads one of its Dags",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="        watchers = [w for w in stream.watchers if readable.intersection(w.dags)]\n",
        mutated="        watchers = list(stream.watchers)\n",
        caught_by=(
            "test_a_user_sees_the_streams_of_the_dags_their_team_may_read",
            "test_of_a_shared_stream_a_user_sees_only_the_watchers_of_their_dags",
        ),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="console auth: the Dag's team left out of the page's questions to the auth manager",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="            details=DagDetails(id=dag_id, team_name=team),\n",
        mutated="            details=DagDetails(id=dag_id, team_name=None),\n",
        caught_by=("test_a_user_sees_the_streams_of_the_dags_their_team_may_read",),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="console auth: a redrive allowed with the right to trigger the redrive Dag only",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="    refused = sorted(d for d in dags if not may_trigger(user, d, teams.get(d)))\n",
        mutated="    refused: list[str] = []\n",
        caught_by=("test_a_redrive_needs_the_right_to_trigger_every_dag_of_the_stream",),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="console auth: a paused redrive Dag still offers the redrive",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="    if redrive.paused:\n",
        mutated="    if False:\n",
        caught_by=("test_a_paused_or_missing_redrive_dag_refuses_with_409",),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="console auth: the redrive task runs without checking its grant",
        broker="console",
        path="airflow_shared_stream/redrive.py",
        original="        if self.require_grant:\n",
        mutated="        if False:\n",
        caught_by=("test_the_redrive_task_refuses_a_run_without_a_grant_before_reading_anything",),
        module=REDRIVE_GRANT,
    ),
    Mutant(
        name="console auth: a grant copied into another run accepted",
        broker="console",
        path="airflow_shared_stream/redrive_grant.py",
        original='    if signed.get("run_id") != run_id:\n',
        mutated="    if False:\n",
        caught_by=("test_a_grant_copied_into_another_run_is_refused",),
        module=REDRIVE_GRANT,
    ),
    Mutant(
        name="console auth: a grant used by another user accepted",
        broker="console",
        path="airflow_shared_stream/redrive_grant.py",
        original='    if not triggering_user_name or signed.get("user") != triggering_user_name:\n',
        mutated="    if False:\n",
        caught_by=("test_a_grant_used_by_another_user_is_refused",),
        module=REDRIVE_GRANT,
    ),
    Mutant(
        name="console auth: a run's edited addresses accepted under the grant",
        broker="console",
        path="airflow_shared_stream/redrive_grant.py",
        original="    if changed:\n",
        mutated="    if False:\n",
        caught_by=("test_a_run_whose_addresses_differ_from_the_grant_is_refused",),
        module=REDRIVE_GRANT,
    ),
    Mutant(
        name="console auth e2e: the redrive Dag moves another team's queue when triggered by hand",
        broker="console",
        path="airflow_shared_stream/redrive_dag.py",
        original="            require_grant=True,  # addresses from conf: only what the page granted\n",
        mutated="            require_grant=False,\n",
        caught_by=("test_a_redrive_triggered_by_hand_with_another_teams_addresses_moves_nothing",),
        module=CONSOLE_TEAMS_E2E,
    ),
    Mutant(
        name="console auth e2e: the page posts the user's token where the Host header points",
        broker="console",
        path="airflow_shared_stream/console/api.py",
        original="        async with httpx.AsyncClient(base_url=airflow_api_root(), timeout=30) as client:\n",
        mutated=(
            '        async with httpx.AsyncClient(base_url=f"{request.url.scheme}://{request.url.netloc}", '
            "timeout=30) as client:\n"
        ),
        caught_by=("test_a_granted_redrive_runs_and_its_conf_cannot_be_replayed_for_another_run",),
        module=CONSOLE_TEAMS_E2E,
    ),
    Mutant(
        name="console auth e2e: JSON answers without Cache-Control no-store",
        broker="console",
        path="airflow_shared_stream/console/api.py",
        original="            response.headers.setdefault(name, value)\n",
        mutated="            pass\n",
        caught_by=("test_every_json_answer_says_no_store",),
        module=CONSOLE_TEAMS_E2E,
    ),
    # fix/spark-stranded: orphaned drivers (issue 46 item 9)
    Mutant(
        name="orphaned Spark driver never killed",
        broker="spark",
        path="airflow_shared_stream/spark/poller.py",
        original="            await self.orphans.check(listing, self._watches.keys(), ui, rest)\n",
        mutated="            pass\n",
        caught_by=(
            "tests/integration/spark/test_orphaned_driver.py::"
            "test_a_task_marked_failed_while_its_triggerer_is_dead_loses_its_driver",
            f"{SPARK_RECORDING}::test_a_poller_kills_another_driver_only_once_its_task_has_ended",
        ),
    ),
    Mutant(
        name="orphan check kills drivers whose task has not ended",
        broker="spark",
        path="airflow_shared_stream/spark/orphans.py",
        original="                if state in ENDED_STATES or (state == GONE and self._ours(ref)):\n",
        mutated="                if state is not None:\n",
        caught_by=("test_a_poller_kills_another_driver_only_once_its_task_has_ended",),
        module=SPARK_RECORDING,
    ),
    Mutant(
        name="orphan check kills the drivers its own watches wait on",
        broker="spark",
        path="airflow_shared_stream/spark/orphans.py",
        original=" if d.state in ACTIVE_STATES and d.driver_id not in watched\n",
        mutated=" if d.state in ACTIVE_STATES\n",
        caught_by=("test_a_poller_kills_another_driver_only_once_its_task_has_ended",),
        module=SPARK_RECORDING,
    ),
    # fix/redrive-routes: each dead letter goes home or is left untouched (issue 45 item 2), a
    # truncated copy is never put back as the original (4), Service Bus copies get ids of their
    # own (3), and copies go in batches the broker accepts (8, 9).
    Mutant(
        name="redrive routes: an SQS dead letter stamped with another queue is moved anyway",
        broker="sqs",
        path="airflow_shared_stream/sqs/redrive.py",
        original="            if origin == self._source_arn:\n",
        mutated="            if origin == self._source_arn or origin:\n",
        caught_by=("test_a_dead_letter_queue_shared_by_two_streams_sends_each_message_home",),
        module=SQS_REDRIVE_ROUTES,
    ),
    Mutant(
        name="redrive routes: SQS dead-lettering stamps no origin queue",
        broker="sqs",
        path="airflow_shared_stream/sqs/producer.py",
        original="            origin=self._queue_arn,\n",
        mutated="            origin=None,\n",
        caught_by=("test_a_dead_letter_queue_shared_by_two_streams_sends_each_message_home",),
        module=SQS_REDRIVE_ROUTES,
    ),
    Mutant(
        name="redrive routes: the loop copies what the origin rule left",
        broker="sqs",
        path="airflow_shared_stream/common/redrive.py",
        original="                if item.leave is not None:\n                    continue\n",
        mutated="                if False:\n                    continue\n",
        caught_by=("test_a_dead_letter_queue_shared_by_two_streams_sends_each_message_home",),
        module=SQS_REDRIVE_ROUTES,
    ),
    Mutant(
        name="redrive routes: unstamped SQS dead letters moved from a queue two sources redrive to",
        broker="sqs",
        path="airflow_shared_stream/sqs/redrive.py",
        original="            and len(urls) == 1\n",
        mutated="            and len(urls) >= 1\n",
        caught_by=("test_unstamped_dead_letters_go_home_only_from_a_queue_that_one_source_redrives_to",),
        module=SQS_REDRIVE_ROUTES,
    ),
    Mutant(
        name="redrive routes: a truncated SQS dead letter put back as the original",
        broker="sqs",
        path="airflow_shared_stream/sqs/redrive.py",
        original="        if truncated is not None:\n",
        mutated="        if False:\n",
        caught_by=("test_a_truncated_dead_letter_is_never_put_back_as_the_original",),
        module=SQS_REDRIVE_ROUTES,
    ),
    Mutant(
        name="redrive routes: SQS copies sent in batches of any size",
        broker="sqs",
        path="airflow_shared_stream/sqs/redrive.py",
        original=" max_bytes=SQS_MAX_MESSAGE_BYTES, size=entry_size\n",
        mutated=" max_bytes=None, size=entry_size\n",
        caught_by=("test_copies_go_in_batches_sqs_accepts",),
        module=SQS_REDRIVE_ROUTES,
    ),
    Mutant(
        name="redrive routes: a Service Bus copy reuses the dead letter's message id",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/redrive.py",
        original="            message_id=self._copy_id(message),\n",
        mutated="            message_id=message.message_id,\n",
        caught_by=("test_a_redrive_on_an_entity_with_duplicate_detection_loses_nothing",),
        module="tests/integration/servicebus/test_servicebus_redrive_copies.py",
    ),
    Mutant(
        name="redrive routes: Service Bus copies sent as one batch whatever their size",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/redrive.py",
        original="        accepted: list[RedriveItem] = []\n        batch, in_batch",
        mutated=(
            "        return await self._send([self._copy_of(i.handle) for i in items], items)\n"
            "        accepted: list[RedriveItem] = []\n        batch, in_batch"
        ),
        caught_by=("test_copies_go_in_batches_the_namespace_accepts",),
        module="tests/integration/servicebus/test_servicebus_redrive_copies.py",
    ),
    Mutant(
        name="redrive routes: a Kafka record of another topic produced to the named source",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original="        if self._targets is not None and origin not in self._targets:\n",
        mutated="        if False:\n",
        caught_by=("test_a_dead_letter_topic_shared_by_two_streams_sends_each_record_home",),
        module="tests/integration/kafka/test_kafka_redrive_routes.py",
    ),
    Mutant(
        name="redrive routes: one Kafka redrive group for every destination",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original="        self._group_id = group_id or default_group_id(dead_letter, source)\n",
        mutated="        self._group_id = group_id or default_group_id(dead_letter)\n",
        caught_by=("test_a_dead_letter_topic_shared_by_two_streams_sends_each_record_home",),
        module="tests/integration/kafka/test_kafka_redrive_routes.py",
    ),
    Mutant(
        name="redrive routes: a Kafka pointer record refused without saying where the original is",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original="                    _pointer(record),\n",
        mutated='                    "no value",\n',
        caught_by=("test_a_pointer_record_is_refused_by_name_with_where_the_original_is",),
        module="tests/integration/kafka/test_kafka_redrive_routes.py",
    ),
    Mutant(
        name="redrive routes: a Pub/Sub dead letter of another topic's subscription published anyway",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/redrive.py",
        original="        if topic == self.topic:\n",
        mutated="        if True:\n",
        caught_by=("test_a_dead_letter_topic_shared_by_two_streams_sends_each_message_home",),
        module=PUBSUB_REDRIVE_ROUTES,
    ),
    Mutant(
        name="redrive routes: a truncated Pub/Sub dead letter published as the original",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/redrive.py",
        original="        for marker in (DEAD_LETTER_TRUNCATED_FROM, DEAD_LETTER_ATTRIBUTES_DROPPED):\n",
        mutated="        for marker in ():\n",
        caught_by=("test_a_truncated_dead_letter_is_never_published_as_the_original",),
        module=PUBSUB_REDRIVE_ROUTES,
    ),
    Mutant(
        name="redrive routes: the Pub/Sub dead-letter policy's origin stamp is not read",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/redrive.py",
        original="        if SERVICE_ORIGIN_SUBSCRIPTION in attributes:\n",
        mutated="        if False:\n",
        caught_by=("test_the_dead_letter_policy_s_own_dead_letters_go_home_by_its_stamp",),
        module=PUBSUB_REDRIVE_ROUTES,
    ),
    # fix/console-figures: Streams page figures keyed by stream identity, live triggerers only (issue 45).
    Mutant(
        name="figures of a dead triggerer counted while its carrier runs on a live one",
        broker="console",
        path="airflow_shared_stream/console/streams.py",
        original="        if job not in newest or _published_at(value) > _published_at(newest[job]):\n",
        mutated="        if True:\n            job = len(newest)  # mutant: every value counts\n",
        caught_by=(
            f"{CONSOLE_STREAMS}::test_a_dead_triggerers_last_figures_never_count_once_its_carrier_runs_elsewhere",
            f"{CONSOLE_FIGURES_E2E}::test_a_dead_triggerers_figures_leave_the_page_when_its_carrier_runs_elsewhere",
        ),
    ),
    Mutant(
        name="figures of one triggerer counted once per carrier it ever had",
        broker="console",
        path="airflow_shared_stream/console/streams.py",
        original="            newest[job] = value\n",
        mutated="            newest[len(newest)] = value\n",
        caught_by=("test_one_triggerer_counts_once_when_its_carrier_changed",),
        module=CONSOLE_STREAMS,
    ),
    Mutant(
        name="figures not written when a watcher joins a running stream",
        broker="console",
        path="airflow_shared_stream/console/figures.py",
        original="                figures.published_at = 0.0\n",
        mutated="                figures.published_at = figures.published_at\n",
        caught_by=(
            f"{CONSOLE_FIGURES}::test_a_watcher_that_joins_a_running_stream_writes_at_once",
            f"{CONSOLE_FIGURES_E2E}::test_a_dead_triggerers_figures_leave_the_page_when_its_carrier_runs_elsewhere",
        ),
    ),
    Mutant(
        name="figures keyed by the stream's display label",
        broker="console",
        path="airflow_shared_stream/console/figures.py",
        original="    return hashlib.sha256(repr(shared_stream_key).encode()).hexdigest()[:16]\n",
        mutated="    return str(shared_stream_key[-1])  # type: ignore[index]\n",
        caught_by=(
            "tests/unit/console/test_figures.py::test_two_streams_with_one_label_keep_and_write_their_own_figures",
            "tests/unit/console/test_streams.py::test_two_streams_with_one_label_each_show_their_own_figures",
        ),
    ),
    Mutant(
        name="a trigger of two assets writes through accessors that refuse to choose",
        broker="console",
        path="airflow_shared_stream/console/figures.py",
        original="                figures.carriers[trigger_id] = one_asset_writer(store)\n",
        mutated="                figures.carriers[trigger_id] = store\n",
        caught_by=(
            "tests/unit/console/test_figures.py::test_a_watcher_of_two_assets_carries_its_streams_figures",
            f"{CONSOLE_FIGURES_E2E}::test_a_trigger_of_two_assets_publishes_its_streams_figures",
        ),
    ),
    # fix/attack-spark: the orphan check never holds up the poller's rounds (issue 46 item 9 attack)
    Mutant(
        name="orphan check awaited inside the poller's round",
        broker="spark",
        path="airflow_shared_stream/spark/poller.py",
        original="        if listing is not None and (check is None or check.done()):\n",
        mutated=(
            "        if listing is not None:\n"
            "            await self._check_orphans(listing, ui, rest)\n"
            "        if False:\n"
        ),
        caught_by=("test_a_slow_worker_ui_never_holds_up_the_watches",),
        module="tests/integration/spark/test_orphan_attacks.py",
    ),
    # fix/attack-servicebus: one session's renewal never holds up another's; sessions read in turn
    Mutant(
        name="a session's hung lock renewal holds back every other session's",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/sessions.py",
        original=(
            "                        renewing[session] = asyncio.create_task(\n"
            "                            self._renew(session, within=session.lock_left()),\n"
        ),
        mutated=(
            "                        await self._renew(session, within=None)\n"
            "                        renewing[session] = asyncio.create_task(\n"
            "                            asyncio.sleep(0),\n"
        ),
        caught_by=("test_one_sessions_slow_lock_renewal_does_not_starve_the_others",),
        module=SERVICEBUS_SESSION_ATTACK,
    ),
    Mutant(
        name="sessions read in a fixed order",
        broker="servicebus",
        path="airflow_shared_stream/servicebus/sessions.py",
        original="        start = self._turn % len(self.held)\n",
        mutated="        start = 0\n",
        caught_by=("test_a_session_behind_a_busy_one_is_served_with_few_credits",),
        module=SERVICEBUS_SESSION_ATTACK,
    ),
    # fix/attack-kafka: a running stream's position below the log start (issue 46 attack)
    Mutant(
        name="Kafka client resets a running stream below the log start to auto.offset.reset",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original="                consumer._fetcher._default_reset_strategy = OffsetResetStrategy.NONE\n",
        mutated="                pass  # mutant: the client resets out-of-range positions itself\n",
        caught_by=(
            "test_retention_passing_a_running_streams_read_position_moves_it_to_the_log_start",
            "test_a_seek_back_below_the_log_start_reads_on_from_it_and_commits_again",
        ),
        module="tests/integration/kafka/test_kafka_cluster_changes_attack.py",
    ),
    Mutant(
        name="Kafka floor held below the log start never lifts",
        broker="kafka",
        path="airflow_shared_stream/kafka/offsets.py",
        original="        if floor is not None and floor < start:\n            del self._floors[lane]\n",
        mutated="        if floor is not None and floor < start:\n            pass  # mutant\n",
        caught_by=("test_a_seek_back_below_the_log_start_reads_on_from_it_and_commits_again",),
        module="tests/integration/kafka/test_kafka_cluster_changes_attack.py",
    ),
    Mutant(
        name="Kafka fetch past a new log's end on a broker without topic ids not taken for a new topic",
        broker="kafka",
        path="airflow_shared_stream/kafka/log_bounds.py",
        original="            stream.cluster.suspect_new_log(tp.topic)\n",
        mutated="            pass  # mutant: the client's reset hides the new log\n",
        caught_by=(
            "test_a_topic_created_again_smaller_than_the_position_is_read_from_its_start_without_ids",
        ),
        module="tests/integration/kafka/test_kafka_cluster_changes_attack.py",
    ),
    Mutant(
        name="Kafka pointer the dead-letter topic refuses fails the stream",
        broker="kafka",
        path="airflow_shared_stream/kafka/dead_letter.py",
        original="            except TOO_LARGE:  # refused before or after sending: a smaller pointer\n",
        mutated="            except ():  # mutant: a refused pointer fails the stream\n",
        caught_by=("test_a_dead_letter_topic_too_small_even_for_a_pointer_never_fails_the_stream",),
        module="tests/integration/kafka/test_kafka_dead_letter_sizing.py",
    ),
    Mutant(
        name="Kafka pointer without the bare origin-headers step",
        broker="kafka",
        path="airflow_shared_stream/kafka/dead_letter.py",
        original="        attempts.append((POINTER_EMPTY_KEY, origin_headers(payload)))\n",
        mutated="        pass  # mutant: no bare pointer\n",
        caught_by=("test_a_dead_letter_topic_too_small_even_for_a_pointer_never_fails_the_stream",),
        module="tests/integration/kafka/test_kafka_dead_letter_sizing.py",
    ),
    # fix/pubsub-hold: issue 47 items 4-7 (Pub/Sub ordering keys held, the hold bound, exactly-once)
    Mutant(
        name="pubsub ordering key nacked when nobody saw it",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/producer.py",
        original=PUBSUB_LOCKS_LANES,
        mutated=PUBSUB_LOCKS_LANES + "    hold_ordered_lanes = False\n",
        caught_by=(
            PUBSUB_SERVICE + "test_an_ordered_lane_nobody_saw_spends_no_delivery_attempt_and_keeps_its_order",
        ),
    ),
    Mutant(
        name="pubsub hold bound ignores the ack timeout the manager is given",
        broker="pubsub",
        path="airflow_shared_stream/testing.py",
        original="        os.environ[ACK_TIMEOUT_ENV] = repr(float(self.manager._ack_timeout))\n",
        mutated="        pass\n",
        caught_by=(
            PUBSUB_SERVICE
            + "test_a_message_held_past_the_managers_ack_timeout_goes_back_as_the_broker_counts_it",
        ),
    ),
    Mutant(
        name="pubsub hold bound ignores unseen_hold_seconds",
        broker="pubsub",
        path="airflow_shared_stream/common/leased_queue.py",
        original="            configured_hold_seconds() if wanted is None else wanted,\n",
        mutated="            ack_timeout_seconds() if wanted is None else wanted,\n",
        caught_by=(
            PUBSUB_SERVICE + "test_a_stuck_watcher_spends_no_delivery_attempt_of_messages_nobody_saw",
        ),
    ),
    Mutant(
        name="pubsub hold bound not capped where the broker stops renewing",
        broker="pubsub",
        path="airflow_shared_stream/common/unseen.py",
        original="    if broker_limit is None or wanted <= broker_limit:\n",
        mutated="    if True:\n",
        caught_by=("test_the_hold_bound_is_capped_where_the_broker_stops_renewing",),
        module="tests/unit/common/test_unseen.py",
    ),
    Mutant(
        name="pubsub expired ack id on an exactly-once subscription fails the stream",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/client.py",
        original="                    refused.update(a for a in failures if a not in transient)\n",
        mutated="                    raise self.explain(exc, operation, subscription) from None\n",
        caught_by=(
            "test_an_exactly_once_subscription_refusing_an_expired_ack_id_redelivers_without_failing",
        ),
        module="tests/integration/pubsub/test_pubsub_service_fidelity.py",
    ),
    Mutant(
        name="pubsub stale later message of a key not held back behind its redelivery",
        broker="pubsub",
        path="airflow_shared_stream/common/lanes.py",
        original="        if delivery.message_id == message_id or started >= stamp:\n",
        mutated="        if True:\n",
        caught_by=(
            "test_on_a_lane_the_broker_does_not_lock_a_stale_later_message_waits_for_the_redelivered_head",
        ),
        module="tests/unit/common/test_lanes.py",
    ),
    # fix/attack-redrive: forged origins never route a dead letter elsewhere; the page's Kafka redrive
    Mutant(
        name="redrive attack: a Kafka record's own x-shared-stream-topic header taken for its origin",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original='            found = bytes(value).decode("utf-8", errors="replace")\n',
        mutated='            return bytes(value).decode("utf-8", errors="replace")\n',
        caught_by=("test_a_record_that_carries_its_own_origin_header_is_redriven_to_its_real_topic",),
        module="tests/integration/kafka/test_kafka_redrive_attacks.py",
    ),
    Mutant(
        name="redrive attack: an SQS message's own dead_letter_origin_queue kept on its dead letter",
        broker="sqs",
        path="airflow_shared_stream/sqs/dead_letter.py",
        original="    attributes.pop(DEAD_LETTER_ORIGIN_QUEUE, None)\n",
        mutated="    pass\n",
        caught_by=("test_a_message_that_names_its_own_origin_is_never_redriven_into_another_queue",),
        module="tests/integration/sqs/test_sqs_redrive_attacks.py",
    ),
    Mutant(
        name="redrive attack: a Kafka redrive's producer not sized to the dead-letter topic's limit",
        broker="kafka",
        path="airflow_shared_stream/kafka/redrive.py",
        original="            self._producer = await start_dead_letter_producer("
        "config.producer_kwargs(), self._topic)\n",
        mutated="            self._producer = AIOKafkaProducer(**config.producer_kwargs())\n"
        "            await self._producer.start()\n",
        caught_by=("test_a_filtered_redrive_on_a_topic_with_a_small_limit_moves_each_record_once",),
        module="tests/integration/kafka/test_kafka_redrive_attacks.py",
    ),
    Mutant(
        name="redrive attack: the page's Kafka redrive names no source (every stream's dead letters move)",
        broker="kafka",
        path="airflow_shared_stream/console/streams.py",
        original="        source, dead_letter = "
        'stream_source(upstream.get("topics")) or None, stream.dead_letter\n',
        mutated="        source, dead_letter = None, stream.dead_letter\n",
        caught_by=("test_the_pages_redrive_of_one_stream_never_moves_another_streams_dead_letters",),
        module="tests/integration/kafka/test_kafka_redrive_attacks.py",
    ),
    Mutant(
        name="redrive attack: a Pub/Sub message's own dead_letter_origin_subscription beats the policy's",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/redrive.py",
        original="        if SERVICE_ORIGIN_SUBSCRIPTION in attributes:\n",
        mutated="        if SERVICE_ORIGIN_SUBSCRIPTION in attributes and "
        "DEAD_LETTER_ORIGIN_SUBSCRIPTION not in attributes:\n",
        caught_by=("test_a_message_that_names_its_own_origin_is_never_redriven_into_another_topic",),
        module="tests/integration/pubsub/test_pubsub_redrive_attacks.py",
    ),
    Mutant(
        name="redrive attack: a Pub/Sub dead letter of ours keeps a policy stamp its message carried",
        broker="pubsub",
        path="airflow_shared_stream/pubsub/dead_letter.py",
        original="        if name not in ours and not name.startswith(SERVICE_STAMP_PREFIX)\n",
        mutated="        if name not in ours\n",
        caught_by=("test_a_copy_never_carries_the_dead_letter_policy_s_stamp",),
        module="tests/unit/pubsub/test_pubsub_dead_letter_copy.py",
    ),
    # fix/liveness: issue 50 (a stream that starts in a second and never stalls its triggerer)
    Mutant(
        name="lease renewed at a third of it whatever headroom a stalled loop needs",
        broker="sqs",
        path="airflow_shared_stream/common/leases.py",
        original=(
            "        lease_seconds / 3, "
            "max(MIN_RENEW_INTERVAL_SECONDS, lease_seconds - LOOP_STALL_HEADROOM_SECONDS)\n"
        ),
        mutated="        lease_seconds / 3, lease_seconds  # mutant: a third, whatever headroom it leaves\n",
        caught_by=("test_a_two_second_stall_of_the_loop_never_lets_a_lease_lapse",),
    ),
    Mutant(
        name="example pipeline tasks that never retry",
        broker="scripts",
        path="example_dags/order_pipeline.py",
        original='RETRIES: dict[str, Any] = {"retries": 2, "retry_delay": timedelta(seconds=10)}\n',
        mutated="RETRIES: dict[str, Any] = {}  # mutant: a task that fails before it starts fails its run\n",
        caught_by=("test_every_task_of_the_order_pipelines_retries",),
        module="tests/unit/test_example_dags_settings.py",
    ),
    Mutant(
        name="broker SDK imported on the triggerer's event loop at a stream's start",
        broker="sqs",
        path="airflow_shared_stream/common/leased_queue.py",
        original="        await import_off_loop(self.sdk_modules)\n",
        mutated="        pass  # mutant: connect() imports the SDK on the loop\n",
        caught_by=("test_a_cold_stream_imports_its_sdk_off_the_event_loop",),
        module="tests/integration/sqs/test_sqs_cold_start.py",
    ),
    # fix/spark-breaks: no queue row moved past an event stamped but not written (issue 46 item 10)
    Mutant(
        name="stranded-event queue row moved forward by each watcher event",
        broker="scheduling",
        path="airflow_shared_stream/scheduling.py",
        original="    listeners = [StrandedAssetEventsListener(), PlacementListener()]\n",
        mutated=(
            "    class _Refresh:\n"
            "        @hookimpl\n"
            "        def on_asset_event_emitted(self, asset_event: Any) -> None:\n"
            "            from airflow import settings\n"
            "            from airflow._shared.timezones import timezone\n"
            "            from airflow.models.asset import AssetDagRunQueue, AssetModel\n"
            "            from sqlalchemy import select, update\n"
            "\n"
            "            if not (asset_event.extra or {}).get('from_trigger') or not is_enabled():\n"
            "                return\n"
            "            asset = select(AssetModel.id).where(AssetModel.name == asset_event.asset.name)\n"
            "            settings.Session().execute(\n"
            "                update(AssetDagRunQueue)\n"
            "                .where(AssetDagRunQueue.asset_id.in_(asset))\n"
            "                .values(created_at=timezone.utcnow())\n"
            "                .execution_options(synchronize_session=False)\n"
            "            )\n"
            "\n"
            "    listeners = [_Refresh(), StrandedAssetEventsListener(), PlacementListener()]\n"
        ),
        caught_by=(
            f"{TWO_SCHEDULERS}::"
            "test_an_outlet_event_stamped_before_the_refresh_and_written_after_its_check_is_in_a_later_run",
            f"{TWO_SCHEDULERS}::test_an_outlet_event_committed_after_a_refreshed_run_is_in_a_later_run",
            "tests/integration/scheduling/test_stranded_asset_events.py::"
            "test_with_the_setting_a_watcher_event_leaves_the_queue_time_to_core",
        ),
    ),
    # fix/spark-breaks: drivers of a deleted task instance, this deployment's only (issue 46 item 9)
    Mutant(
        name="orphan check keeps the driver of a deleted task instance",
        broker="spark",
        path="airflow_shared_stream/spark/orphans.py",
        original="                if state in ENDED_STATES or (state == GONE and self._ours(ref)):\n",
        mutated="                if state in ENDED_STATES:\n",
        caught_by=("test_a_driver_whose_run_was_deleted_while_its_triggerer_was_dead_is_killed",),
        module="tests/integration/spark/test_orphan_attacks.py",
    ),
    Mutant(
        name="orphan check reads a deleted task instance as cleared",
        broker="spark",
        path="airflow_shared_stream/spark/task_states.py",
        original="    if key not in states:\n        return GONE\n",
        mutated="",
        caught_by=("test_a_driver_whose_run_was_deleted_while_its_triggerer_was_dead_is_killed",),
        module="tests/integration/spark/test_orphan_attacks.py",
    ),
    Mutant(
        name="orphan check kills a driver of unknown deployment whose task is gone",
        broker="spark",
        path="airflow_shared_stream/spark/orphans.py",
        original="        return ref.deployment is not None and ref.deployment == deployment_identity()\n",
        mutated="        return True\n",
        caught_by=("test_a_driver_whose_run_was_deleted_while_its_triggerer_was_dead_is_killed",),
        module="tests/integration/spark/test_orphan_attacks.py",
    ),
    Mutant(
        name="orphan check kills another deployment's driver whose task ended here",
        broker="spark",
        path="airflow_shared_stream/spark/orphans.py",
        original="                if ref is None or self._another_deployments(ref):\n",
        mutated="                if ref is None:\n",
        caught_by=("test_a_driver_of_another_deployment_is_never_killed",),
        module="tests/integration/spark/test_orphan_attacks.py",
    ),
    Mutant(
        name="orphan check: the operator's drivers carry no deployment identity",
        broker="spark",
        path="airflow_shared_stream/spark/operators.py",
        original="                ti, deployment_identity()\n",
        mutated="                ti\n",
        caught_by=("test_the_operator_names_this_deployment_in_its_drivers_launch_command",),
        module="tests/integration/spark/test_orphan_attacks.py",
    ),
    # fix/attack-pubsub: the hold bound's option refuses what would hold for ever or not at all
    Mutant(
        name="unseen_hold_seconds = nan accepted (held for ever)",
        broker="servicebus",
        path="airflow_shared_stream/common/unseen.py",
        original="    if math.isnan(seconds):\n",
        mutated="    if False:\n",
        caught_by=("test_a_hold_bound_of_nan_is_refused_not_held_forever",),
        module="tests/unit/common/test_unseen.py",
    ),
    Mutant(
        name="unseen_hold_seconds = 0 accepted (unseen messages given back every round)",
        broker="servicebus",
        path="airflow_shared_stream/common/unseen.py",
        original="    if seconds <= 0:\n",
        mutated="    if seconds < 0:\n",
        caught_by=("test_a_hold_bound_of_zero_is_said_loudly",),
        module="tests/unit/common/test_unseen.py",
    ),
    # fix/redrive-per-team: a team's redrive runs in its own redrive Dag, never another team's or none
    Mutant(
        name="redrive per team: every stream redriven through the Dag of no team",
        broker="console",
        path="airflow_shared_stream/console/plugin.py",
        original='    return f"{REDRIVE_DAG_ID}{TEAM_SEPARATOR}{team}" if team else REDRIVE_DAG_ID\n',
        mutated="    return REDRIVE_DAG_ID\n",
        caught_by=("test_a_stream_is_redriven_through_the_redrive_dag_of_its_team",),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="redrive per team: a stream of several teams given one team's redrive Dag",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="    return None if len(owners) > 1 else redrive_dag_id(next(iter(owners), None))\n",
        mutated="    return redrive_dag_id(next(iter(owners), None))\n",
        caught_by=("test_a_stream_of_dags_of_several_teams_is_refused_a_redrive",),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="redrive per team: a missing team redrive Dag not refused with what to deploy",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="    if not redrive.deployed:\n",
        mutated="    if False:\n",
        caught_by=("test_a_team_without_its_redrive_dag_is_refused_with_what_to_deploy",),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="redrive per team: a team's redrive Dag in another team's bundle accepted",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="    if redrive.team != team:\n",
        mutated="    if False:\n",
        caught_by=("test_a_teams_redrive_dag_in_a_bundle_of_another_team_is_refused",),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="redrive per team: the right asked of the Dag of no team, not of the one used",
        broker="console",
        path="airflow_shared_stream/console/access.py",
        original="    if not may_trigger(user, redrive.dag_id, redrive.team):\n",
        mutated='    if not may_trigger(user, "shared_stream_redrive_dead_letters", None):\n',
        caught_by=("test_the_right_asked_is_to_trigger_the_redrive_dag_of_the_streams_team",),
        module=CONSOLE_ACCESS,
    ),
    Mutant(
        name="redrive per team: a grant replayed in another redrive Dag accepted",
        broker="console",
        path="airflow_shared_stream/redrive_grant.py",
        original='    if signed.get("dag_id") != dag_id:\n',
        mutated="    if False:\n",
        caught_by=("test_a_grant_for_another_redrive_dag_is_refused",),
        module=REDRIVE_GRANT,
    ),
    Mutant(
        name="redrive per team: a grant for a stream of another team accepted",
        broker="console",
        path="airflow_shared_stream/redrive_grant.py",
        original='    if signed.get("team") != (team or None):\n',
        mutated="    if False:\n",
        caught_by=(
            "test_a_grant_for_a_stream_of_another_team_is_refused_by_a_dag_of_that_team",
            "test_the_redrive_task_refuses_a_grant_of_another_team_than_its_runs",
        ),
        module=REDRIVE_GRANT,
    ),
    Mutant(
        name="redrive per team e2e: the page runs a team's redrive in the Dag of no team",
        broker="console",
        path="airflow_shared_stream/console/api.py",
        original="        redrive_dag = redrive_dags[str(redrive_dag_of(stream, teams))]",
        mutated="        redrive_dag = redrive_dags[REDRIVE_DAG_ID]",
        caught_by=("test_a_redrive_of_one_team_is_not_readable_by_another_team",),
        module=CONSOLE_TEAMS_E2E,
    ),
    Mutant(
        name="redrive per team e2e: the task checks neither the grant's Dag nor its team",
        broker="console",
        path="airflow_shared_stream/redrive_grant.py",
        original='    if signed.get("dag_id") != dag_id:\n'
        '        raise RedriveNotGrantedError(f"the redrive grant was made for a run of another Dag, '
        'not {dag_id!r}")\n'
        '    if signed.get("team") != (team or None):\n',
        mutated='    if False:\n        raise RedriveNotGrantedError("")\n    if False:\n',
        caught_by=("test_a_grant_for_one_teams_stream_is_refused_by_another_teams_redrive_dag",),
        module=CONSOLE_TEAMS_E2E,
    ),
)


def apply(mutant: Mutant, copy: Path) -> None:
    target = copy / mutant.path
    source = target.read_text()
    occurrences = source.count(mutant.original)
    if occurrences != 1:
        raise SystemExit(
            f"mutant {mutant.name!r}: its snippet occurs {occurrences} times in {mutant.path} "
            "(expected once): update the mutant to the current code"
        )
    target.write_text(source.replace(mutant.original, mutant.mutated))


def run(mutant: Mutant, python: str, timeout: float) -> tuple[bool, str]:
    """Apply ``mutant`` to a fresh copy and run its tests; return (caught, tail of the output)."""
    with tempfile.TemporaryDirectory(prefix="shared-stream-mutant-") as tmp:
        copy = Path(tmp)
        # README, licence files and docs: the install test builds the wheel and parses docs/examples.
        copied = (
            "airflow_shared_stream",
            "tests",
            "docs",
            "pyproject.toml",
            "README.md",
            "LICENSE",
            "NOTICE",
            "scripts",
            # The docs build includes the result tables, the example Dags, provider.yaml's
            # settings and the changelog.
            "bench",
            "example_dags",
            "provider.yaml",
            "CHANGELOG.rst",
        )

        for item in copied:
            source = ROOT / item
            if source.is_dir():
                shutil.copytree(source, copy / item, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, copy / item)
        apply(mutant, copy)
        env = {**os.environ, "PYTHONPATH": str(copy)}
        env.pop("SHARED_STREAM_DOCS_HTML", None)  # scripts/test.sh's build is of the unmutated docs
        probe = subprocess.run(
            [python, "-c", "import airflow_shared_stream; print(airflow_shared_stream.__file__)"],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        if not probe.stdout.strip().startswith(str(copy)):
            raise SystemExit(f"the copy is not what gets imported: {probe.stdout.strip()}")
        result = subprocess.run(
            [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *mutant.test_ids()],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = result.stdout.strip().splitlines()
        reason = next((line.strip() for line in lines if line.startswith("E ")), "")
        tail = "\n".join([reason, *lines[-1:]])
        # Exit code 1: tests ran and failed. Anything else (collection error, 0) does not count.
        return result.returncode == 1 and " failed" in result.stdout, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", help="only this broker's mutants")
    parser.add_argument("--short", action="store_true", help="only the quick subset")
    parser.add_argument("--name", help="only the mutants whose name contains this text")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    args = parser.parse_args(argv)
    chosen = [
        m
        for m in MUTANTS
        if (args.broker is None or m.broker == args.broker)
        and (m.short or not args.short)
        and (args.name is None or args.name in m.name)
    ]
    survivors = []
    for mutant in chosen:
        caught, tail = run(mutant, sys.executable, args.timeout)
        print(
            f"{'caught  ' if caught else 'SURVIVED'} [{mutant.broker}] {mutant.name}: {tail.splitlines()[-1]}"
        )
        if not caught:
            survivors.append(mutant.name)
            print(tail)
    if survivors:
        print(f"{len(survivors)} mutant(s) survived the contract suite: {', '.join(survivors)}")
        return 1
    print(f"all {len(chosen)} mutant(s) caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
