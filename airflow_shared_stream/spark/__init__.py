"""
Deferrable Spark submission: hook, operator, trigger.

Import the classes from their modules (``airflow_shared_stream.spark.operators``,
``.triggers``, ``.hook``): this package stays import-light because its ``driver_python``
launcher runs on Spark nodes that may not have Airflow.
"""

from __future__ import annotations
