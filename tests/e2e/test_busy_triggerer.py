"""
Our streams in a real triggerer with 8 busy processes beside it (issue 50, item 5).

``scripts/demo.sh --busy 8`` showed it by hand; this is the test. The rig of ``bench/startup.py``
(SQLite; dag-processor and triggerer only: no scheduler, api-server or Spark, which the guarantee
does not need), three watchers of ONE stream (``bench.startup.DAG_TEMPLATE``), and 8 processes
spinning a core each from before the triggerer starts until the last check. The checks:

* the stream consumes a canary (an asset event for every watcher), then every one of the
  messages published after it becomes an asset event for every watcher (at-least-once: none
  missing, duplicates allowed);
* the triggerer's supervisor never calls its runner "deadlocked" (``machine_load.DEADLOCKED``),
  read only once the supervisor has served the stream's first figures write (the asset state
  store write that stalled it for 44-49 s before ``placement.ExecutionApiWarmup``) and has run
  its health check since (its job's heartbeat is newer);
* no lease lapsed: no lease the broker refused to extend or the keeper let go (SQS), no Kafka
  group session that expired (the triggerer's own log).

One Airflow at a time on the machine: it sits with the e2e deployments (``AIRFLOW_AND_SPARK`` in
tests/conftest.py), and its spinners run only for the test's own window.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench.startup import DAG_TEMPLATE
from bench.startup_rigs import RIGS, Rig
from tests.support.airflow import AirflowDeployment
from tests.support.machine_load import busy_processes, deadlocked_lines, load_average
from tests.support.processes import tail, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
BUSY_PROCESSES = 8
WATCHERS = 3
MESSAGES = 20
LEASE_LAPSED = re.compile(
    r"refused to extend \d+ lease|lease\(s\) held past|Heartbeat session expired|"
    r"giving back \d+ message\(s\) no watcher has seen"
)
"""The triggerer's lines for a lease that lapsed: refused by the broker or let go by the keeper
(``common.leases``, ``common.leased_queue``), or a Kafka group session that expired (aiokafka)."""

GENEROUS = 420.0
"""Seconds any one wait may take: a 2-core machine at load 20 with the spinners beside it."""


def _events_by_watcher(airflow: AirflowDeployment, rig: Rig) -> dict[str, set[str]]:
    """Asset (one per watcher) -> the canary ids of its asset events."""
    seen: dict[str, set[str]] = {f"startup_{n}": set() for n in range(WATCHERS)}
    for event in airflow.asset_events():
        payload_id = rig.payload_id(event.payload or {})
        if payload_id is not None and event.asset_name in seen:
            seen[event.asset_name].add(payload_id)
    return seen


def _utc(value: str | datetime) -> datetime:
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _figures_written(airflow: AirflowDeployment) -> bool:
    """The stream's first figures write reached the asset state store (the supervisor served it)."""
    with airflow.db() as conn:
        rows = conn.execute("SELECT key FROM asset_state_store WHERE key LIKE 'shared_stream.figures%'")
        return bool(rows.fetchall())


def _triggerer_heartbeat(airflow: AirflowDeployment) -> datetime | None:
    with airflow.db() as conn:
        row = conn.execute(
            "SELECT max(latest_heartbeat) AS beat FROM job WHERE job_type = 'TriggererJob'"
        ).fetchone()
    return _utc(row["beat"]) if row and row["beat"] else None


@pytest.mark.parametrize("broker", ["kafka", "sqs"])
def test_every_message_reaches_every_watcher_with_8_busy_processes_beside_the_triggerer(
    broker: str, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        rig = RIGS[broker](stack)
        dags = tmp_path / "dags"
        dags.mkdir()
        (dags / "startup_probe.py").write_text(
            DAG_TEMPLATE.format(imports=rig.imports, trigger=rig.trigger, watchers=WATCHERS)
        )
        airflow = AirflowDeployment(
            home=tmp_path / "airflow", dags_folder=dags, env={**rig.env, "PYTHONPATH": str(REPO)}
        )
        airflow.migrate()
        stack.callback(airflow.stop)
        airflow.start_component("dag-processor")
        airflow.wait_for_dags({"startup_probe"}, timeout=GENEROUS)
        watchers = {f"startup_w{n}" for n in range(WATCHERS)}
        triggerer_log = airflow.log_path("triggerer")

        with busy_processes(BUSY_PROCESSES) as spinners:
            load_at_start = load_average()
            airflow.start_component("triggerer")
            airflow.wait_for_watchers(watchers, timeout=GENEROUS)

            # The canary: a fresh one every few seconds until every watcher has had one (a stream
            # that starts at the end of its topic or queue may open after the first was sent).
            deadline = time.monotonic() + GENEROUS
            while not all(_events_by_watcher(airflow, rig).values()):
                assert time.monotonic() < deadline, (
                    f"no canary reached every watcher in {GENEROUS:.0f} s (load {load_average()})\n"
                    f"{tail(triggerer_log, 60)}"
                )
                airflow.check_alive()
                rig.publish({"canary": f"canary-{uuid.uuid4().hex[:8]}"})
                waited_until = time.monotonic() + 5
                while time.monotonic() < waited_until and not all(_events_by_watcher(airflow, rig).values()):
                    time.sleep(0.2)

            messages = {f"message-{n}-{uuid.uuid4().hex[:8]}" for n in range(MESSAGES)}
            for message in sorted(messages):
                rig.publish({"canary": message})

            def every_message_everywhere() -> bool:
                airflow.check_alive()
                return all(messages <= ids for ids in _events_by_watcher(airflow, rig).values())

            with contextlib.suppress(RuntimeError):
                wait_until(every_message_everywhere, GENEROUS, "every message at every watcher", interval=0.5)

            # The deadlock check is read once the supervisor has served the first figures write
            # and has run its health check after it (a heartbeat, or the "deadlocked" line instead).
            wait_until(lambda: _figures_written(airflow), GENEROUS, "the stream's first figures write", 0.5)
            served = datetime.now(timezone.utc)
            wait_until(
                lambda: (_triggerer_heartbeat(airflow) or served) > served,
                GENEROUS,
                "a triggerer heartbeat after the first figures write",
                0.5,
            )
            missing = {
                asset: sorted(messages - ids) for asset, ids in _events_by_watcher(airflow, rig).items()
            }
            log_text = triggerer_log.read_text(errors="replace")
            deadlocked = deadlocked_lines(triggerer_log)
            lapsed = [line for line in log_text.splitlines() if LEASE_LAPSED.search(line)]
            spinning = [spinner.poll() is None for spinner in spinners]
            load_at_end = load_average()

    context = f"load {load_at_start} at the triggerer's start, {load_at_end} at the end"
    assert spinning == [True] * BUSY_PROCESSES, "a busy process stopped before the last check"
    assert not any(missing.values()), f"messages with no asset event ({context}): {missing}"
    assert deadlocked == [], f"the supervisor called its runner deadlocked ({context}): {deadlocked}"
    assert lapsed == [], f"a lease lapsed ({context}): {lapsed}"
    print(f"{broker}: {context}")
