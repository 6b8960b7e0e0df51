"""
Session-wide Spark standalone cluster (JWS-protected REST) and the connections that reach it.

Every test in this package also checks, after it ran, that the cluster's JWS token appears
nowhere in what it logged or printed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.spark import SparkCluster, spark_client_env, spark_standalone_cluster

APPS = Path(__file__).parent / "apps"
SPARK_CONN_ID = "spark_it"
SPARK_LOCAL_CONN_ID = "spark_it_local"


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with spark_standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark_conn_id(spark_cluster: SparkCluster) -> Iterator[str]:
    """A ``spark`` connection (env var) for the deferrable operator: cluster mode, token, UI URL."""
    env = {
        f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}": spark_cluster.connection_json(
            **{"master-ui-url": f"http://127.0.0.1:{spark_cluster.master_ui_port}"}
        ),
        f"AIRFLOW_CONN_{SPARK_LOCAL_CONN_ID.upper()}": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        **spark_client_env(),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield SPARK_CONN_ID
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def spark_local_conn_id(spark_conn_id: str) -> str:
    return SPARK_LOCAL_CONN_ID


@pytest.fixture(autouse=True)
def _token_never_shown(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    if "spark_cluster" not in request.fixturenames:
        return
    token = request.getfixturevalue("spark_cluster").token
    out, err = capfd.readouterr()
    # caplog.text would show only the teardown phase here: read the test's own records.
    records = caplog.get_records("setup") + caplog.get_records("call")
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in records)
    assert token not in logged, "the JWS token was logged"
    assert token not in out + err, "the JWS token was printed"
