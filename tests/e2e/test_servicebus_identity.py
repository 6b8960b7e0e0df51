"""
Stream identity end to end: two connection ids that name one Service Bus namespace, stored in
the metadata database (so the triggerer reads them through Airflow's own connection access, not
from its environment), on two real triggerer processes sharing one PostgreSQL database.

* On one triggerer, two watchers of one queue through the two connection ids share ONE receiver
  (one "shared stream open" line for the queue) and each sees every message.
* Watchers of another queue through the two ids on two triggerers are one stream to the
  split-stream check: an ERROR in both triggerers' logs names the queue and both connection ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.airflow import AirflowDeployment
from tests.support.postgres import PostgresServer
from tests.support.processes import tail, wait_until
from tests.support.servicebus_server import ServiceBusServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DAGS = Path(__file__).parent / "identity_dags"
TOGETHER, SPLIT = "identity-together", "identity-split"
FIRST, SECOND = "triggerer-a", "triggerer-b"
MESSAGES = 40
WATCHERS = {
    "identity_together": {"identity_together_a_watcher", "identity_together_b_watcher"},
    "identity_split_a": {"identity_split_a_watcher"},
    "identity_split_b": {"identity_split_b_watcher"},
}


@dataclass
class IdentityStack:
    airflow: AirflowDeployment
    servicebus: ServiceBusServer

    def message_ids(self, asset: str) -> set[str]:
        return {
            e.payload["message_id"]
            for e in self.airflow.asset_events(asset)
            if isinstance(e.payload, dict) and "message_id" in e.payload
        }


def _unpause(airflow: AirflowDeployment, *dag_ids: str) -> None:
    for dag_id in dag_ids:
        airflow.cli("dags", "unpause", dag_id)
    names = set().union(*(WATCHERS[d] for d in dag_ids))
    wait_until(
        lambda: names <= airflow.watcher_trigger_ids().keys(), 120, f"watchers {sorted(names)}", interval=0.5
    )


def _start_triggerer(airflow: AirflowDeployment, name: str, capacity: int, watchers: set[str]) -> None:
    airflow.start_component("triggerer", "--capacity", str(capacity), name=name)

    def running() -> bool:
        airflow.check_alive()
        ids = airflow.watcher_trigger_ids()
        return {ids[w] for w in watchers} <= airflow.assigned_trigger_ids()

    try:
        wait_until(running, 120, f"{name} to run {sorted(watchers)}", interval=0.5)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{tail(airflow.log_path(name))}") from None


@pytest.fixture(scope="module")
def stack(e2e_dir: Path, servicebus: ServiceBusServer, postgres: PostgresServer) -> Iterator[IdentityStack]:
    servicebus.create_queue(TOGETHER)
    servicebus.create_queue(SPLIT)
    exact = servicebus.connection_string()
    respelled = exact.replace("Endpoint=sb://", "Endpoint=SB://", 1).replace(";", "/;", 1)
    assert respelled != exact
    home = e2e_dir / "airflow-servicebus-identity"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "servicebus_identity.py").symlink_to(DAGS / "servicebus_identity.py")
    env = {
        "IDENTITY_TOGETHER_QUEUE": TOGETHER,
        "IDENTITY_SPLIT_QUEUE": SPLIT,
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3",
        "AIRFLOW__SHARED_STREAM__SPLIT_STREAM_CHECK_INTERVAL": "5",
    }
    airflow = AirflowDeployment(
        home=home, dags_folder=dags, env=env, database_url=postgres.create_database("airflow_sb_identity")
    )
    try:
        airflow.migrate()
        for conn_id, connection_string in (("sb_a", exact), ("sb_b", respelled)):
            airflow.cli(
                "connections",
                "add",
                conn_id,
                "--conn-type",
                "azure_service_bus",
                "--conn-schema",
                connection_string,
            )
        airflow.start_component("dag-processor")
        airflow.start_component("scheduler")
        airflow.wait_for_dags(set(WATCHERS))
        _unpause(airflow, "identity_together", "identity_split_a")
        _start_triggerer(airflow, FIRST, 3, WATCHERS["identity_together"] | WATCHERS["identity_split_a"])
        _unpause(airflow, "identity_split_b")
        _start_triggerer(airflow, SECOND, 3, WATCHERS["identity_split_b"])
        yield IdentityStack(airflow=airflow, servicebus=servicebus)
    finally:
        airflow.stop()


def test_two_connection_ids_of_one_namespace_share_one_receiver_on_one_triggerer(
    stack: IdentityStack,
) -> None:
    sent = set(stack.servicebus.send(TOGETHER, [{"n": i} for i in range(MESSAGES)]))
    assets = ("identity_together_a", "identity_together_b")
    try:
        wait_until(
            lambda: all(stack.message_ids(a) >= sent for a in assets),
            180,
            "both watchers to see all",
            interval=1,
        )
    finally:
        print({a: len(stack.message_ids(a) & sent) for a in assets})
    log = stack.airflow.log_path(FIRST).read_text(errors="replace")
    opened = [
        line for line in log.splitlines() if "Service Bus shared stream open" in line and TOGETHER in line
    ]
    assert len(opened) == 1, opened


def test_two_connection_ids_of_one_entity_on_two_triggerers_are_reported_as_one_split_stream(
    stack: IdentityStack,
) -> None:
    def reported() -> bool:
        logs = [stack.airflow.log_path(name).read_text(errors="replace") for name in (FIRST, SECOND)]
        return all(
            any(
                "run on 2 triggerers" in line and SPLIT in line and "'sb_a'" in line and "'sb_b'" in line
                for line in text.splitlines()
            )
            for text in logs
        )

    try:
        wait_until(reported, 120, "both triggerers to report the split Service Bus stream", interval=1)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{tail(stack.airflow.log_path(FIRST))}") from None
