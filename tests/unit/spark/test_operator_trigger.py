"""Operator/trigger logic that needs no cluster: arguments, event mapping, serialization."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowTaskTimeout

from airflow_shared_stream.spark.operators import DeferrableSparkSubmitOperator
from airflow_shared_stream.spark.triggers import SparkApplicationTrigger

CONN = {
    "conn_type": "spark",
    "host": "spark://127.0.0.1",
    "port": 1,
    "password": "jws-token-that-must-not-leak-123456",
    "extra": {"deploy-mode": "cluster", "rest-port": 1},
}


def test_trigger_serializes_without_secrets_and_round_trips():
    trigger = SparkApplicationTrigger(submission_id="driver-1", conn_id="c", poll_interval=2, deadline=10.5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_shared_stream.spark.triggers.SparkApplicationTrigger"
    assert kwargs == {
        "submission_id": "driver-1",
        "conn_id": "c",
        "poll_interval": 2.0,
        "deadline": 10.5,
        "max_transient_errors": 5,
        "shared_poller": True,
    }
    assert SparkApplicationTrigger(**kwargs).serialize() == (classpath, kwargs)


@pytest.mark.parametrize("kwargs", [{"poll_interval": 0}, {"max_transient_errors": -1}])
def test_trigger_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SparkApplicationTrigger(submission_id="d", **kwargs)


def test_execute_complete_maps_events():
    op = DeferrableSparkSubmitOperator(task_id="t", application="a.py")
    assert op.execute_complete({}, {"status": "success", "submission_id": "d", "message": "ok"}) is None
    with pytest.raises(AirflowException, match="ended FAILED: boom"):
        op.execute_complete({}, {"status": "failed", "message": "Spark driver d ended FAILED: boom"})
    with pytest.raises(AirflowTaskTimeout):
        op.execute_complete({}, {"status": "timeout", "message": "killed"})
    with pytest.raises(AirflowException, match="unknown"):
        op.execute_complete({}, {"status": "error", "message": "unknown submission"})


def test_default_deferrable_follows_airflow_config(monkeypatch):
    assert DeferrableSparkSubmitOperator(task_id="t", application="a.py").deferrable is False
    assert DeferrableSparkSubmitOperator(task_id="t", application="a.py", deferrable=True).deferrable


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("packages", "g:a:1"),
        ("post_submit_commands", ["curl -X POST http://127.0.0.1:15020/quitquitquit"]),
        ("use_krb5ccache", True),
    ],
)
def test_spark_submit_only_arguments_are_refused_on_the_rest_path(monkeypatch, argument, value):
    """What only spark-submit can do (resolve packages, run commands after it, log in) is refused."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_UNIT", json.dumps(CONN))
    op = DeferrableSparkSubmitOperator(
        task_id="t", conn_id="spark_unit", application="a.py", deferrable=True, **{argument: value}
    )
    with pytest.raises(ValueError, match=f"{argument} cannot be honoured") as refused:
        op.execute({})
    assert CONN["password"] not in str(refused.value)


def test_unreachable_master_error_names_no_secret(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_UNIT", json.dumps(CONN))
    op = DeferrableSparkSubmitOperator(task_id="t", conn_id="spark_unit", application="a.py", deferrable=True)
    with pytest.raises(Exception, match="unreachable for create") as failed:
        op.execute({})
    assert CONN["password"] not in str(failed.value)
    assert CONN["password"] not in repr(failed.value.__cause__)


def test_missing_connection_falls_back_to_spark_submit_operator(monkeypatch):
    calls = []
    monkeypatch.setattr(
        "airflow.providers.apache.spark.operators.spark_submit.SparkSubmitOperator.execute",
        lambda self, context: calls.append(context),
    )
    op = DeferrableSparkSubmitOperator(
        task_id="t", conn_id="no_such_conn", application="a.py", deferrable=True
    )
    assert op.execute({"k": 1}) is None
    assert calls == [{"k": 1}]
