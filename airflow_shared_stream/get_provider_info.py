# NOTE: GENERATED FILE, DO NOT EDIT. Edit provider.yaml, then run
#   .venv/bin/python scripts/generate_provider_info.py
# (tests/unit/test_provider_info.py fails while this file and provider.yaml differ).
"""Provider metadata for Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-shared-stream",
        "name": "Shared Stream",
        "description": "At-least-once shared-stream event triggers for Apache Airflow 3.3+ (Amazon SQS, Apache Kafka,\nAzure Service Bus) and a deferrable Spark submit operator.\n",
        "integrations": [
            {
                "integration-name": "Amazon Simple Queue Service (SQS) shared stream",
                "external-doc-url": "https://aws.amazon.com/sqs/",
                "tags": [
                    "aws",
                ],
            },
            {
                "integration-name": "Apache Kafka shared stream",
                "external-doc-url": "https://kafka.apache.org/",
                "tags": [
                    "apache",
                ],
            },
            {
                "integration-name": "Azure Service Bus shared stream",
                "external-doc-url": "https://learn.microsoft.com/azure/service-bus-messaging/",
                "tags": [
                    "azure",
                ],
            },
            {
                "integration-name": "Apache Spark (deferrable, standalone REST)",
                "external-doc-url": "https://spark.apache.org/docs/latest/spark-standalone.html",
                "tags": [
                    "software",
                ],
            },
        ],
        "triggers": [
            {
                "integration-name": "Amazon Simple Queue Service (SQS) shared stream",
                "python-modules": [
                    "airflow_shared_stream.sqs.trigger",
                ],
            },
            {
                "integration-name": "Apache Kafka shared stream",
                "python-modules": [
                    "airflow_shared_stream.kafka.trigger",
                ],
            },
            {
                "integration-name": "Azure Service Bus shared stream",
                "python-modules": [
                    "airflow_shared_stream.servicebus.trigger",
                ],
            },
            {
                "integration-name": "Apache Spark (deferrable, standalone REST)",
                "python-modules": [
                    "airflow_shared_stream.spark.triggers",
                ],
            },
        ],
        "operators": [
            {
                "integration-name": "Apache Spark (deferrable, standalone REST)",
                "python-modules": [
                    "airflow_shared_stream.spark.operators",
                ],
            },
        ],
        "hooks": [
            {
                "integration-name": "Amazon Simple Queue Service (SQS) shared stream",
                "python-modules": [
                    "airflow_shared_stream.sqs.hook",
                ],
            },
            {
                "integration-name": "Apache Kafka shared stream",
                "python-modules": [
                    "airflow_shared_stream.kafka.hook",
                ],
            },
            {
                "integration-name": "Azure Service Bus shared stream",
                "python-modules": [
                    "airflow_shared_stream.servicebus.hook",
                ],
            },
            {
                "integration-name": "Apache Spark (deferrable, standalone REST)",
                "python-modules": [
                    "airflow_shared_stream.spark.hook",
                ],
            },
        ],
    }
