"""Send one order to the emulator's queue.1 (python servicebus_send.py)."""

from __future__ import annotations

import json

from azure.servicebus import ServiceBusClient, ServiceBusMessage

CONNECTION_STRING = (
    "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
)

with (
    ServiceBusClient.from_connection_string(CONNECTION_STRING) as client,
    client.get_queue_sender("queue.1") as sender,
):
    sender.send_messages(ServiceBusMessage(json.dumps({"type": "order_created", "order_id": 1})))
