"""Pure logic of the Spark REST hook: connection parsing, request bodies, response classes."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import httpx
import pytest

from airflow_shared_stream.spark.hook import (
    PYTHON_RUNNER,
    SparkRestAuthError,
    SparkRestConfig,
    TransientSparkRestError,
    UnknownSubmissionError,
    build_create_request,
    config_from_connection,
    parse_create_response,
    parse_status_response,
    rest_submission_supported,
    summarize_driver_output,
)

TOKEN = "eyJhbGciOiJIUzI1NiJ9.e30.secret-signature-value"


def _conn(host: str, port: int | None = 7077, password: str | None = TOKEN, **extra: object):
    return SimpleNamespace(conn_type="spark", host=host, port=port, password=password, extra_dejson=extra)


def _resp(status: int, body: object) -> httpx.Response:
    return httpx.Response(
        status, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )


@pytest.mark.parametrize(
    ("host", "port", "master", "rest"),
    [
        ("spark://m1", 7077, "spark://m1:7077", "http://m1:6066"),
        ("m1", 7077, "spark://m1:7077", "http://m1:6066"),
    ],
)
def test_connection_to_config(host, port, master, rest):
    cfg = config_from_connection(_conn(host, port, **{"deploy-mode": "cluster"}))
    assert cfg.master_url == master
    assert cfg.rest_url == rest
    assert cfg.token == TOKEN
    assert rest_submission_supported(cfg, None)


def test_connection_extras_and_secret_hidden_from_repr():
    cfg = config_from_connection(
        _conn(
            "spark://m1",
            **{
                "rest-port": "16066",
                "rest-scheme": "https",
                "rest-verify": "false",
                "pyspark-driver-python": "/opt/launcher",
                "master-ui-url": "http://m1:8080",
            },
        )
    )
    assert cfg.rest_url == "https://m1:16066"
    assert cfg.verify is False
    assert cfg.driver_python == "/opt/launcher"
    assert cfg.headers["Authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in repr(cfg)
    assert not rest_submission_supported(cfg, None)  # no deploy-mode: client mode
    assert rest_submission_supported(cfg, "cluster")


def test_local_master_connection_is_not_a_rest_target():
    conn = SimpleNamespace(
        conn_type="spark", host="local[2]", port=None, password=None, extra_dejson={"deploy-mode": "cluster"}
    )
    assert not rest_submission_supported(config_from_connection(conn), "cluster")


@pytest.mark.parametrize("master", ["yarn", "k8s://https://k:443", "spark://a:7077,b:7077", "local[*]"])
def test_rest_path_only_for_single_standalone_master(master):
    cfg = SparkRestConfig(master_url=master, rest_url="http://x:6066", deploy_mode="cluster")
    assert not rest_submission_supported(cfg, "cluster")


def test_python_create_request():
    body = build_create_request(
        application="/jobs/app.py",
        master_url="spark://m:7077",
        spark_version="4.3.0",
        application_args=["--n", 3],
        conf={"spark.driver.memory": "2g", "spark.ui.enabled": False},
        name="nightly",
        py_files="/jobs/lib.zip",
        driver_memory="1g",
        executor_cores=2,
        total_executor_cores=4,
        env_vars={"SPARK_X": "1"},
        driver_python="/opt/launcher",
        python="/opt/py",
    )
    assert body["mainClass"] == PYTHON_RUNNER
    assert body["appResource"] == "file:/jobs/app.py"
    assert body["appArgs"] == ["/jobs/app.py", "/jobs/lib.zip", "--n", "3"]
    props = body["sparkProperties"]
    assert props["spark.master"] == "spark://m:7077"
    assert props["spark.submit.deployMode"] == "cluster"
    assert props["spark.app.name"] == "nightly"
    assert props["spark.driver.memory"] == "2g"  # explicit conf wins over driver_memory
    assert props["spark.ui.enabled"] == "False"
    assert props["spark.cores.max"] == "4"
    assert props["spark.executor.cores"] == "2"
    assert props["spark.pyspark.driver.python"] == "/opt/launcher"
    assert props["spark.pyspark.python"] == "/opt/py"
    assert body["environmentVariables"] == {"SPARK_ENV_LOADED": "1", "SPARK_X": "1"}


@pytest.mark.parametrize(
    ("application", "py_files", "refused"),
    [
        ("/jobs/app.py", "/jobs/lib.zip,local:/opt/dep.py", None),
        ("file:/jobs/app.py", ["file:///jobs/lib.zip"], None),
        ("hdfs://nn:8020/jobs/app.py", None, "hdfs://nn:8020/jobs/app.py"),
        ("/jobs/app.py", "/jobs/lib.zip,S3A://bucket/dep.zip", "S3A://bucket/dep.zip"),
        ("https://example.com/app.py", None, "https://example.com/app.py"),
    ],
)
def test_python_files_must_be_local(application, py_files, refused):
    """PythonRunner reads file: and local: paths only; a JVM jar may still come from anywhere."""
    kwargs = {"master_url": "spark://m:7077", "spark_version": "4.3.0", "py_files": py_files}
    if refused is None:
        assert build_create_request(application=application, **kwargs)["mainClass"] == PYTHON_RUNNER
    else:
        with pytest.raises(ValueError, match="only local files") as error:
            build_create_request(application=application, **kwargs)
        assert repr(refused) in str(error.value)
    jar = build_create_request(application="hdfs://nn/a.jar", java_class="x.Main", **kwargs)
    assert jar["appResource"] == "hdfs://nn/a.jar"


def test_jvm_create_request_needs_main_class():
    with pytest.raises(ValueError, match="java_class"):
        build_create_request(application="/a.jar", master_url="spark://m:7077", spark_version="4.3.0")
    body = build_create_request(
        application="/a.jar", master_url="spark://m:7077", spark_version="4.3.0", java_class="x.Main"
    )
    assert body["mainClass"] == "x.Main"
    assert body["sparkProperties"]["spark.jars"] == "/a.jar"
    assert "spark.pyspark.driver.python" not in body["sparkProperties"]


def test_status_responses():
    ok = parse_status_response(
        _resp(200, {"success": True, "driverState": "RUNNING", "workerId": "w1"}), "driver-1"
    )
    assert ok.active
    assert not ok.succeeded
    assert ok.worker_id == "w1"
    assert parse_status_response(_resp(200, {"success": True, "driverState": "FINISHED"}), "d").succeeded
    for state in ("FAILED", "ERROR", "KILLED"):
        assert parse_status_response(_resp(200, {"success": True, "driverState": state}), "d").failed
    with pytest.raises(UnknownSubmissionError, match="does not know submission d"):
        parse_status_response(_resp(200, {"success": False}), "d")
    with pytest.raises(TransientSparkRestError):
        parse_status_response(
            _resp(200, {"success": False, "message": "Can only request driver status in ALIVE state."}), "d"
        )
    with pytest.raises(TransientSparkRestError):
        parse_status_response(httpx.Response(503), "d")
    with pytest.raises(SparkRestAuthError, match="403"):
        parse_status_response(httpx.Response(403, text="JWT Validate Fail"), "d")


def test_create_response():
    assert parse_create_response(_resp(200, {"success": True, "submissionId": "driver-9"})) == "driver-9"
    with pytest.raises(Exception, match="refused the submission: nope"):
        parse_create_response(_resp(200, {"success": False, "message": "nope"}))


def test_failure_summary_prefers_the_python_exception():
    stdout = (
        "Traceback (most recent call last):\n"
        '  File "/jobs/app.py", line 3, in <module>\n'
        "    raise RuntimeError('input batch 7 is corrupt')\n"
        "RuntimeError: input batch 7 is corrupt\n"
    )
    stderr = (
        "26/11/21 INFO SparkContext: Running\n"
        'Exception in thread "main" java.lang.reflect.InvocationTargetException\n'
        "\tat java.base/jdk.internal.reflect.NativeMethodAccessorImpl.invoke0(Native Method)\n"
        "Caused by: org.apache.spark.SparkUserAppException: User application exited with 1\n"
        "\t... 6 more\n"
    )
    assert summarize_driver_output(stdout, stderr) == "RuntimeError: input batch 7 is corrupt"
    assert summarize_driver_output("", stdout) == "RuntimeError: input batch 7 is corrupt"
    assert (
        summarize_driver_output("all fine\n", stderr)
        == "org.apache.spark.SparkUserAppException: User application exited with 1"
    )
    assert summarize_driver_output("all fine\n", "done\n") is None


def test_master_state_lists_active_and_completed_drivers():
    from airflow_shared_stream.spark.hook import parse_master_state

    state = parse_master_state(
        {
            "status": "ALIVE",
            "workers": [{"id": "w1", "webuiaddress": "http://h:8081"}],
            "activedrivers": [{"id": "d2", "state": "RUNNING", "worker": "w1", "starttime": "1700000000000"}],
            "completeddrivers": [{"id": "d1", "state": "FAILED", "worker": "w1", "starttime": "bad"}],
        }
    )
    assert state.alive
    assert {d.driver_id: d.state for d in state.drivers.values()} == {"d1": "FAILED", "d2": "RUNNING"}
    assert state.drivers["d2"].start_time_ms == 1_700_000_000_000
    assert state.drivers["d1"].start_time_ms == 0
    assert state.worker_ui == {"w1": "http://h:8081"}
    assert not parse_master_state({"status": "RECOVERING", "activedrivers": []}).alive
    with pytest.raises(Exception, match="without a driver listing"):
        parse_master_state({"status": "ALIVE"})


def test_submission_tag_is_found_only_as_a_whole_property():
    from airflow_shared_stream.spark.hook import SUBMISSION_TAG_PROPERTY, tag_in_launch_command

    head = f'Launch Command: "java" "-cp" "x" "-D{SUBMISSION_TAG_PROPERTY}=abc123" "-Dspark.app.name=a"\n==='
    assert tag_in_launch_command(head, "abc123")
    assert not tag_in_launch_command(head, "abc12")
    assert not tag_in_launch_command(head, "bc123")
    # The property name must survive Spark's default redaction of launch commands.
    assert not re.search(r"(?i)secret|password|token|access[.]?key", SUBMISSION_TAG_PROPERTY)


HOOK_MODULE_NAMES = [
    "ACTIVE_STATES",
    "AsyncSparkRestClient",
    "DEFAULT_REST_PORT",
    "DriverStatus",
    "FAILED_STATES",
    "LOCAL_SCHEMES",
    "ListedDriver",
    "MasterState",
    "PYTHON_RUNNER",
    "SUBMISSION_TAG_PROPERTY",
    "SUCCEEDED_STATES",
    "SparkRestAuthError",
    "SparkRestClient",
    "SparkRestConfig",
    "SparkRestError",
    "SparkRestHook",
    "TagLookup",
    "TransientSparkRestError",
    "UnknownSubmissionError",
    "amaster_state",
    "async_ui_client",
    "build_create_request",
    "check_python_files_local",
    "config_from_connection",
    "find_driver_by_tag",
    "master_state",
    "parse_create_response",
    "parse_kill_response",
    "parse_master_state",
    "parse_status_response",
    "rest_submission_supported",
    "summarize_driver_output",
    "tag_in_launch_command",
    "ui_client",
]
"""Every public name spark/hook.py defined before the REST path was split into modules."""


def test_every_public_name_of_the_hook_module_still_imports_from_it():
    import airflow_shared_stream.spark.hook as hook

    assert sorted(name for name in HOOK_MODULE_NAMES if not hasattr(hook, name)) == []
    assert set(HOOK_MODULE_NAMES) <= set(hook.__all__)
