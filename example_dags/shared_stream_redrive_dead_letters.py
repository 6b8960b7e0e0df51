"""
Send dead-lettered messages back to their source: the Dag the Streams page starts for a redrive.

The Dag ships in the package (:mod:`airflow_shared_stream.redrive_dag`); this file of one line puts
it in a Dags folder. Copy it to yours to enable redrive from the Streams page. Start it from the
page: the page fills the broker, the connection and both addresses from the stream's watchers and
signs them for the run once it checked that you may trigger the stream's Dags; a run triggered
any other way is refused at run time (docs/redrive.rst). ``dry_run`` is on by default.
"""

from __future__ import annotations

from airflow_shared_stream.redrive_dag import redrive_dead_letters_dag

dag = redrive_dead_letters_dag()
