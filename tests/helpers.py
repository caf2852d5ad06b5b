"""Small helpers for tests that wait on real processes."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 20.0, every: float = 0.05) -> T:
    """Call `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T = check()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")
        time.sleep(every)
        last = check()
    return last


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def run_leftovers(*var_dirs: Path) -> list[int]:
    """Live processes the fake runner's runs left behind (the `sleep` named in grandchild.pid):
    the supervisor clears a run's group once the run has ended."""
    found = []
    for var_dir in var_dirs:
        for pid_file in (var_dir / "runs").glob("*/grandchild.pid"):
            pid = int(pid_file.read_text())
            if pid_alive(pid):
                found.append(pid)
    return found


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` on `folder`, to fill up; the test is skipped where mount is
    refused (it needs root or CAP_SYS_ADMIN)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        # Lazily if busy, so a failed test never leaves a mount behind for the next.
        if subprocess.run(["umount", str(folder)]).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=True)
