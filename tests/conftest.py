"""Session-wide test settings: an isolated AIRFLOW_HOME and quiet third-party loggers."""

from __future__ import annotations

import logging
import os
import tempfile

# Before anything imports airflow: never read or write the developer's ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-shared-stream-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

logging.getLogger("werkzeug").setLevel(logging.WARNING)
