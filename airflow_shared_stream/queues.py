"""
The four shared-stream triggers behind common.messaging's ``MessageQueueTrigger``.

Airflow's event-driven scheduling guide has users write
``AssetWatcher(trigger=MessageQueueTrigger(scheme=..., **arguments))``; the common.messaging
provider asks every installed message-queue provider (``queues:`` in provider.yaml) which one
answers for the scheme, builds that provider's trigger from the arguments and returns the
trigger's own ``serialize()``. So the Dag, the trigger table and the triggerer hold our trigger
class itself, and watchers declared either way share one consumer.

The schemes are ``shared+`` and the broker's extra (``shared+kafka``, ``shared+sqs``,
``shared+pubsub``, ``shared+servicebus``): ``MessageQueueTrigger`` refuses a scheme that two
providers claim, and the official providers claim ``kafka``, ``sqs``, ``kinesis``,
``google+pubsub``, ``azure+servicebus`` and ``redis+pubsub``. Matching is by scheme only: the
deprecated ``queue=`` URIs (``https://sqs...``, ``kafka://...``) name the same upstreams the
official providers match, so claiming them would make a URI two providers match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from airflow.exceptions import AirflowOptionalProviderFeatureException
from airflow.sdk.module_loading import import_string

try:
    from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise AirflowOptionalProviderFeatureException(
        "MessageQueueTrigger schemes need the common.messaging provider: "
        "pip install 'airflow-shared-stream[common-messaging]'"
    ) from exc

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger

__all__ = [
    "SCHEMES",
    "KafkaSharedStreamQueueProvider",
    "PubSubSharedStreamQueueProvider",
    "ServiceBusSharedStreamQueueProvider",
    "SharedStreamQueueProvider",
    "SqsSharedStreamQueueProvider",
]


class SharedStreamQueueProvider(BaseMessageQueueProvider):
    """
    One broker's scheme: ``shared+<extra>`` resolves to that broker's shared-stream trigger.

    The trigger is imported when a Dag uses the scheme, not when Airflow discovers the
    provider: each broker's SDK is an extra of its own, and a deployment with only some of them
    still lists every scheme, and says which extra a scheme it lacks needs.
    """

    scheme: str
    trigger_path: ClassVar[str]

    def scheme_matches(self, scheme: str) -> bool:
        # RFC 3986: a scheme is case-insensitive; lower case is its canonical form.
        return isinstance(scheme, str) and scheme.lower() == self.scheme

    def trigger_class(self) -> type[BaseEventTrigger]:
        # Without the broker's extra, its package's import names the extra to install.
        trigger: type[BaseEventTrigger] = import_string(self.trigger_path)
        return trigger


class KafkaSharedStreamQueueProvider(SharedStreamQueueProvider):
    """``shared+kafka``: :class:`~airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger`."""

    scheme = "shared+kafka"
    trigger_path = "airflow_shared_stream.kafka.trigger.KafkaSharedStreamTrigger"


class SqsSharedStreamQueueProvider(SharedStreamQueueProvider):
    """``shared+sqs``: :class:`~airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger`."""

    scheme = "shared+sqs"
    trigger_path = "airflow_shared_stream.sqs.trigger.SqsSharedStreamTrigger"


class PubSubSharedStreamQueueProvider(SharedStreamQueueProvider):
    """``shared+pubsub``: :class:`~airflow_shared_stream.pubsub.trigger.PubSubSharedStreamTrigger`."""

    scheme = "shared+pubsub"
    trigger_path = "airflow_shared_stream.pubsub.trigger.PubSubSharedStreamTrigger"


class ServiceBusSharedStreamQueueProvider(SharedStreamQueueProvider):
    """``shared+servicebus``: :class:`~airflow_shared_stream.servicebus.ServiceBusSharedStreamTrigger`."""

    scheme = "shared+servicebus"
    trigger_path = "airflow_shared_stream.servicebus.trigger.ServiceBusSharedStreamTrigger"


SCHEMES: dict[str, type[SharedStreamQueueProvider]] = {
    provider.scheme: provider
    for provider in (
        KafkaSharedStreamQueueProvider,
        SqsSharedStreamQueueProvider,
        PubSubSharedStreamQueueProvider,
        ServiceBusSharedStreamQueueProvider,
    )
}
"""Scheme -> provider class, as provider.yaml's ``queues:`` registers them."""
