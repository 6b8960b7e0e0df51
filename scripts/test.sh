#!/usr/bin/env bash
# The test command of the README: build .venv/ if needed, lint, type-check and build the docs, then run the whole suite
# (unit tests, and integration tests against real brokers the suite starts on loopback).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -q
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # [tool.mypy] in pyproject.toml: airflow_shared_stream/
# The docs build with warnings as errors: a page with a broken table, reference or include fails.
docs_out=$(mktemp -d)
trap 'rm -rf "$docs_out"' EXIT
.venv/bin/python -m sphinx -E -W --keep-going -q -b html docs "$docs_out"
# tests/docs/test_rendering.py opens these pages in Chromium instead of building them again.
export SHARED_STREAM_DOCS_HTML="$docs_out"
# Four xdist workers, one per group of tests/conftest.py (Airflow and Spark; SQS and the fault scenarios;
# Pub/Sub and Service Bus; the rest). PYTEST_WORKERS=0 runs everything in this process.
workers=${PYTEST_WORKERS:-4}
xdist=()
if [ "$workers" != 0 ]; then xdist=(-n "$workers"); fi
.venv/bin/python -m pytest "${xdist[@]}" --durations=30 "$@"
