"""Amazon SQS shared stream: hook (Connection to client), producer, trigger."""

from __future__ import annotations
