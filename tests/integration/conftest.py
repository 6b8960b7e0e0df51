"""Fixtures every broker's integration tests share."""

from __future__ import annotations

from tests.support.statsd import statsd

__all__ = ["statsd"]
