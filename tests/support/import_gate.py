"""
A gate a test holds a producer module's import at (``gated_producer``): the module's import
sets ``entered`` and waits for ``release``, as a broker SDK's first import takes seconds on a
loaded triggerer. Reset both events before each use.
"""

from __future__ import annotations

import threading

entered = threading.Event()
release = threading.Event()
