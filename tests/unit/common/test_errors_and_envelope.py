"""The one secret scrubber, the error kinds, and the one envelope builder (pure logic)."""

from __future__ import annotations

import base64
import logging

import pytest

from airflow_shared_stream.common.errors import (
    SecretScrubber,
    SharedStreamAccessError,
    SharedStreamConfigurationError,
    SharedStreamError,
    require_sdk,
)
from airflow_shared_stream.common.matching import build_message, oversize_reason
from airflow_shared_stream.sqs.errors import SqsAccessError, SqsConfigurationError


def test_the_scrubber_removes_every_secret_even_when_one_contains_another():
    scrubber = SecretScrubber(["hunter2", "hunter2-extended", None, ""])
    text = scrubber.describe(RuntimeError("auth hunter2-extended failed; retry with hunter2"))
    assert text == "RuntimeError: auth *** failed; retry with ***"


def test_the_scrubber_filters_sdk_log_records(caplog):
    scrubber = SecretScrubber(["s3cr3t"])
    scrubber.install("some.sdk")
    scrubber.install("some.sdk")  # idempotent
    with caplog.at_level(logging.INFO, logger="some.sdk"):
        logging.getLogger("some.sdk").info("connecting with password=%s", "s3cr3t")
    assert "s3cr3t" not in caplog.text
    assert "password=***" in caplog.text
    assert len(logging.getLogger("some.sdk").filters) == 1


def test_broker_errors_are_the_common_kinds():
    assert issubclass(SqsConfigurationError, SharedStreamConfigurationError)
    assert issubclass(SqsConfigurationError, ValueError)  # what the Dag parser shows
    assert issubclass(SqsAccessError, SharedStreamAccessError)
    assert issubclass(SqsAccessError, SharedStreamError)


def test_a_missing_sdk_names_the_extra():
    with pytest.raises(ImportError, match=r"airflow-shared-stream\[nosuch\]"):
        require_sdk("nosuch_sdk_module", "nosuch")


def test_the_envelope_decodes_json_text_and_binary_once():
    assert build_message('{"a": 1}', metadata={"id": 1}, label="m", max_payload_bytes=100).envelope == {
        "body": {"a": 1},
        "id": 1,
    }
    assert build_message("plain", metadata={}, label="m", max_payload_bytes=100).envelope == {"body": "plain"}
    binary = build_message(b"\xff\x00", metadata={}, label="m", max_payload_bytes=100)
    assert binary.unprocessable is None
    assert binary.envelope == {"body": base64.b64encode(b"\xff\x00").decode(), "body_encoding": "base64"}
    refused = build_message(b"\xff\x00", metadata={}, label="m", max_payload_bytes=100, binary="reject")
    assert "not UTF-8" in refused.unprocessable


def test_an_oversize_body_is_never_decoded_and_has_one_wording():
    message = build_message("é" * 60, metadata={"id": 1}, label="m", max_payload_bytes=100)
    assert message.envelope == {"body": None, "id": 1}
    assert message.unprocessable == oversize_reason(120, 100)
    assert message.dead_letter_reason() == f"unprocessable: {oversize_reason(120, 100)}"


def test_metadata_cannot_overwrite_the_body():
    message = build_message('"x"', metadata={"body": "forged"}, label="m", max_payload_bytes=100)
    assert message.envelope["body"] == "x"
