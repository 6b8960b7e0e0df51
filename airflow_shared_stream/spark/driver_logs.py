"""The line a person wants from a failed driver's logs: the last exception it raised."""

from __future__ import annotations

import re

_JVM_EXCEPTION = re.compile(
    r"^(?:Caused by: |Exception in thread \"[^\"]*\" )?([\w.$]+(?:Error|Exception)(?::.*)?)$", re.MULTILINE
)


def _python_exception(text: str) -> str | None:
    idx = text.rfind("Traceback (most recent call last):")
    if idx < 0:
        return None
    for line in text[idx:].splitlines()[1:]:
        if line and not line.startswith((" ", "\t")):
            return line.strip()[:1000]
    return None


def summarize_driver_output(stdout: str, stderr: str = "") -> str | None:
    """
    The line a person wants from a failed driver: the last exception it raised.

    ``PythonRunner`` pipes the Python process's stdout and stderr into the driver's *stdout*
    file, so a Python traceback is looked for there first (then in stderr); failing that, the
    innermost JVM exception in stderr (the last ``Caused by:``).
    """
    found = _python_exception(stdout) or _python_exception(stderr)
    if found:
        return found
    matches = _JVM_EXCEPTION.findall(stderr)
    return matches[-1].strip()[:1000] if matches else None
