"""Send one order to the local topic (python kafka_send.py)."""

from __future__ import annotations

import asyncio
import json

from aiokafka import AIOKafkaProducer


async def send() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9092")
    await producer.start()
    try:
        await producer.send_and_wait("orders", json.dumps({"type": "order_created", "order_id": 1}).encode())
    finally:
        await producer.stop()


asyncio.run(send())
