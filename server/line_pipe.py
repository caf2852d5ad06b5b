"""The server's side of a child process that speaks one JSON message per line on its stdin
and stdout (the inference worker, environment inspectors)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from typing import Any


def read_lines(proc: subprocess.Popen[str], name: str) -> queue.Queue[str | None]:
    """A queue of the child's output lines, filled by a daemon thread; None once it is gone."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.put(line)
        lines.put(None)  # end of output: the child is gone

    threading.Thread(target=pump, daemon=True, name=name).start()
    return lines


def send_line(proc: subprocess.Popen[str], message: dict[str, Any]) -> bool:
    """One message to the child; False when its stdin is gone."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        return False
    return True
