"""
Old public names kept importable after a rename, each use warned about.

A module that renamed a public class or function sets
``__getattr__ = renamed_names(__name__, globals(), {"Old": "New"})``: Python calls a module's
``__getattr__`` only for names the module does not define, so current names cost nothing and an
old one returns the new object with an ``AirflowProviderDeprecationWarning`` pointing at the
caller's line.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning


def renamed_names(
    module: str,
    namespace: Mapping[str, Any],
    renamed: Mapping[str, str],
    imported_on_use: Mapping[str, str] | None = None,
) -> Callable[[str], Any]:
    """
    A module ``__getattr__`` that answers each old name in ``renamed`` with the new object.

    ``imported_on_use`` maps current names to the module defining them, imported only when the
    name is used: a package whose producer imports its broker SDK stays light to import (the
    triggerer imports a trigger's package on its event loop).
    """

    def __getattr__(name: str) -> Any:
        if imported_on_use and name in imported_on_use:
            return getattr(importlib.import_module(imported_on_use[name]), name)
        new = renamed.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is deprecated; use {new}",
            AirflowProviderDeprecationWarning,
            stacklevel=2,  # the line that used the old name
        )
        return namespace[new]

    return __getattr__
