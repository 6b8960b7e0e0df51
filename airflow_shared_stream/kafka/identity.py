"""
Which Kafka stream a watcher reads, and which consumer group keys the stream's positions.

A stream key names the upstream and nothing else: the topics (sorted, deduplicated), the
connection, and an explicit ``group_id`` when the watcher names one (the group keys the committed
offsets, so two groups are two independent positions). Tuning arguments shape the one consumer
the watchers share, so they must agree (``common/trigger.py``) and stay out of the key.

The group is the trigger's ``group_id`` verbatim, or ``<prefix>-<digest of topics and
connection>`` with the connection's ``group.id`` (or ``airflow-shared-stream``) as the prefix, so
two streams never share a derived group. :class:`GroupClaims` refuses one explicit group given to
two streams of one triggerer. No stream consumer joins its group (every triggerer reads every
partition, docs/ha.rst), so nothing is split across triggerers; two connection ids that reach one
cluster with the same topics and ``group_id`` look like a second triggerer and are not detected.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence

from airflow_shared_stream.kafka.errors import KafkaConfigurationError, KafkaGroupConflictError

GROUP_DIGEST_TAG = "airflow-shared-stream/kafka"
"""Part of what the derived group id hashes: changing it moves every derived group."""
DEFAULT_GROUP_PREFIX = "airflow-shared-stream"


def normalise_topics(topics: str | Sequence[str]) -> list[str]:
    """Topic names sorted and deduplicated; refuses an empty list or a blank name."""
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names or not all(isinstance(t, str) and t.strip() for t in names):
        raise KafkaConfigurationError(f"topics must be a non-empty list of topic names, got {topics!r}")
    return sorted(set(names))


def consumer_group_id(
    topics: Sequence[str],
    kafka_config_id: str,
    *,
    group_id: str | None,
    connection_group_id: str | None,
) -> str:
    """
    The consumer group of a stream: ``group_id`` verbatim, else a per-stream derived id.

    The derived id depends on the upstream identity only (topics and connection), never on a
    tuning argument, so a redeploy with other tuning resumes from the same commits.
    """
    if group_id:
        return group_id
    identity = repr((GROUP_DIGEST_TAG, tuple(normalise_topics(topics)), kafka_config_id))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:20]
    return f"{connection_group_id or DEFAULT_GROUP_PREFIX}-{digest}"


class GroupClaims:
    """
    The consumer groups the Kafka streams of this process use, so no two streams share one.

    Two consumers of one group with different subscriptions would split the partitions of the
    topics they have in common, so each would silently miss part of them. Several consumers of
    the same stream in one group (a second triggerer of the same Dags) are not refused here.
    """

    def __init__(self) -> None:
        self._owners: dict[str, tuple[Hashable, int]] = {}

    def claim(self, group: str, identity: Hashable) -> None:
        """Record that the stream ``identity`` consumes as ``group``; raise if another does."""
        owner = self._owners.get(group)
        if owner is not None and owner[0] != identity:
            raise KafkaGroupConflictError(
                f"consumer group {group!r} is already used by another stream in this triggerer "
                f"({_describe(owner[0])}); two different streams in one group would split the "
                f"topics' partitions between them. Give this watcher ({_describe(identity)}) "
                "another group_id, or none (a per-stream id is derived)"
            )
        count = owner[1] if owner is not None else 0
        self._owners[group] = (identity, count + 1)

    def release(self, group: str, identity: Hashable) -> None:
        owner = self._owners.get(group)
        if owner is None or owner[0] != identity:
            return
        if owner[1] <= 1:
            del self._owners[group]
        else:
            self._owners[group] = (identity, owner[1] - 1)


def _describe(identity: Hashable) -> str:
    if isinstance(identity, tuple) and len(identity) == 2:
        topics, conn = identity
        return f"topics {', '.join(topics)} on connection {conn!r}"
    return repr(identity)


group_claims = GroupClaims()
