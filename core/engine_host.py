"""Where a machine's engine hosts live and how to reach them: each host (a `Slot` of
core/engine_slots.py) has its folder `var/engine/<node>/<index>/`, holding its record (`host.json`:
pid, start time, socket, wire), its lock (held for its whole life: never two hosts in one slot),
its log and, where the path is short enough, its socket. The node's name in the path keeps a var/
shared between machines correct: each reads its own hosts.

Whoever needs a host first starts it (the server, a run), detached like a run, pinned to its
slot's GPU: it outlives its starter and is adopted by the next one through its record. Starters
take turns on the slot's `start.lock`, so one starts it and the rest find it running; the
host's own lock keeps one even so. A host of the former layout (one per var/, `var/engine/
host.json`) is stopped before a host of this one starts: never two on one machine's models.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from core import procs
from core.engine_slots import Slot, plan
from core.engine_wire import WIRE
from core.run_folder import tail_lines
from core.settings import PROJECT_ROOT, Settings

RECORD = "host.json"
LOCK = "host.lock"
LOG = "host.log"
START_LOCK = "start.lock"
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; a longer path goes under the temp folder
# What a host's environment holds unless the user set it (benchmarks/README.md, issue 52):
HOST_ENVIRONMENT = {
    # oneDNN keeps a compiled product for each shape it meets (1,024 by default): a host meets
    # a new one with every batch size; its decode steps reuse a few.
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128",
    # glibc raises its mmap threshold as large blocks are freed (up to 32 MiB) and its trim
    # threshold with it (to 64 MiB), and trims a thread arena's top only past that, so every
    # arena a client's thread used kept tens of MB past its runs (malloc_trim never trims
    # those tops). Fixed, they stay at the heights the host reaches anyway (blocks up to 32 MiB
    # from the arenas) and a top past 1 MiB goes back as it frees.
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 20),
}
log = logging.getLogger(__name__)


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


def root(var_dir: Path) -> Path:
    return var_dir / "engine"


def node_folder(var_dir: Path, node: str) -> Path:
    return root(var_dir) / node


def folder(var_dir: Path, slot: Slot) -> Path:
    return node_folder(var_dir, slot.node) / str(slot.index)


def log_path(var_dir: Path, slot: Slot) -> Path:
    return folder(var_dir, slot) / LOG


def socket_path(var_dir: Path, slot: Slot) -> Path:
    """The host's socket: in its folder, or (a long var/ path) in a private temp folder."""
    home = folder(var_dir, slot)
    path = home / "host.sock"
    if len(str(path)) <= _SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"rlcs-engine-{os.getuid()}" / f"{digest}.sock"


def read_record(home: Path) -> HostRecord | None:
    """The record in a host's folder, if one is there and whole."""
    try:
        return HostRecord(**json.loads((home / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_record(home: Path, record: HostRecord) -> None:
    path = home / RECORD
    tmp = path.with_name(f".{RECORD}.{os.getpid()}")
    tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, path)


def answering(record: HostRecord | None) -> HostRecord | None:
    """`record` if its host lives and takes a connection on its socket, else None."""
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


def running(var_dir: Path, slot: Slot | None = None) -> HostRecord | None:
    """The live host of `slot` (None: the first live host of this machine) that answers on its
    socket, or None."""
    if slot is not None:
        return answering(read_record(folder(var_dir, slot)))
    for home in recorded(var_dir):
        found = answering(read_record(home))
        if found is not None:
            return found
    return None


def recorded(var_dir: Path, node: str | None = None) -> list[Path]:
    """The folders of this machine's hosts that hold a record, in slot order."""
    base = node_folder(var_dir, node or socket.gethostname())
    homes = [p.parent for p in base.glob(f"*/{RECORD}") if p.parent.name.isdigit()]
    return sorted(homes, key=lambda home: int(home.name))


def ensure(settings: Settings, slot: Slot | None = None, timeout_s: float = 120.0) -> HostRecord:
    """The running host of `slot` (None: the machine's first), started first if there is none
    (HostUnavailable when it cannot be, saying why: the end of its log)."""
    slot = slot if slot is not None else plan(settings)[0]
    record = running(settings.var_dir, slot)
    if record is not None:
        return record
    home = folder(settings.var_dir, slot)
    home.mkdir(parents=True, exist_ok=True)
    # One starter at a time: the others wait here, then find the host it started.
    with (home / START_LOCK).open("a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        found = running(settings.var_dir, slot)
        if found is not None:
            return found
        retire_former(settings.var_dir)
        return _start(settings, slot, timeout_s)


def _start(settings: Settings, slot: Slot, timeout_s: float) -> HostRecord:
    logfile = log_path(settings.var_dir, slot)
    env = settings.child_environment()
    env["RLCS_ENGINE_SLOT"] = slot.to_json()
    for name, value in HOST_ENVIRONMENT.items():
        env.setdefault(name, value)
    if slot.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot.gpu  # it sees its GPU alone, as "cuda"
    with logfile.open("ab") as out:
        proc = subprocess.Popen(
            [settings.python_executable, "-m", settings.engine_host_module],
            cwd=PROJECT_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own session: it outlives whoever started it
            close_fds=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = running(settings.var_dir, slot)
        if record is not None:
            _reap_later(proc)
            return record
        code = proc.poll()
        if code not in (None, 0):
            tail = "\n".join(tail_lines(logfile, 15))
            raise HostUnavailable(
                f"the engine host {slot.name} exited ({procs.describe_exit(code)}) before it "
                f"listened; the end of {logfile}:\n{tail}"
            )
        time.sleep(0.05)  # the host writes its record once it listens: nothing to wait on
    proc.kill()
    raise HostUnavailable(
        f"the engine host {slot.name} did not listen within {timeout_s:.0f} s; see {logfile}"
    )


def retire_former(var_dir: Path) -> bool:
    """Stop a host of the former layout (one per var/: `var/engine/host.json`), whose clients
    then move to this layout's hosts as after any host's end; True when one ran."""
    former = root(var_dir)
    record = read_record(former)
    if record is None:
        return False
    ran = record.alive
    if ran:
        log.warning("stopping the engine host of the former layout (pid %s)", record.pid)
        _stop(record, 30.0)
    (former / RECORD).unlink(missing_ok=True)
    return ran


def wait_gone(record: HostRecord, timeout_s: float = 10.0) -> None:
    """Wait (a moment) for a host that turned a client away as it ended to be gone."""
    deadline = time.monotonic() + timeout_s
    while record.alive and time.monotonic() < deadline:
        time.sleep(0.05)


def stop(var_dir: Path, slot: Slot | None = None, timeout_s: float = 30.0) -> bool:
    """SIGTERM to the host of `slot` (None: every host of this machine, and one of the former
    layout) and wait for it to end (SIGKILL past `timeout_s`); False when none ran."""
    homes = [folder(var_dir, slot)] if slot is not None else recorded(var_dir)
    stopped = False
    for home in homes:
        record = read_record(home)
        if record is not None and record.alive:
            _stop(record, timeout_s)
            stopped = True
    if slot is None:
        stopped = retire_former(var_dir) or stopped
    return stopped


def _stop(record: HostRecord, timeout_s: float) -> None:
    procs.signal_group(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while record.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    if record.alive:
        procs.signal_group(record.pid, signal.SIGKILL)


def _reap_later(proc: subprocess.Popen[bytes]) -> None:
    """Wait for the host in the background while this process lives (no zombie is left when
    it dies first); after that, init does."""
    import threading

    threading.Thread(target=proc.wait, daemon=True, name="engine host reaper").start()


__all__ = ["WIRE", "HostRecord", "HostUnavailable", "ensure", "running", "stop"]
