"""Small helpers for tests that wait on real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

T = TypeVar("T")
FINISHED = {"succeeded", "failed", "stopped"}
# A real run on the tiny-random model, small enough for a test: LoRA rank 8, 8 new tokens,
# 2 tasks x 4 tries per step, no W&B.
TINY_RUN = {
    "model_name": "tiny-random",
    "lora_rank": 8,
    "max_token_length": 8,
    "use_wandb": False,
    "group_size": 4,
    "batch_size": 2,
}
# A two-step repeat_word run on tiny-random that keeps a checkpoint after each step (LoRA
# rank 4, 4 new tokens, one task x 2 tries per step, no eval, no W&B): an adapter to sample.
SAVING_TINY_RUN = {
    "environment": "repeat_word",
    "model_name": "tiny-random",
    "total_steps": 2,
    "save_every": 1,
    "steps_per_eval": 0,
    "use_wandb": False,
    "group_size": 2,
    "batch_size": 1,
    "max_token_length": 4,
    "lora_rank": 4,
}


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


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: state, ppid, pgrp, session, ...; [] if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def proc_cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces; "" if gone."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = proc_stat(pid)
    return bool(stat) and stat[0] != "Z"


def processes_with(*needles: str | Path, parent: int | None = None) -> list[int]:
    """Live processes whose command line contains every one of `needles` (and whose parent is
    `parent`, when given): a run, worker or inspector found by what it was started with."""
    wanted = [str(n) for n in needles]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        cmdline, stat = proc_cmdline(pid), proc_stat(pid)
        if not cmdline or len(stat) < 2:
            continue
        if all(n in cmdline for n in wanted) and (parent is None or int(stat[1]) == parent):
            found.append(pid)
    return found


def fake_runner_starts(run_dir: Path) -> int:
    """How many times the fake runner started on this run (it says so in the run's log)."""
    log = run_dir / "train.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count(f"fake runner {run_dir.name} up")


def end_run_leftovers(*var_dirs: Path) -> None:
    """SIGKILL the processes fake runs left behind (see run_leftovers)."""
    for pid in run_leftovers(*var_dirs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


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


# These take a TestClient or any httpx.Client (a live server's `api`).


def start_run(client: httpx.Client, **body: object) -> str:
    """POST /runs with `body`; the new run's id."""
    resp = client.post("/runs", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()["run_id"]


def run_of(client: httpx.Client, run_id: str) -> dict:
    """GET /runs/{run_id}."""
    resp = client.get(f"/runs/{run_id}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def finish_run(client: httpx.Client, run_id: str, timeout: float = 120.0) -> dict:
    """The run's status once it has ended."""
    return wait_for(
        lambda: (r := run_of(client, run_id))["status"] in FINISHED and r, timeout, every=0.1
    )


def inference_before_and_after(
    client: httpx.Client, environment: str, run_id: str, num_items: int, timeout: float
) -> list[dict]:
    """POST /test/inference on `num_items` of the environment's own items (8 new tokens), on
    tiny-random, then on the run's adapter (named in the answer only then): both answers."""
    answers = []
    for body in ({"model": "tiny-random"}, {"run_id": run_id}):
        answer = client.post(
            "/test/inference",
            json={"environment": environment, "num_items": num_items, "max_tokens": 8, **body},
            timeout=timeout,
        )
        assert answer.status_code == 200, answer.text
        out = answer.json()
        assert (out["adapter"] is not None) == ("run_id" in body)
        answers.append(out)
    return answers
