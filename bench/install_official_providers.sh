#!/usr/bin/env bash
# The google and azure providers, for bench/watchers.py's per-watcher anchors ONLY.
#
# They are not dependencies of airflow-shared-stream, not even of its `bench` dependency group: resolved with
# their dependency trees they add 160 packages to .venv (ray, scipy, litellm...) and downgrade
# importlib-metadata and tenacity. The anchors need only the triggers and the hooks those call, so
# the two providers and the few modules their imports reach are installed WITHOUT dependencies into
# .bench-providers/ (git-ignored), which bench/watchers.py appends to sys.path. The SDKs the
# triggers call (google-cloud-pubsub, azure-servicebus) are the ones in .venv, as for ours.
set -euo pipefail
cd "$(dirname "$0")/.."
target=.bench-providers
.venv/bin/python -m uv pip install --quiet --python .venv/bin/python --target "$target" --no-deps \
  apache-airflow-providers-google==22.8.0 apache-airflow-providers-microsoft-azure==15.2.1 \
  google-cloud-core google-cloud-secret-manager google-api-python-client google-auth-httplib2 httplib2 \
  uritemplate gcloud-aio-auth gcloud-aio-pubsub \
  azure-identity msal msal-extensions msrest msrestazure requests-oauthlib oauthlib isodate
PYTHONPATH="$target" .venv/bin/python - <<'PY'
from airflow.providers.google.cloud.triggers.pubsub import PubsubPullTrigger  # noqa: F401
from airflow.providers.microsoft.azure.triggers.message_bus import AzureServiceBusSubscriptionTrigger  # noqa: F401
print("official providers for the benchmark anchors: importable from .bench-providers/")
PY
