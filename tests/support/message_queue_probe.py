"""
Print, as JSON, how common.messaging's MessageQueueTrigger resolves schemes in this Python.

Run by tests/integration/test_message_queue_schemes_coexist.py inside a deployment virtualenv
(tests/support/deployment_venv.py); argv[1] is the example Dag file to serialize.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from airflow.dag_processing.dagbag import DagBag
from airflow.providers.common.messaging.triggers.msg_queue import MESSAGE_QUEUE_PROVIDERS, MessageQueueTrigger
from airflow.serialization.serialized_objects import DagSerialization

# Our schemes and a watcher's arguments for each.
OURS: dict[str, dict[str, Any]] = {
    "shared+kafka": {"topics": ["orders"]},
    "shared+sqs": {"queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"},
    "shared+pubsub": {"subscription": "projects/shop-events/subscriptions/orders"},
    "shared+servicebus": {"queue_name": "orders"},
}
# Queue URIs of the deprecated ``queue=`` form that the official providers match.
URIS = [
    "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
    "kafka://127.0.0.1:9092/orders",
    "projects/shop-events/subscriptions/orders",
]


def _name(provider: Any) -> str:
    return f"{type(provider).__module__}.{type(provider).__qualname__}"


def main() -> None:
    providers = {_name(p): getattr(p, "scheme", None) for p in MESSAGE_QUEUE_PROVIDERS}
    schemes = sorted({s for s in providers.values() if s} | set(OURS))
    bag = DagBag(dag_folder=sys.argv[1])
    serialized = json.loads(json.dumps(DagSerialization.to_dict(bag.dags["message_queue_orders"])))
    objects = serialized["dag"]["timetable"]["__var"]["asset_condition"]["objects"]
    print(
        json.dumps(
            {
                "providers": providers,
                "scheme_claims": {
                    s: [_name(p) for p in MESSAGE_QUEUE_PROVIDERS if p.scheme_matches(s)] for s in schemes
                },
                "uri_claims": {
                    u: [_name(p) for p in MESSAGE_QUEUE_PROVIDERS if p.queue_matches(u)] for u in URIS
                },
                "resolved": {s: MessageQueueTrigger(scheme=s, **a).serialize()[0] for s, a in OURS.items()},
                "example_dag_errors": {k: str(v) for k, v in bag.import_errors.items()},
                "example_dag_classpaths": [w["trigger"]["classpath"] for a in objects for w in a["watchers"]],
            }
        )
    )


if __name__ == "__main__":
    main()
