"""
The installation page's path, as a user with an Airflow 3.3 deployment walks it.

Builds the wheel, makes a deployment virtualenv holding Airflow and the official Amazon
provider (with a boto3/botocore pair, 1.44.8, newer than aiobotocore 3.10.0 accepts), then runs the
user's command there with plain pip: ``pip install "<wheel>[sqs]"``. Checks ``pip check``, that
neither the Spark provider nor pyspark came along, and that the package says which extra the
Spark operator needs. Then parses the quickstart Dag (docs/examples/quickstart_sqs.py) with
Airflow's DagBag and runs its watcher's trigger, rebuilt from serialize() and pointed at moto's
SQS server, through Airflow's shared-stream manager until the quickstart message arrives. The
connection is registered with the page's command, ``airflow connections add``, in the
deployment's own (SQLite) metadata database.

Cost: after the first run on a machine (which downloads the newest boto3/botocore and the Amazon
provider), everything comes from uv's and pip's caches. Measured on a 2-core machine at a load
average of 6-7: 68 s in all (25 s of CPU), of which 14 s for the build and the two installs and
40 s for the database migration, the connection and the probe (Airflow's imports, the Dag parse,
the trigger's first poll). One virtualenv per session (module scope).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.brokers import SqsServer, sqs_server_process
from tests.support.deployment_venv import ROOT, pinned_constraints, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

QUICKSTART_DAG = ROOT / "docs" / "examples" / "quickstart_sqs.py"
# The Airflow version under test and the Amazon provider the coexistence tests pin; the boto pair
# is newer than aiobotocore 3.10.0's botocore range (<1.43.118), as a deployment that installed
# the Amazon provider recently has it.
DEPLOYMENT = [
    "apache-airflow==3.3.2",
    "apache-airflow-providers-amazon==9.39.0",
    "boto3==1.44.8",
    "botocore==1.44.8",
]
BOTO = {"boto3", "botocore", "s3transfer"}


@pytest.fixture(scope="module")
def sqs() -> Iterator[SqsServer]:
    with sqs_server_process(region="us-east-1", access_key="quickstart", secret_key="quickstart") as server:
        yield server


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The venv after the user's pip command: its python, pip check's result, what is installed."""
    work = tmp_path_factory.mktemp("quickstart")
    uv = [sys.executable, "-m", "uv"]
    run(*uv, "build", "--quiet", "--wheel", "--out-dir", str(work / "dist"), str(ROOT))
    [wheel] = (work / "dist").glob("*.whl")
    # .venv's versions, so the suite's Airflow and SDKs are the ones under test; not the boto trio,
    # which the deployment and then pip choose.
    constraints = pinned_constraints(work, BOTO)
    venv = work / "venv"
    run(*uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"
    run(*uv, "pip", "install", "--quiet", "--python", str(python), "-c", str(constraints), *DEPLOYMENT)
    # The user's command, with pip, into the existing deployment.
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run(*pip, "install", "--quiet", "-c", str(constraints), f"{wheel}[sqs]", timeout=600)
    check = run_status(*pip, "check")
    installed = json.loads(run(*pip, "list", "--format", "json"))
    return {
        "python": python,
        "pip_check": check,
        "versions": {row["name"].lower(): row["version"] for row in installed},
        "home": work / "home",
    }


def run_status(*args: str) -> tuple[int, str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_pip_check_passes_after_adding_the_sqs_extra_to_the_amazon_provider(deployment):
    assert deployment["pip_check"] == (0, "No broken requirements found.\n")
    versions = deployment["versions"]
    # pip moved boto3 with botocore (else pip check above fails naming boto3).
    assert versions["boto3"] == versions["botocore"], versions


def test_the_base_install_brings_no_spark(deployment):
    versions = deployment["versions"]
    assert {"apache-airflow-providers-apache-spark", "pyspark", "pyspark-client"} & versions.keys() == set()


@pytest.fixture(scope="module")
def probe(deployment, sqs: SqsServer) -> dict[str, Any]:
    queue_url = sqs.create_queue("quickstart-orders")
    sqs.send(queue_url, [{"type": "order_refunded", "order_id": 1}, {"type": "order_created", "order_id": 2}])
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("AIRFLOW_CONN_")},
        "AIRFLOW_HOME": str(deployment["home"]),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    # The page's step 2, with the CLI, into the deployment's metadata database.
    airflow = str(deployment["python"].parent / "airflow")
    run(airflow, "db", "migrate", env=env)
    connection = sqs.connection()
    run(
        airflow, "connections", "add", "aws_default", "--conn-type", "aws",
        "--conn-login", connection["login"], "--conn-password", connection["password"],
        "--conn-extra", json.dumps(connection["extra"]), env=env,
    )  # fmt: skip
    probe_script = ROOT / "tests" / "support" / "quickstart_probe.py"
    # -I: not the script's directory on sys.path (tests/support/airflow.py would shadow Airflow).
    # The server context: the probe stands in for the triggerer, which gets connections from the
    # metadata database (through the API server); a plain script would read only the environment.
    out = run(
        str(deployment["python"]), "-I", str(probe_script), str(QUICKSTART_DAG), queue_url,
        env={**env, "_AIRFLOW_PROCESS_CONTEXT": "server"},
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["queue_url"] = queue_url
    return result


def test_the_quickstart_dag_parses(probe):
    assert probe["parsed"] == {"dag_ids": ["orders_quickstart"], "import_errors": {}}
    assert "airflow-shared-stream" in probe["providers"]


def test_the_quickstart_watcher_fires_for_its_message(probe):
    event = probe["event"]
    assert event["classpath"] == "airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger"
    assert event["payload"]["body"] == {"type": "order_created", "order_id": 2}


def test_the_spark_operator_names_its_extra_and_the_trigger_needs_none(probe):
    spark = probe["spark"]
    assert "pip install 'airflow-shared-stream[spark]'" in spark["airflow_shared_stream.spark.operators"]
    assert spark["airflow_shared_stream.spark.triggers"] is None
