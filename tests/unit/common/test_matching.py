from __future__ import annotations

import pytest

from airflow_shared_stream.common.errors import SharedStreamConfigurationError
from airflow_shared_stream.common.matching import EnvelopeMatcher, Verdict, decode_body, is_truthy


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a": 1}', {"a": 1}),
        ("[1, 2]", [1, 2]),
        (b"42", 42),
        (b"-3.5", -3.5),
        (b"true", True),
        (b"null", None),
        (b'"quoted"', "quoted"),
        (b"plain text", "plain text"),
        (b"{not json", "{not json"),
        (b"12 apples", "12 apples"),
        ("héllo".encode(), "héllo"),
        (b"", ""),
        (None, None),
    ],
)
def test_decode_body(raw, expected):
    assert decode_body(raw) == (expected, None)


def test_undecodable_bytes_give_a_reason_not_an_exception():
    body, error = decode_body(b"\xff\xfe\x00binary")
    assert body is None
    assert "not UTF-8" in error


@pytest.mark.parametrize(
    ("value", "truthy"),
    [
        (None, False),
        (False, False),
        ("", False),
        ([], False),
        ({}, False),
        (0, True),
        ("x", True),
        ([0], True),
    ],
)
def test_jmespath_truthiness(value, truthy):
    assert is_truthy(value) is truthy


ENVELOPE = {"body": {"kind": "order", "amount": 10, "tags": ["eu"]}, "headers": {"source": "shop"}}


@pytest.mark.parametrize(
    ("match", "reject", "verdict"),
    [
        (None, None, Verdict.MATCH),
        ("body.kind == 'order'", None, Verdict.MATCH),
        ("body.kind == 'refund'", None, Verdict.SKIP),
        ("body.amount > `5`", None, Verdict.MATCH),
        ("contains(body.tags, 'eu')", None, Verdict.MATCH),
        (None, "body.amount > `5`", Verdict.REJECT),
        ("body.kind == 'order'", "headers.source == 'shop'", Verdict.REJECT),  # reject wins
        ("body.missing", None, Verdict.SKIP),
    ],
)
def test_verdicts(match, reject, verdict):
    assert EnvelopeMatcher(match, reject).evaluate(ENVELOPE)[0] is verdict


def test_an_expression_failing_on_one_message_rejects_it_with_the_reason():
    verdict, reason = EnvelopeMatcher("body.kind > `1`").evaluate(ENVELOPE)  # string > number
    assert verdict is Verdict.REJECT
    assert "TypeError" in reason
    verdict, reason = EnvelopeMatcher("length(body.amount) > `1`").evaluate(ENVELOPE)
    assert verdict is Verdict.REJECT
    assert "expression failed" in reason


@pytest.mark.parametrize("bad", ["body.[", "", "   ", 5])
def test_bad_expressions_fail_at_construction(bad):
    with pytest.raises(SharedStreamConfigurationError, match="match"):
        EnvelopeMatcher(match=bad)
