"""
The operations console: a Streams page in Airflow's UI and the figures the triggerers publish for it.

* :mod:`.figures` runs in the triggerer: it keeps each stream's counters and writes them, at a
  bounded rate, to the asset state store of one of the stream's watchers (AIP-103).
* :mod:`.streams` (api-server) reads the triggers, their assets, the Dags they schedule and those
  figures from the metadata database and groups them by stream.
* :mod:`.plugin` serves the page and its JSON API under Airflow's own authentication.

Nothing here is imported by the triggerer's hot path but :mod:`.figures`, which needs only Airflow.
"""

from __future__ import annotations
