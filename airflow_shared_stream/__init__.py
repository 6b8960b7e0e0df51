"""At-least-once shared-stream triggers and a deferrable Spark operator for Apache Airflow."""

from __future__ import annotations

__version__ = "0.1.0"
