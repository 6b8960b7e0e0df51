"""
Which Kafka stream a watcher reads, and which consumer group holds its position.

The rule (docs/concepts.rst, DESIGN.md 5a): a stream key names the upstream and nothing else.
For Kafka that is the set of topics (sorted, deduplicated), the connection that resolves the
cluster, and an explicit ``group_id`` when the watcher names one. The group id is in the key
because it *is* the consumer's durable identity: the committed offsets live under it, so two
watchers naming two groups ask for two independent positions on the topics, and each reads every
record (nothing is split). Tuning arguments (``max_in_flight``, ``max_payload_bytes``,
``dead_letter_topic``) are not in the key: they shape the one consumer the watchers share, so
they must agree (``common/trigger.py`` checks it), and changing them on a redeploy resumes the same
group where it stopped.

The consumer group of a stream is:

* the trigger's ``group_id``, verbatim, when it names one;
* otherwise ``<prefix>-<digest of the stream's upstream identity>``, where ``<prefix>`` is the
  connection's ``group.id`` (so a deployment can still recognise, own and authorise its groups by
  prefix) or ``airflow-shared-stream``. The digest keeps two different streams out of one group:
  Kafka would split their partitions between the two consumers, and each watcher would silently
  see part of its topic.

A group that is named explicitly can still be given to two different streams by mistake; within
one triggerer :class:`GroupClaims` refuses the second one with an error naming both. Across
triggerers nothing can be split any more: no stream consumer joins its group (every triggerer
reads every partition, docs/ha.rst); the group only keys the stream's committed start positions,
and each watcher's own position lives under a group derived from it
(:mod:`~airflow_shared_stream.kafka.watchers`). Two different connection ids that reach
the same cluster, with the same topics and ``group_id``, cannot be told from a second triggerer of
the same stream (DESIGN.md 5.3) and are not detected.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence

GROUP_DIGEST_TAG = "airflow-shared-stream/kafka"
"""Part of what the derived group id hashes: changing it moves every derived group."""
DEFAULT_GROUP_PREFIX = "airflow-shared-stream"


def normalise_topics(topics: str | Sequence[str]) -> list[str]:
    """Topic names sorted and deduplicated; refuses an empty list or a blank name."""
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names or not all(isinstance(t, str) and t.strip() for t in names):
        raise ValueError(f"topics must be a non-empty list of topic names, got {topics!r}")
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

    Two consumers of one group with different subscriptions split the partitions of the topics
    they have in common: the silent loss issue 7 item 3 describes. Several consumers of the same
    stream in one group is a different matter (a second triggerer of the same Dags, DESIGN.md 5.3)
    and is not refused here.
    """

    def __init__(self) -> None:
        self._owners: dict[str, tuple[Hashable, int]] = {}

    def claim(self, group: str, identity: Hashable) -> None:
        """Record that the stream ``identity`` consumes as ``group``; raise if another does."""
        owner = self._owners.get(group)
        if owner is not None and owner[0] != identity:
            raise ValueError(
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
