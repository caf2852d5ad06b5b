"""The two processes an Atropos run starts beside itself: atroposlib's trajectory API and the
environment, each in a process group of its own (inside the run's session), each logging to a
file of the run's folder. Each also ends its group itself once the runner is gone, however it
went (the sitecustomize in runners/atropos/envside/hooks), so nothing of a run outlives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from core import procs
from core.atropos import HOOKS_DIR, PARENT_VARIABLE, offline_environment
from core.run_folder import tail_lines

log = logging.getLogger(__name__)


REDACTED = b"<the run's key>"


@dataclass
class Child:
    name: str  # "trajectory API" or "environment", for messages
    proc: subprocess.Popen[bytes]
    log_path: Path
    pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def tail(self, lines: int = 25) -> str:
        return "\n".join(tail_lines(self.log_path, lines))

    def describe_exit(self) -> str:
        code = self.proc.poll()
        how = "is running" if code is None else f"ended ({procs.describe_exit(code)})"
        return f"the {self.name} {how}; the last lines of its log ({self.log_path}):\n{self.tail()}"

    def interrupt(self, grace_s: float = 3.0) -> None:
        """SIGINT first (Python unwinds and flushes what it buffered, say a JSON lines file),
        then as `stop`."""
        if self.proc.poll() is None:
            procs.signal_group(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        self.stop()

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to its group, then SIGKILL to what is left after `grace_s`."""
        if self.proc.poll() is None:
            procs.signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("the %s ignored SIGTERM for %ss: SIGKILL", self.name, grace_s)
        # Whatever it started is in its group too.
        procs.signal_group(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.pump is not None:
            self.pump.join(timeout=5)


def atropos_environment(base: Mapping[str, str], **extra: str) -> dict[str, str]:
    """The environment variables of an Atropos process we start: offline, no secrets (`base`
    has none), our watch on the PYTHONPATH."""
    env = offline_environment(base)
    env["PYTHONPATH"] = str(HOOKS_DIR)
    env[PARENT_VARIABLE] = str(os.getpid())
    env.update(extra)
    return env


def start_child(
    name: str,
    argv: list[str],
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    secret: str | None = None,
) -> Child:
    """Start one process, its output into `log_path`; with a `secret` (the run's key, which
    atroposlib prints with its server config) through a pipe that blanks it out."""
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
            name=f"{name}-log",
            daemon=True,
        )
        pump.start()
    log.info("started the %s (pid %s): %s", name, proc.pid, " ".join(argv))
    return Child(name, proc, log_path, pump)


def _copy_blanking(source: IO[bytes], log_path: Path, secret: bytes) -> None:
    with source, log_path.open("ab") as out:
        for line in source:
            out.write(line.replace(secret, REDACTED))
            out.flush()
