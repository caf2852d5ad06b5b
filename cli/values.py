"""Values typed on the command line: JSON when the text parses as JSON, else a plain string."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _no_constant(name: str) -> Any:
    # NaN and Infinity parse in Python but are not JSON: send such text as a string instead.
    raise ValueError(name)


def parse_value(text: str) -> Any:
    """`8` -> 8, `true` -> True, `0.001` -> 0.001, `{"a":1}` -> dict, `null` -> None,
    and anything that is not JSON (`gpt2`, `HuggingFaceTB/SmolLM2-135M`) -> the text itself."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return text


def assignment(text: str) -> tuple[str, Any]:
    """argparse type for `--set key=value`."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, parse_value(value)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value
