#!/usr/bin/env python
"""
Prove the shared contract suite catches the bugs it is named after.

Each mutant is one deliberate bug (delete on receipt, no credit window, dead-letter after the
delete, dead-letter skipped when the send fails, one lane per message on an ordered queue, a
lane's received messages not held back behind its redelivery, leases not renewed; for Kafka:
commit on receipt, no credit window, dead-letter fire-and-forget or after the commit,
dead-letter skipped when the send fails; for Spark: the deferrable operator's guarantees, each
caught by its own module's tests). For each, this script copies the
package and the tests to a temporary directory, applies the mutant there (the working tree is
never touched), runs the contract tests that must catch it against the real broker, and checks
that they FAIL. A mutant that survives
is a hole in the suite: the script exits non-zero and names it.

Usage::

    .venv/bin/python scripts/mutants.py              # every mutant of every broker
    .venv/bin/python scripts/mutants.py --broker sqs
    .venv/bin/python scripts/mutants.py --short      # the quick subset the test suite runs

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
SPARK_UNIT = "tests/unit/spark/test_operator_trigger.py"
SPARK_RECORDING = "tests/integration/spark/test_recording_master.py"
SPARK_CLUSTER = "tests/integration/spark/test_deferrable_operator.py"
SPARK_MOVES = "tests/integration/spark/test_trigger_moves.py"
SPARK_FORGOTTEN = "tests/integration/spark/test_forgotten_driver.py"


TIMED_DEAD_LETTER = (
    "        if dead:\n"
    "            with self.metrics.timed(m.ADVANCE_LATENCY):  # the one broker call an advance makes\n"
)
DEAD_LETTER_SEND = TIMED_DEAD_LETTER + "                await self._dead_letter(dead)\n"
"""Kafka's advance sending its dead letters and waiting for the broker's acknowledgement."""


@dataclass(frozen=True)
class Mutant:
    name: str
    broker: str
    path: str
    original: str
    mutated: str
    caught_by: tuple[str, ...]
    short: bool = False
    module: str | None = None
    """Test module of ``caught_by`` when it is not the broker's contract suite (e.g. Spark's)."""

    def test_ids(self) -> list[str]:
        if self.module is not None:
            return [f"{self.module}::{test}" for test in self.caught_by]
        broker = self.broker
        return [
            CONTRACT.format(broker=broker, Broker=broker.capitalize(), test=test) for test in self.caught_by
        ]


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
        path="airflow_shared_stream/common/leased_queue.py",
        original="                elif self._redelivered_lanes.get(delivery.lane, -1) > stamp:\n",
        mutated="                elif False:  # mutant: only what was handed out is held back\n",
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
    # Kafka: commits instead of deletes, no leases, no ordered-lane variant (a partition is a lane).
    Mutant(
        name="commit on receipt",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original="                    credits.take()\n",
        mutated=(
            "                    credits.take()\n"
            "                    self.committer.queue(tp, record.offset + 1, epoch)\n"
        ),
        caught_by=("test_advance_only_after_persistence",),
    ),
    Mutant(
        name="no credit window",
        broker="kafka",
        path="airflow_shared_stream/kafka/producer.py",
        original="            available = credits.available or await self._wait_for_credit(consumer)\n",
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
            TIMED_DEAD_LETTER + "                self.committer.queue(tp, dead[-1].offset + 1, epoch)\n"
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
        path="airflow_shared_stream/spark/hook.py",
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
        for item in ("airflow_shared_stream", "tests", "pyproject.toml"):
            source = ROOT / item
            if source.is_dir():
                shutil.copytree(source, copy / item, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, copy / item)
        apply(mutant, copy)
        env = {**os.environ, "PYTHONPATH": str(copy)}
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
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    args = parser.parse_args(argv)
    chosen = [
        m for m in MUTANTS if (args.broker is None or m.broker == args.broker) and (m.short or not args.short)
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
