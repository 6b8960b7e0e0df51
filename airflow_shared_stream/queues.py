"""
The shared-stream triggers behind common.messaging's ``MessageQueueTrigger``, one scheme a broker.

Airflow's event-driven scheduling guide has users write
``AssetWatcher(trigger=MessageQueueTrigger(scheme=..., **arguments))``; the common.messaging
provider asks every installed message-queue provider (``queues:`` in provider.yaml) which one
answers for the scheme, builds that provider's trigger from the arguments and returns the
trigger's own ``serialize()``. So the Dag, the trigger table and the triggerer hold our trigger
class itself, and watchers declared either way share one consumer.

The schemes are ``shared+`` and the broker's name (``shared+kafka``, ``shared+sqs``,
``shared+pubsub``, ``shared+servicebus``), one provider class a broker of the registry
(:mod:`airflow_shared_stream.brokers`), named ``<title>SharedStreamQueueProvider`` as
provider.yaml lists them: ``MessageQueueTrigger`` refuses a scheme that two
providers claim, and the official providers claim ``kafka``, ``sqs``, ``kinesis``,
``google+pubsub``, ``azure+servicebus`` and ``redis+pubsub``. Matching is by scheme only: the
deprecated ``queue=`` URIs (``https://sqs...``, ``kafka://...``) name the same upstreams the
official providers match, so claiming them would make a URI two providers match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from airflow.exceptions import AirflowOptionalProviderFeatureException
from airflow.sdk.module_loading import import_string

from airflow_shared_stream.brokers import RegisteredBroker, registered_broker, registered_brokers

try:
    from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise AirflowOptionalProviderFeatureException(
        "MessageQueueTrigger schemes need the common.messaging provider: "
        "pip install 'airflow-shared-stream[common-messaging]'"
    ) from exc

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger


class SharedStreamQueueProvider(BaseMessageQueueProvider):
    """
    One broker's scheme: ``shared+<broker>`` resolves to that broker's shared-stream trigger.

    The trigger is imported when a Dag uses the scheme, not when Airflow discovers the
    provider: each broker's SDK is an extra of its own, and a deployment with only some of them
    still lists every scheme, and says which extra a scheme it lacks needs.
    """

    scheme: str
    broker: ClassVar[str]

    def scheme_matches(self, scheme: str) -> bool:
        # RFC 3986: a scheme is case-insensitive; lower case is its canonical form.
        return isinstance(scheme, str) and scheme.lower() == self.scheme

    @property
    def trigger_path(self) -> str:
        """The broker's trigger, as its ``operations.py`` names it (importing the broker's package)."""
        broker = registered_broker(self.broker)
        if broker is None:
            raise ValueError(f"no broker {self.broker!r} is registered")
        return broker.operations().trigger_path

    def trigger_class(self) -> type[BaseEventTrigger]:
        # Without the broker's extra, its package's import names the extra to install.
        trigger: type[BaseEventTrigger] = import_string(self.trigger_path)
        return trigger


def _provider_class(broker: RegisteredBroker) -> type[SharedStreamQueueProvider]:
    return type(
        f"{broker.title}SharedStreamQueueProvider",
        (SharedStreamQueueProvider,),
        {
            "__module__": __name__,
            "__doc__": f"``{broker.scheme}``: the {broker.title} shared-stream trigger.",
            "scheme": broker.scheme,
            "broker": broker.name,
        },
    )


PROVIDERS: dict[str, type[SharedStreamQueueProvider]] = {
    provider.__name__: provider for provider in map(_provider_class, registered_brokers())
}
"""Class name -> provider class, one a registered broker, as provider.yaml's ``queues:`` names them."""

SCHEMES: dict[str, type[SharedStreamQueueProvider]] = {
    provider.scheme: provider for provider in PROVIDERS.values()
}
"""Scheme -> provider class."""

__all__ = ["PROVIDERS", "SCHEMES", "SharedStreamQueueProvider", *PROVIDERS]


def __getattr__(name: str) -> type[SharedStreamQueueProvider]:
    """The provider classes by name (``airflow_shared_stream.queues.KafkaSharedStreamQueueProvider``)."""
    try:
        return PROVIDERS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
