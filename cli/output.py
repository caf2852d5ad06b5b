"""Printing: the server's JSON as is for --json; aligned tables and key/value blocks otherwise."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

# Control characters (a model's raw sample can hold any byte) would redraw the terminal.
_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if c not in (9, 10)} | {127: "\\x7f"}


def print_json(data: Any, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    stream.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def print_json_line(data: Any, stream: TextIO | None = None) -> None:
    """One compact object per line (JSON Lines) for streams: each line parses on its own."""
    stream = stream or sys.stdout
    stream.write(json.dumps(data, ensure_ascii=False) + "\n")
    stream.flush()


def clean(text: str, newlines: bool = True) -> str:
    text = text.translate(_CONTROL)
    return text if newlines else text.replace("\n", "\\n").replace("\t", " ")


def fmt(value: Any) -> str:
    """A cell: `-` for nothing, short floats, compact JSON for structures."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return clean(str(value), newlines=False)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(headers), *cells]
    )


def pairs(items: Iterable[tuple[str, Any]], indent: str = "") -> str:
    """`key  value` lines with the values aligned."""
    items = list(items)
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{indent}{k.ljust(width)}  {fmt(v)}" for k, v in items)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def say(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def warn(text: str) -> None:
    sys.stderr.write(text + "\n")


def steps(run: dict[str, Any]) -> str:
    """A run's step of its total; a Tinker SDK session has no total (its script decides)."""
    total = run.get("total_steps")
    return f"{run.get('step', 0)}/{total}" if total else str(run.get("step", 0))
