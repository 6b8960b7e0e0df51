"""Publish one order to the local topic (python pubsub_send.py, with PUBSUB_EMULATOR_HOST set)."""

from __future__ import annotations

import json

from google.cloud import pubsub_v1

publisher = pubsub_v1.PublisherClient()
topic = "projects/local-trial/topics/orders"
publisher.publish(topic, json.dumps({"type": "order_created", "order_id": 1}).encode()).result()
