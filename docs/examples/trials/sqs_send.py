"""Send one order to the local queue (python sqs_send.py, with QUEUE_URL set as the trial sets it)."""

from __future__ import annotations

import json
import os

import boto3

sqs = boto3.client(
    "sqs",
    endpoint_url="http://127.0.0.1:5000",
    region_name="us-east-1",
    aws_access_key_id="testing",
    aws_secret_access_key="testing",
)
sqs.send_message(
    QueueUrl=os.environ["QUEUE_URL"], MessageBody=json.dumps({"type": "order_created", "order_id": 1})
)
