"""Answer extraction shared by environments: the content of the last `\\boxed{...}`."""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text`, stripped, or None when there is none."""
    found = _BOXED.findall(text)
    return found[-1].strip() if found else None
