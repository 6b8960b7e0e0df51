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
                "integration-name": "Google Cloud Pub/Sub shared stream",
                "external-doc-url": "https://cloud.google.com/pubsub/",
                "tags": [
                    "gcp",
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
            {
                "integration-name": "Shared stream dead-letter redrive",
                "external-doc-url": "https://airflow.apache.org/docs/apache-airflow/stable/authoring-and-scheduling/event-scheduling.html",
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
                "integration-name": "Google Cloud Pub/Sub shared stream",
                "python-modules": [
                    "airflow_shared_stream.pubsub.trigger",
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
            {
                "integration-name": "Shared stream dead-letter redrive",
                "python-modules": [
                    "airflow_shared_stream.redrive",
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
                "integration-name": "Google Cloud Pub/Sub shared stream",
                "python-modules": [
                    "airflow_shared_stream.pubsub.hook",
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
        "queues": [
            "airflow_shared_stream.queues.KafkaSharedStreamQueueProvider",
            "airflow_shared_stream.queues.SqsSharedStreamQueueProvider",
            "airflow_shared_stream.queues.PubSubSharedStreamQueueProvider",
            "airflow_shared_stream.queues.ServiceBusSharedStreamQueueProvider",
        ],
        "config": {
            "shared_stream": {
                "description": "Settings of the airflow-shared-stream provider.",
                "options": {
                    "requeue_stranded_asset_events": {
                        "description": "Stop Airflow 3.3 from leaving the last asset events of a burst in no Dag run until the\nnext event (apache/airflow#56050). When True, a listener of this provider re-queues\nasset events newer than a Dag's last asset-triggered run that no run consumed, when a\nrun of the Dag starts or ends. Set it for the scheduler. Does nothing on an Airflow\nwhose run queue references its asset events (apache/airflow#70972). See docs/pipelines.rst.\n",
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                    "split_stream_check_interval": {
                        "description": "Seconds between two checks, in every triggerer, of where the watchers of its streams\nrun. A stream whose watchers run on more than one live triggerer is reported: the gauge\nshared_stream.<broker>.<stream>.triggerers, and for a leased queue (SQS, Pub/Sub,\nService Bus), whose messages each go to one triggerer only, an ERROR naming the stream.\n0 turns the check off. See docs/ha.rst.\n",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "30",
                        "default": "60",
                    },
                    "unseen_hold_seconds": {
                        "description": "Longest a leased-queue stream (SQS, Pub/Sub, Service Bus) holds a message that no watcher\nhas seen (every watcher stuck or gone from the fan-out), in seconds from the first time it\nreached nobody, renewing its lease meanwhile; past it the message goes back to the broker.\nUnset: the triggerer's [triggerer] shared_stream_ack_timeout. SQS and Pub/Sub count each\ngive-back as a delivery attempt, so with a limit of N attempts a message nobody sees is\ndead-lettered after about N times this bound; raise it to hold longer. Capped, with a\nwarning, at what the broker allows (SQS: 12 hours from the receipt; Pub/Sub: the\nsubscription's message retention). Set it for the triggerer. See docs/concepts.rst.\n",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "3600",
                        "default": None,
                    },
                    "redrive_grant_bind_wait_seconds": {
                        "description": "How long a redrive task started from the Streams page waits, in seconds, for the page to\nbind its grant to the run's task instance (the page binds it right after it creates the\nrun; a task that starts first asks its run again every second). Past it the task fails\nand moves nothing. Raise it for an api-server slow to answer. Set it for the workers. See\ndocs/redrive.rst.\n",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "300",
                        "default": "120",
                    },
                    "figures_publish_interval": {
                        "description": "Seconds between two writes of a stream's figures (the Streams page's counts) by a\ntriggerer, to the asset state store of one of the stream's watchers: one write per\nstream and triggerer per interval at most, none while the stream is idle. 0 turns the\nwrites off (the page then shows no figures). Set it for the triggerer. See docs/console.rst.\n",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "15",
                        "default": "5",
                    },
                },
            },
        },
    }
