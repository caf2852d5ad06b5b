"""Where a var/ folder's engine host lives and how to reach it: its folder `var/engine/` holds its
record (`host.json`: pid, start time, socket, wire), its lock (held for its whole life: never two
hosts on one var/), its log and, where the path is short enough, its socket.

Whoever needs the host first starts it (the server, or a run whose host died while no server
watched), detached like a run: it outlives its starter and is adopted by the next one through
its record. Starters take turns on `start.lock`, so one starts it and the rest find it running;
the host's own lock keeps one even so (a starter that gave up waiting).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from core import procs
from core.engine_wire import WIRE
from core.run_folder import tail_lines
from core.settings import PROJECT_ROOT, Settings

RECORD = "host.json"
LOCK = "host.lock"
LOG = "host.log"
START_LOCK = "start.lock"
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; a longer path goes under the temp folder


class HostUnavailable(RuntimeError):
    """The engine host could not be started or reached; the message says why."""


@dataclass(frozen=True)
class HostRecord:
    pid: int
    started: float | None  # its kernel start time (procs.process_start_time)
    started_at: float  # epoch seconds
    wire: int
    socket: str

    @property
    def alive(self) -> bool:
        return procs.same_process_alive(self.pid, self.started)


def folder(var_dir: Path) -> Path:
    return var_dir / "engine"


def socket_path(var_dir: Path) -> Path:
    """The host's socket: in its folder, or (a long var/ path) in a private temp folder."""
    path = folder(var_dir) / "host.sock"
    if len(str(path)) <= _SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha256(str(var_dir.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"rlcs-engine-{os.getuid()}" / f"{digest}.sock"


def read_record(var_dir: Path) -> HostRecord | None:
    try:
        values = json.loads((folder(var_dir) / RECORD).read_text())
        return HostRecord(**values)
    except (OSError, ValueError, TypeError):
        return None


def write_record(var_dir: Path, record: HostRecord) -> None:
    path = folder(var_dir) / RECORD
    tmp = path.with_name(f".{RECORD}.{os.getpid()}")
    tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, path)


def running(var_dir: Path) -> HostRecord | None:
    """The live host of `var_dir` that answers on its socket, or None."""
    record = read_record(var_dir)
    if record is None or not record.alive:
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(record.socket)
    except OSError:
        return None
    finally:
        probe.close()
    return record


def ensure(settings: Settings, timeout_s: float = 120.0) -> HostRecord:
    """The running host of this var/ folder, started first if there is none (HostUnavailable
    when it cannot be, saying why: the end of its log)."""
    record = running(settings.var_dir)
    if record is not None:
        return record
    folder(settings.var_dir).mkdir(parents=True, exist_ok=True)
    # One starter at a time: the others wait here, then find the host it started.
    with (folder(settings.var_dir) / START_LOCK).open("a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        return running(settings.var_dir) or _start(settings, timeout_s)


def _start(settings: Settings, timeout_s: float) -> HostRecord:
    log_path = folder(settings.var_dir) / LOG
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [settings.python_executable, "-m", settings.engine_host_module],
            cwd=PROJECT_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=settings.child_environment(),
            start_new_session=True,  # its own session: it outlives whoever started it
            close_fds=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = running(settings.var_dir)
        if record is not None:
            _reap_later(proc)
            return record
        code = proc.poll()
        if code not in (None, 0):
            tail = "\n".join(tail_lines(log_path, 15))
            raise HostUnavailable(
                f"the engine host exited ({procs.describe_exit(code)}) before it listened; "
                f"the end of {log_path}:\n{tail}"
            )
        time.sleep(0.05)  # the host writes its record once it listens: nothing to wait on
    proc.kill()
    raise HostUnavailable(
        f"the engine host did not listen within {timeout_s:.0f} s; see {log_path}"
    )


def wait_gone(record: HostRecord, timeout_s: float = 10.0) -> None:
    """Wait (a moment) for a host that turned a client away as it ended to be gone."""
    deadline = time.monotonic() + timeout_s
    while record.alive and time.monotonic() < deadline:
        time.sleep(0.05)


def stop(var_dir: Path, timeout_s: float = 30.0) -> bool:
    """SIGTERM to the host of `var_dir` and wait for it to end (SIGKILL past `timeout_s`);
    False when none ran."""
    import signal

    record = read_record(var_dir)
    if record is None or not record.alive:
        return False
    procs.signal_group(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while record.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    if record.alive:
        procs.signal_group(record.pid, signal.SIGKILL)
    return True


def _reap_later(proc: subprocess.Popen[bytes]) -> None:
    """Wait for the host in the background while this process lives (no zombie is left when
    it dies first); after that, init does."""
    import threading

    threading.Thread(target=proc.wait, daemon=True, name="engine host reaper").start()


__all__ = ["WIRE", "HostRecord", "HostUnavailable", "ensure", "running", "stop"]
