"""The server's side of a child process that speaks one JSON message per line on its stdin
and stdout (the inference worker, environment inspectors)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from core import procs
from core.run_folder import tail_lines


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


def end_child(proc: subprocess.Popen[str]) -> None:
    """Close the child's input (it exits on end of input); kill its group if it lingers."""
    try:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=5)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        procs.signal_group(proc.pid, signal.SIGKILL)  # the child and anything it started
        proc.wait(timeout=5)


def died_message(what: str, when: str, log_path: Path, closed: bool) -> str:
    """Why a request to the child failed: the server closing it, or its death and log's tail."""
    if closed:
        return f"the server is shutting down; {what} was stopped"
    tail = "\n".join(tail_lines(log_path, 10))
    return f"{what} failed: {when}. Last lines of its log:\n{tail}"
