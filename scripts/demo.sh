#!/usr/bin/env bash
# The one-command demo (README's first command): build .venv/ if needed, then start a broker
# (noida-db by default, --broker sqs for moto's SQS, --broker pubsub for Google's Pub/Sub
# emulator, --broker servicebus for the Service Bus test server), Spark standalone and Airflow
# 3.3 on free loopback ports, publish a stream of order events through the example pipeline, print a
# summary, and stop everything it started. Options: scripts/demo.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python scripts/demo.py "$@"
