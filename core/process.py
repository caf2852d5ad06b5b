"""A process we started in a process group of its own, as its owner sees it: `Process` (its
exit in words, its log's last lines, a stop that ends the whole group) and `start_logged` for
one whose output goes to a log file. `core.child.Child` is one that speaks JSON lines.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from core import procs
from core.run_folder import tail_lines

log = logging.getLogger(__name__)

REDACTED = b"<the run's key>"  # what a secret reads as in a log `start_logged` writes
KILL_WAIT_S = 10.0  # a process still there this long after SIGKILL is stuck in the kernel
TAIL_LINES = 25
FAILURE_TAIL_LINES = 10


class Process:
    """One process we started, alone in its process group (so that ending the group ends
    whatever it started), its output or its errors appended to `log_path` (None: nowhere).
    `pump`, when there is one, is the thread that copies its output into that log."""

    def __init__(
        self,
        name: str,
        proc: subprocess.Popen[Any],
        log_path: Path | None,
        pump: threading.Thread | None = None,
    ) -> None:
        self.name = name  # in words, for messages: "the trajectory API"
        self.log_path = log_path
        self._proc = proc
        self._pump = pump

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def exit_code(self) -> int | None:
        """Its exit code (negative: the signal that ended it); None while it runs."""
        return self._proc.poll()

    def exit_status(self, wait_s: float = 0.0) -> str:
        """How it ended, in words ("exit code 3", "killed by SIGKILL (9)"), once it has, waiting
        up to `wait_s` for it."""
        try:
            return procs.describe_exit(self._proc.wait(timeout=wait_s))
        except subprocess.TimeoutExpired:
            return "still running"

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last lines of its log ("" without one)."""
        if self.log_path is None:
            return ""
        return "\n".join(tail_lines(self.log_path, lines))

    def describe(self) -> str:
        """Whether it runs or how it ended, and its log's last lines, for an error."""
        code = self._proc.poll()
        how = "is running" if code is None else f"ended ({procs.describe_exit(code)})"
        if self.log_path is None:
            return f"{self.name} {how}"
        return f"{self.name} {how}; the last lines of its log ({self.log_path}):\n{self.tail()}"

    def failure(self, when: str) -> str:
        """Why a request to it failed: `when` and, with a log, the log's last lines."""
        if self.log_path is None:
            return f"{self.name} failed: {when}"
        tail = self.tail(FAILURE_TAIL_LINES)
        return f"{self.name} failed: {when}. Last lines of its log:\n{tail}"

    def interrupt(self, grace_s: float = 3.0) -> None:
        """SIGINT to its group first (Python unwinds and flushes what it buffered, say a JSON
        lines file), then as `stop`."""
        if self.alive:
            procs.signal_group(self.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=grace_s)
        self.stop()

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to its group, then SIGKILL to what is left of the group after `grace_s`."""
        if self.alive:
            procs.signal_group(self.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %ss: SIGKILL", self.name, grace_s)
        # Whatever it started is in its group too, and may outlive it.
        procs.signal_group(self.pid, signal.SIGKILL)
        self._reap()
        self.join_log()

    def kill(self) -> None:
        """SIGKILL to its group now: it and anything it started."""
        if self.alive:
            procs.signal_group(self.pid, signal.SIGKILL)
        self._reap()

    def join_log(self, timeout_s: float = 5.0) -> None:
        """Until its log holds all it wrote (the pump copied the rest of its output)."""
        if self._pump is not None:
            self._pump.join(timeout=timeout_s)

    def _reap(self) -> None:
        try:
            self._proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %s) did not end after SIGKILL", self.name, self.pid)


def start_logged(
    name: str,
    argv: list[str],
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    secret: str | None = None,
) -> Process:
    """Start one process, its stdout and stderr appended to `log_path` after a line naming it;
    with a `secret` (a run's key, which atroposlib prints with its server config) through a
    pipe that blanks it out as REDACTED. Its group is its own, its session ours: a run's
    session must still reach it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out if secret is None else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,  # its own group (a stop reaches what it starts), our session
        )
    pump = None
    if secret is not None:
        assert proc.stdout is not None
        pump = threading.Thread(
            target=_copy_blanking,
            args=(proc.stdout, log_path, secret.encode()),
            name=f"{name} log",
            daemon=True,
        )
        pump.start()
    log.info("started %s (pid %s): %s", name, proc.pid, " ".join(argv))
    return Process(name, proc, log_path, pump)


def _copy_blanking(source: IO[bytes], log_path: Path, secret: bytes) -> None:
    with source, log_path.open("ab") as out:
        for line in source:
            out.write(line.replace(secret, REDACTED))
            out.flush()
