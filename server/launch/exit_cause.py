"""Why a runner's process ended when it recorded no end itself. A SIGKILL the supervisor did not
send is put down to the kernel's out-of-memory killer when the kernel says so (its log names the
process, or its oom_kill counters rose while the run lived); otherwise it stays a plain kill."""

from __future__ import annotations

import errno
import os
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CGROUP_FS = Path("/sys/fs/cgroup")
KMSG = Path("/dev/kmsg")
# Clocks of /proc/<pid>/stat and /dev/kmsg may drift apart a little (both count from boot).
_CLOCK_SLACK_S = 2.0
_MAX_KMSG_RECORDS = 100_000
_VICTIM = (re.compile(r"Killed process (\d+)"), re.compile(r"oom-kill:.*?\bpid=(\d+)"))


@dataclass(frozen=True)
class OomCounters:
    """oom_kill counts of this process's memory cgroup (v2 memory.events, v1 memory.oom_control)
    and of the machine (/proc/vmstat); None where this machine does not let us read one."""

    cgroup: int | None = None
    machine: int | None = None


def read_counters(proc: Path = PROC, cgroup_fs: Path = CGROUP_FS) -> OomCounters:
    """The counters now. The runner lives in the server's cgroup, so ours are its."""
    return OomCounters(_cgroup_oom_kills(proc, cgroup_fs), _field(proc / "vmstat", "oom_kill"))


def oom_evidence(
    before: OomCounters | None, after: OomCounters, pid: int, victims: set[int] | None
) -> str | None:
    """What says the OOM killer ended `pid`, or None. `victims`: the pids the kernel log says it
    killed since the process started (None: the log is not readable here)."""
    if victims is not None:
        if pid in victims:
            return "the kernel log names it as an out-of-memory kill"
        if victims:
            return None  # its victims meanwhile were other processes
    if before is None:
        return None
    if before.cgroup is not None and after.cgroup is not None:
        # The kernel counts a kill in the victim's cgroup (ours) whatever ran out, so where we
        # can read it, it decides; the machine's count also has other cgroups' kills.
        if after.cgroup > before.cgroup:
            return f"its memory cgroup's oom_kill count rose from {before.cgroup} to {after.cgroup}"
        return None
    if before.machine is not None and after.machine is not None and after.machine > before.machine:
        # No cgroup count here: the machine's is the next best (a container may see the host's).
        return f"the machine's oom_kill count rose from {before.machine} to {after.machine}"
    return None


def sigkill_evidence(pid: int, start_ticks: float | None, before: OomCounters | None) -> str | None:
    """oom_evidence for a runner found killed by SIGKILL now (reads the counters and the log)."""
    since = start_ticks / os.sysconf("SC_CLK_TCK") if start_ticks is not None else None
    return oom_evidence(before, read_counters(), pid, kernel_oom_victims(since))


def classify_exit(returncode: int, how: str, oom: str | None) -> tuple[str, str]:
    """The failure kind and reason of a runner that exited without recording an end."""
    if returncode == -signal.SIGKILL and oom:
        return "oom", (
            f"the kernel's out-of-memory killer ended the runner ({how}; {oom}). It needed more "
            "memory than this machine or container allows: lower batch_size, group_size or "
            "max_token_length, use a smaller model, or run fewer runs at once, then resume it "
            "from its last checkpoint"
        )
    if returncode < 0:
        return "killed", f"the runner was {how}"
    if returncode == 0:
        return "no_end", "the runner exited 0 without recording an end"
    return "crash", f"the runner crashed ({how})"


def kernel_oom_victims(since_s: float | None, kmsg: Path = KMSG) -> set[int] | None:
    """Pids the kernel log says the OOM killer killed at or after `since_s` (seconds since
    boot); None where the log cannot be read (most containers)."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records: list[str] = []
    try:
        for _ in range(_MAX_KMSG_RECORDS):  # /dev/kmsg hands out one record per read
            try:
                raw = os.read(fd, 16384)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten while we read; go on with the next
                return None
            if not raw:
                break
            records.append(raw.decode("utf-8", errors="replace"))
    finally:
        os.close(fd)
    return parse_victims(records, since_s)


def parse_victims(records: Iterable[str], since_s: float | None) -> set[int]:
    """OOM victims in /dev/kmsg records (`prio,seq,usec,flags;message`) from `since_s` on."""
    victims: set[int] = set()
    for record in records:
        header, _, message = record.partition(";")
        fields = header.split(",")
        try:
            at = int(fields[2]) / 1e6
        except (IndexError, ValueError):
            continue
        if since_s is not None and at < since_s - _CLOCK_SLACK_S:
            continue
        for pattern in _VICTIM:
            victims.update(int(m) for m in pattern.findall(message))
    return victims


def _cgroup_oom_kills(proc: Path, cgroup_fs: Path) -> int | None:
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        relative = path.strip().lstrip("/")
        if controllers == "":  # cgroup v2 (alone, or beside v1 as `unified`)
            files = [cgroup_fs / relative / "memory.events"]
            files.append(cgroup_fs / "unified" / relative / "memory.events")
        elif "memory" in controllers.split(","):
            files = [cgroup_fs / "memory" / relative / "memory.oom_control"]
        else:
            continue
        for file in files:
            value = _field(file, "oom_kill")
            if value is not None:
                return value
    return None


def _field(path: Path, key: str) -> int | None:
    """The number after `key` on its line of a `key value` file, or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None
