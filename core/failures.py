"""The root of the errors that end a run for a reason its user can act on. Each kind of failure
is an exception type whose `category` is what the run records as its `failure_kind`, so a
runner classifies a failure by its type, never by its name."""

from __future__ import annotations

from typing import ClassVar


class RunFailure(Exception):
    """An error with a known cause; `reason()` is the one line the run records."""

    category: ClassVar[str] = "error"

    def reason(self) -> str:
        return str(self)
