"""Apache Kafka shared stream on aiokafka: hook (Connection to client), producer, trigger."""

from __future__ import annotations
