"""
The example redrive Dag, run by Airflow itself (``airflow dags test`` with a run conf) against moto.

What the Streams page does when it starts a redrive: a run of ``shared_stream_redrive_dead_letters``
with params. This checks that the params reach the operator as values (``max_messages`` a number,
``dry_run`` a flag) and that the task reads its connection as a task does. The Dag file builds the
shipped Dag as the example's one line does, then turns ``require_grant`` off on its task:
``airflow dags test`` makes a run id no grant can name beforehand. The grant itself is checked
against real runs in tests/e2e/test_streams_page_teams.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.sqs.test_sqs_redrive import ours
from tests.support.airflow import migrated_airflow_home
from tests.support.brokers import SqsServer

ROOT = Path(__file__).parents[3]
EXAMPLE = ROOT / "example_dags" / "shared_stream_redrive_dead_letters.py"


BUILT = "dag = redrive_dead_letters_dag()\n"
UNGRANTED = 'assert dag.get_task("redrive").require_grant\ndag.get_task("redrive").require_grant = False\n'


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow-home")
    text = EXAMPLE.read_text()
    assert text.endswith(BUILT), "the example Dag file no longer builds the shipped Dag"
    dag_file = home.parent / f"{home.name}-dags" / EXAMPLE.name
    dag_file.parent.mkdir()
    dag_file.write_text(text + UNGRANTED)
    return migrated_airflow_home(home, dag_file)


def test_a_run_of_the_example_dag_with_params_moves_the_dead_letters(
    airflow_home: dict[str, str], sqs: SqsServer, aws_connection: str
) -> None:
    dlq = sqs.create_queue()
    origin = sqs.create_queue(dead_letter_queue_url=dlq)
    sqs.send(dlq, [json.dumps({"n": i}) for i in range(6)], MessageAttributes=ours(sqs, origin))
    conf = {"broker": "sqs", "source": origin, "dead_letter": dlq, "max_messages": 4, "dry_run": False}
    env = {**airflow_home, "AIRFLOW_CONN_AWS_DEFAULT": os.environ["AIRFLOW_CONN_AWS_DEFAULT"]}

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow",
            "dags",
            "test",
            "shared_stream_redrive_dead_letters",
            "-c",
            json.dumps(conf),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "examined=4 moved=4 skipped=0 failed=0 left=2 snapshot=6 dry_run=False" in output, output[-4000:]
    assert len(sqs.drain(origin)) == 4
    assert len(sqs.drain(dlq)) == 2
