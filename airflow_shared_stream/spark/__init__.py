"""Deferrable Spark submission: hook, operator, trigger."""

from __future__ import annotations
