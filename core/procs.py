"""Process facts and signals by pid, checked against the kernel start time.

A pid alone can be reused after a process dies; pid + start time names one process, so a
restarted server never adopts or signals a stranger. Signals go to process groups, never names.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

# A child that must end with its parent learns the parent's pid from this variable: if the
# parent died before the child looked, os.getppid() would already name another process.
PARENT_PID_VARIABLE = "RLCS_PARENT_PID"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 on (state, ...), or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses; the fields after the last ')' are fixed.
    return raw.rsplit(")", 1)[-1].split()


def process_start_time(pid: int) -> float | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None if unknown."""
    return _start_of(_stat_fields(pid))


def _start_of(fields: list[str] | None) -> float | None:
    try:
        return float(fields[19]) if fields else None  # field 22 overall: starttime
    except (IndexError, ValueError):
        return None


def same_process_alive(pid: int, start: float | None) -> bool:
    """True when `pid` runs (not a zombie) and, where the kernel tells, started at `start`."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else: the start time check below decides
    fields = _stat_fields(pid)
    if fields is not None and fields[0] == "Z":
        return False
    now_start = _start_of(fields)
    return start is None or now_start is None or now_start == start


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to the process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def end_session_leftovers(sid: int, started: float | None) -> list[int]:
    """SIGKILL what is left of a run's session after its leader (pid `sid`) ended: processes
    of that session started no earlier than it. A run's own group is signalled by the server
    that started it; this is for runs adopted after a restart, whose group no one reaps."""
    return end_sessions_leftovers({sid: (started, None)})


def end_sessions_leftovers(sessions: dict[int, tuple[float | None, float | None]]) -> list[int]:
    """`end_session_leftovers` for several ended sessions in one pass over /proc: each maps a
    leader's pid to (its start, the latest start a leftover of it may have) in clock ticks;
    a process of that session started outside that span is not the run's (the pid was reused)."""
    ended = {}
    for sid, span in sessions.items():
        leader = _stat_fields(sid)
        if leader is None or leader[0] == "Z":  # alive: a new session, not the run's
            ended[sid] = span
    killed: list[int] = []
    if not ended:
        return killed
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # After the state: ppid, pgrp, session (fields 4-6 overall).
        if fields is None or len(fields) < 20 or not fields[3].isdigit():
            continue
        found = ended.get(int(fields[3]))
        if found is None:
            continue
        start, (first, last) = _start_of(fields), found
        if start is not None and (
            (first is not None and start < first) or (last is not None and start > last)
        ):
            continue  # another process that happens to share the number: not the run's
        try:
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
        except ProcessLookupError:
            pass
    return killed


def ticks_at(moment: float) -> float | None:
    """A wall-clock time (epoch seconds) in the clock ticks since boot that process start
    times are counted in (Linux /proc), or None when the boot time cannot be read."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return (moment - int(line.split()[1])) * os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    return None


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} ({-returncode})"
    return f"exit code {returncode}"
