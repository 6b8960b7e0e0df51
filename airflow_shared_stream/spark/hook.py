"""
``SparkRestHook``: a ``spark`` Airflow Connection read for the standalone master's REST API.

The REST path lives in modules of one concern: :mod:`.config` (the connection's settings),
:mod:`.rest` (the create request and the answers), :mod:`.master_ui` (the driver listing, no
token), :mod:`.driver_logs` and :mod:`.clients`. Their public names are importable from here too.
"""

from __future__ import annotations

import contextlib

from airflow.sdk import BaseHook

from airflow_shared_stream.spark.clients import AsyncSparkRestClient, SparkRestClient
from airflow_shared_stream.spark.config import (
    DEFAULT_REST_PORT,
    SparkRestConfig,
    config_from_connection,
    rest_submission_supported,
)
from airflow_shared_stream.spark.driver_logs import summarize_driver_output
from airflow_shared_stream.spark.errors import (
    SparkRestAuthError,
    SparkRestError,
    TransientSparkRestError,
    UnknownSubmissionError,
)
from airflow_shared_stream.spark.master_ui import (
    SUBMISSION_TAG_PROPERTY,
    ListedDriver,
    MasterState,
    TagLookup,
    amaster_state,
    async_ui_client,
    find_driver_by_tag,
    master_state,
    parse_master_state,
    tag_in_launch_command,
    ui_client,
)
from airflow_shared_stream.spark.rest import (
    ACTIVE_STATES,
    FAILED_STATES,
    LOCAL_SCHEMES,
    PYTHON_RUNNER,
    SUCCEEDED_STATES,
    DriverStatus,
    build_create_request,
    check_python_files_local,
    parse_create_response,
    parse_kill_response,
    parse_status_response,
)

__all__ = [
    "ACTIVE_STATES",
    "DEFAULT_REST_PORT",
    "FAILED_STATES",
    "LOCAL_SCHEMES",
    "PYTHON_RUNNER",
    "SUBMISSION_TAG_PROPERTY",
    "SUCCEEDED_STATES",
    "AsyncSparkRestClient",
    "DriverStatus",
    "ListedDriver",
    "MasterState",
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


def _mask(token: str | None) -> None:
    """Register the token with Airflow's secrets masker so no log line can show it."""
    if token:
        with contextlib.suppress(Exception):
            from airflow.sdk.log import mask_secret

            mask_secret(token)


class SparkRestHook(BaseHook):
    """
    Reads a ``spark`` connection for the master's REST API (see :func:`config_from_connection`).

    It reuses the ``spark`` connection type of apache-airflow-providers-apache-spark, so one
    ``spark_default`` serves both ``SparkSubmitOperator`` and the deferrable operator.
    """

    conn_name_attr = "conn_id"
    default_conn_name = "spark_default"
    conn_type = "spark"
    hook_name = "Spark (standalone REST)"

    def __init__(self, conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.conn_id = conn_id

    def get_config(self) -> SparkRestConfig:
        cfg = config_from_connection(self.get_connection(self.conn_id))
        _mask(cfg.token)
        return cfg

    async def aget_config(self) -> SparkRestConfig:
        cfg = config_from_connection(await BaseHook.aget_connection(self.conn_id))
        _mask(cfg.token)
        return cfg
