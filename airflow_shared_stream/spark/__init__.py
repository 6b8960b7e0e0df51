"""
Deferrable Spark submission: hook, operator, trigger.

Import the classes from their modules (``airflow_shared_stream.spark.operators``,
``.triggers``, ``.hook``): this package stays import-light because its ``driver_python``
launcher runs on Spark nodes that may not have Airflow. The operator needs Airflow's Spark
provider (the ``spark`` extra); importing it without the provider fails naming the extra. The
trigger and the hook do not need it, so a triggerer runs Spark waits without it.
"""

from __future__ import annotations
