"""Whether a module is imported, told without importing it: figures and the off-loop imports both ask."""

from __future__ import annotations

import sys


def imported(name: str) -> bool:
    """
    Whether module ``name`` is imported: in ``sys.modules`` and done initialising.

    Python puts a module into ``sys.modules`` when its import starts. One still being imported
    by another thread (another stream's, inside its SDK's import) is not imported: importing it
    on the loop would wait there, on the import lock, for the whole of that thread's import.
    """
    module = sys.modules.get(name)
    if module is None:
        return False
    return not getattr(getattr(module, "__spec__", None), "_initializing", False)
