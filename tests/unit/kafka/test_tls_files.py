"""
A Kafka connection whose TLS files cannot be read fails its stream once, with an error naming
the setting and the file, and no secret (attack on issue 50; FAULT_MODEL class 12).

Issue 50 moved the TLS context's file reads into a worker thread; the errors they raise reach
every watcher of the stream. ``aget_client_config`` promises a :class:`KafkaConfigurationError`
on bad settings: a bare ``FileNotFoundError: [Errno 2] No such file or directory`` names neither
the file nor the setting, and is not the provider's configuration error. Run through Airflow's
real ``SharedStreamManager`` (the harness); the failure comes before any broker is reached.
"""

from __future__ import annotations

import json

import pytest

from airflow_shared_stream.kafka import KafkaConfigurationError, KafkaSharedStreamTrigger
from airflow_shared_stream.testing import SharedStreamHarness

KEY_PASSWORD = "tls-key-password-never-in-errors"


def cases(tmp_path):
    key = tmp_path / "client.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")
    missing = str(tmp_path / "no-such-ca.pem")
    return {
        "missing_ca": ({"ssl.ca.location": missing}, ("ssl.ca.location", missing)),
        "ca_is_a_directory": ({"ssl.ca.location": str(tmp_path)}, ("ssl.ca.location", str(tmp_path))),
        "unreadable_key": (
            {
                "ssl.certificate.location": str(key),
                "ssl.key.location": str(key),
                "ssl.key.password": KEY_PASSWORD,
            },
            ("ssl.certificate.location",),
        ),
    }


@pytest.mark.parametrize("case", ["missing_ca", "ca_is_a_directory", "unreadable_key"])
async def test_a_tls_file_that_cannot_be_read_fails_the_stream_with_a_named_configuration_error(
    case, tmp_path, monkeypatch
):
    extra, named = cases(tmp_path)[case]
    conn_id = f"kafka_tls_{case}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": "kafka",
                "extra": {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SSL", **extra},
            }
        ),
    )
    async with SharedStreamHarness(confirm_after=0.0) as harness:
        watcher = harness.add(KafkaSharedStreamTrigger(["orders"], kafka_config_id=conn_id))
        error = await watcher.wait_for_error()
    assert isinstance(error, KafkaConfigurationError), repr(error)
    for name in named:
        assert name in str(error), str(error)
    assert KEY_PASSWORD not in str(error)
