"""Provider metadata for Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from airflow_shared_stream import __version__


def get_provider_info() -> dict[str, Any]:
    # Keep in step with provider.yaml: tests/unit/test_provider_info.py compares the two.
    return {
        "package-name": "airflow-shared-stream",
        "name": "Shared Stream",
        "description": (
            "At-least-once shared-stream event triggers for Apache Airflow 3.3+ (Amazon SQS, Apache Kafka)\n"
            "and a deferrable Spark submit operator.\n"
        ),
        "state": "ready",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Amazon Simple Queue Service (SQS) shared stream",
                "external-doc-url": "https://aws.amazon.com/sqs/",
                "tags": ["aws"],
            },
            {
                "integration-name": "Apache Kafka shared stream",
                "external-doc-url": "https://kafka.apache.org/",
                "tags": ["apache"],
            },
            {
                "integration-name": "Google Cloud Pub/Sub shared stream",
                "external-doc-url": "https://cloud.google.com/pubsub/",
                "tags": ["gcp"],
            },
            {
                "integration-name": "Apache Spark (deferrable, standalone REST)",
                "external-doc-url": "https://spark.apache.org/docs/latest/spark-standalone.html",
                "tags": ["software"],
            },
        ],
        "triggers": [
            {
                "integration-name": "Amazon Simple Queue Service (SQS) shared stream",
                "python-modules": ["airflow_shared_stream.sqs.trigger"],
            },
            {
                "integration-name": "Apache Kafka shared stream",
                "python-modules": ["airflow_shared_stream.kafka.trigger"],
            },
            {
                "integration-name": "Google Cloud Pub/Sub shared stream",
                "python-modules": ["airflow_shared_stream.pubsub.trigger"],
            },
            {
                "integration-name": "Apache Spark (deferrable, standalone REST)",
                "python-modules": ["airflow_shared_stream.spark.triggers"],
            },
        ],
        "operators": [
            {
                "integration-name": "Apache Spark (deferrable, standalone REST)",
                "python-modules": ["airflow_shared_stream.spark.operators"],
            },
        ],
        "hooks": [
            {
                "integration-name": "Apache Spark (deferrable, standalone REST)",
                "python-modules": ["airflow_shared_stream.spark.hook"],
            },
        ],
        "connection-types": [
            {"hook-class-name": "airflow_shared_stream.sqs.hook.SqsHook", "connection-type": "aws"},
            {"hook-class-name": "airflow_shared_stream.kafka.hook.KafkaHook", "connection-type": "kafka"},
            {
                "hook-class-name": "airflow_shared_stream.pubsub.hook.PubSubHook",
                "connection-type": "google_cloud_platform",
            },
        ],
    }
