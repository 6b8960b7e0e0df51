"""
The operations console: a Streams page in Airflow's UI. It only reads.

* The triggerers record each stream's figures where the stream code lives
  (:mod:`airflow_shared_stream.common.figures`): its counters, written at a bounded rate to the
  asset state store of one of the stream's watchers (AIP-103).
* :mod:`.streams` (api-server) reads the triggers, their assets, the Dags they schedule and those
  figures from the metadata database and groups them by stream.
* :mod:`.backlog` asks each broker what waits, through its ``operations.py`` (the registry of
  :mod:`airflow_shared_stream.brokers`).
* :mod:`.plugin` serves the page and its JSON API (:mod:`.api`) under Airflow's own authentication.

Nothing here is imported by the triggerer, and nothing below imports it (tests/unit/test_import_floors.py).
"""

from __future__ import annotations
