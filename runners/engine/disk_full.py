"""A full disk (or an exhausted quota), recognised however it surfaces: an OSError with ENOSPC
or EDQUOT, or a library's own error type (safetensors, torch.save) that hides the errno."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from core.failures import RunFailure

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How the errno reads once a library turned it into text (Rust's io::Error, strerror).
_FULL_TEXT = (
    "no space left on device",
    "os error 28",
    "disk quota exceeded",
    "os error 122",
    "storagefull",
    "quotaexceeded",
    "database or disk is full",  # SQLite's SQLITE_FULL
)
# torch.save reports a short write as "unexpected pos ..."; with this little space left where
# it was writing, the disk being full is what cut it short.
_NEARLY_FULL_BYTES = 1 << 20


class DiskFull(RunFailure, OSError):
    """Writing `filename` failed because its disk (or quota) is full."""

    category = "disk_full"


def disk_full_errno(exc: BaseException, where: Path) -> int | None:
    """ENOSPC or EDQUOT when a full disk caused `exc`, raised while writing under `where`; else
    None. Call it before removing what was written: the free space left is part of the evidence.
    """
    code = full_errno(exc)
    if code is None and not isinstance(exc, OSError) and _nearly_full(where):
        code = errno.ENOSPC
    return code


def full_errno(exc: BaseException) -> int | None:
    """ENOSPC or EDQUOT if `exc` or an exception it was raised from says so, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in FULL_ERRNOS:
            return current.errno
        text = str(current).lower()
        if any(marker in text for marker in _FULL_TEXT):
            quota = "quota" in text or "os error 122" in text
            return errno.EDQUOT if quota else errno.ENOSPC
        current = current.__cause__ or current.__context__
    return None


def _nearly_full(where: Path) -> bool:
    try:
        stats = os.statvfs(where)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < _NEARLY_FULL_BYTES
