"""
Kafka stream identity: two connection ids that reach one cluster never split its topics.

The key holds the connection id, not the cluster its bootstrap list resolves to (docs/kafka.rst,
"Stream identity and consumer groups"): the derived consumer group and every watcher's own
position hash it, so resolving it now would move every durable position. Two connection ids of
one cluster (bootstrap lists in another order or case) are therefore two streams, and what
keeps that from being a silent split is checked here: each gets a group of its own, so each
reads every record; a ``group_id`` given to both fails loudly on one triggerer, naming both.
"""

from __future__ import annotations

import pytest

from airflow_shared_stream.kafka.identity import GroupClaims, consumer_group_id, normalise_topics
from airflow_shared_stream.kafka.trigger import KafkaSharedStreamTrigger


def test_topics_in_another_order_or_repeated_are_one_stream():
    one = KafkaSharedStreamTrigger(["b", "a"], kafka_config_id="k")
    other = KafkaSharedStreamTrigger(["a", "b", "a"], kafka_config_id="k", max_in_flight=10)
    assert one.shared_stream_key() == other.shared_stream_key()
    assert normalise_topics(["b", "a", "a"]) == ["a", "b"]


def test_two_connection_ids_of_one_cluster_never_share_a_derived_group():
    """A shared group would split the partitions between the two streams' consumers."""
    by_one = consumer_group_id(["orders"], "kafka_a", group_id=None, connection_group_id="team")
    by_other = consumer_group_id(["orders"], "kafka_b", group_id=None, connection_group_id="team")
    assert by_one != by_other
    assert (
        KafkaSharedStreamTrigger(["orders"], kafka_config_id="kafka_a").watcher_digest()
        != KafkaSharedStreamTrigger(["orders"], kafka_config_id="kafka_b").watcher_digest()
    )


def test_an_explicit_group_through_two_connection_ids_fails_naming_both():
    claims = GroupClaims()
    claims.claim("orders-group", (("orders",), "kafka_a"))
    with pytest.raises(ValueError, match="'orders-group' is already used by another stream") as caught:
        claims.claim("orders-group", (("orders",), "kafka_b"))
    assert "'kafka_a'" in str(caught.value)
    assert "'kafka_b'" in str(caught.value)
