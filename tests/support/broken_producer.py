"""A producer module whose broker SDK is installed but broken: a dependency of it is missing."""

from __future__ import annotations

import airflow_shared_stream_missing_sdk_dependency  # noqa: F401  (the SDK's missing dependency)

from airflow_shared_stream.testing import InMemoryProducer as BrokenProducer

__all__ = ["BrokenProducer"]
