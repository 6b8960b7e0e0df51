"""
Installed beside the official Amazon, Kafka, Google and Azure providers, each scheme is ours alone.

``MessageQueueTrigger`` refuses a scheme, or a deprecated ``queue=`` URI, that two installed
message-queue providers match. This builds a deployment virtualenv with common.messaging, the four
official providers that register message queues, and this checkout's ``all`` extra, then asks
common.messaging itself (tests/support/message_queue_probe.py) who claims what, and serializes the
example Dag there.

Cost: the Google and Azure providers bring about 160 packages, and google-genai needs an older
tenacity (importlib-metadata follows) than .venv's, so those two are left unpinned. Measured on a
2-core machine: the first install downloads them (53 s); later ones come from uv's cache (25 s
idle, 49 s at a load average of 6, 89 s at 10), and the probe takes about 8 s. Built once per
session (module scope, one module).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from airflow_shared_stream.queues import SCHEMES
from tests.support.deployment_venv import ROOT, deployment_venv, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

# Versions the suite was run against (bench/install_official_providers.sh pins google and azure
# to the same): a newer release must not change this test's outcome unseen.
OFFICIAL_PROVIDERS = [
    "apache-airflow-providers-amazon==9.39.0",
    "apache-airflow-providers-apache-kafka==2.1.0",
    "apache-airflow-providers-google==22.8.0",
    "apache-airflow-providers-microsoft-azure==15.2.1",
]
OURS = {
    "shared+kafka": "airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger",
    "shared+sqs": "airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger",
    "shared+pubsub": "airflow_shared_stream.pubsub.trigger.PubSubSharedStreamTrigger",
    "shared+servicebus": "airflow_shared_stream.servicebus.trigger.ServiceBusSharedStreamTrigger",
}
OUR_PROVIDERS = {f"airflow_shared_stream.queues.{p.__name__}": s for s, p in SCHEMES.items()}
OFFICIAL_SCHEMES = {"sqs", "kinesis", "kafka", "google+pubsub", "azure+servicebus"}


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("message-queue-providers")
    python = deployment_venv(work, "all", OFFICIAL_PROVIDERS, unpinned={"tenacity", "importlib-metadata"})
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(work / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": str(ROOT),
    }
    out = run(
        str(python),
        "-m",
        "tests.support.message_queue_probe",
        str(ROOT / "example_dags" / "message_queue_orders.py"),
        env=env,
    )
    # Airflow logs to stdout too: the probe's JSON is the last line.
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_the_official_providers_and_ours_are_all_registered(probe):
    providers: dict[str, str] = probe["providers"]
    # Else the checks below would prove nothing: every official scheme is there beside ours.
    assert set(providers.values()) >= OFFICIAL_SCHEMES
    assert {name: scheme for name, scheme in providers.items() if name in OUR_PROVIDERS} == OUR_PROVIDERS


def test_every_scheme_is_claimed_by_exactly_one_provider(probe):
    claims: dict[str, list[str]] = probe["scheme_claims"]
    assert {scheme: len(who) for scheme, who in claims.items() if len(who) != 1} == {}
    for scheme in OURS:
        assert claims[scheme] == [name for name, s in OUR_PROVIDERS.items() if s == scheme]
    for scheme in OFFICIAL_SCHEMES:
        assert not set(claims[scheme]) & OUR_PROVIDERS.keys(), scheme


def test_no_queue_uri_is_claimed_by_ours(probe):
    for uri, who in probe["uri_claims"].items():
        assert len(who) <= 1, (uri, who)
        assert not set(who) & OUR_PROVIDERS.keys(), (uri, who)


def test_every_scheme_resolves_to_our_trigger(probe):
    assert probe["resolved"] == OURS


def test_the_example_dag_serializes_our_trigger_class_for_both_forms(probe):
    assert probe["example_dag_errors"] == {}
    assert probe["example_dag_classpaths"] == [OURS["shared+sqs"]] * 2
