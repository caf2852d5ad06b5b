"""A runner the kernel's OOM killer ended is reported as `failure_kind: oom`: the evidence (kill
counters, kernel log) from injected readings, the supervisor's use of it, and a real OOM kill
where this machine lets a test make a memory cgroup."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.launch import exit_cause
from server.launch.exit_cause import OomCounters, classify_exit, oom_evidence
from tests.support.helpers import wait_for
from tests.support.settings import make_settings

FINAL = {"succeeded", "failed", "stopped"}
PID = 4321


@pytest.mark.parametrize(
    ("before", "after", "victims", "says"),
    [
        (OomCounters(3, 10), OomCounters(4, 11), None, "memory cgroup's oom_kill count rose"),
        # The cgroup count is ours and did not move: the machine's rose for someone else.
        (OomCounters(3, 10), OomCounters(3, 11), None, None),
        (OomCounters(None, 10), OomCounters(None, 11), None, "machine's oom_kill count rose"),
        (OomCounters(None, None), OomCounters(None, None), None, None),
        (None, OomCounters(4, 11), None, None),  # adopted after a restart: no reading at spawn
        (None, OomCounters(), {PID, 99}, "kernel log names it"),
        # The kernel log is readable and names only others: the counters' rise was theirs.
        (OomCounters(3, 10), OomCounters(4, 11), {99}, None),
        (OomCounters(3, 10), OomCounters(4, 11), set(), "memory cgroup's"),
    ],
)
def test_oom_evidence_from_counters_and_kernel_log(
    before: OomCounters | None, after: OomCounters, victims: set[int] | None, says: str | None
) -> None:
    evidence = oom_evidence(before, after, PID, victims)
    assert (evidence is None) if says is None else (says in (evidence or "")), evidence


def test_only_a_sigkill_with_evidence_is_an_oom() -> None:
    kind, reason = classify_exit(-9, "killed by SIGKILL (9)", "its cgroup's count rose")
    assert kind == "oom"
    assert "out-of-memory" in reason and "its cgroup's count rose" in reason
    assert "batch_size" in reason and "resume" in reason
    assert classify_exit(-9, "killed by SIGKILL (9)", None) == (
        "killed",
        "the runner was killed by SIGKILL (9)",
    )
    assert classify_exit(-15, "killed by SIGTERM (15)", "rose")[0] == "killed"
    assert classify_exit(0, "exit code 0", None)[0] == "no_end"
    assert classify_exit(3, "exit code 3", None)[0] == "crash"


def test_counters_are_read_from_cgroup_v1_v2_and_vmstat(tmp_path: Path) -> None:
    proc, fs = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "vmstat").write_text("pgfault 12\noom_kill 7\n")
    (proc / "self" / "cgroup").write_text("4:memory:/box/one\n0::/\n")
    (fs / "memory" / "box" / "one").mkdir(parents=True)
    (fs / "memory" / "box" / "one" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    )
    assert exit_cause.read_counters(proc, fs) == OomCounters(cgroup=2, machine=7)

    (proc / "self" / "cgroup").write_text("0::/box/two\n")
    (fs / "box" / "two").mkdir(parents=True)
    (fs / "box" / "two" / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n")
    assert exit_cause.read_counters(proc, fs) == OomCounters(cgroup=1, machine=7)

    (proc / "vmstat").unlink()
    (proc / "self" / "cgroup").write_text("0::/elsewhere\n")
    assert exit_cause.read_counters(proc, fs) == OomCounters(None, None)


def test_kernel_log_records_name_the_victims() -> None:
    records = [
        "6,900,1000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=111,uid=0",
        "3,901,1000001,-;Memory cgroup out of memory: Killed process 111 (python) total-vm:1kB",
        "3,950,9000000,-;Out of memory: Killed process 222 (python) total-vm:1kB",
        "garbage without a header",
    ]
    assert exit_cause.parse_victims(records, None) == {111, 222}
    assert exit_cause.parse_victims(records, since_s=8.0) == {222}


# ----- through the supervisor -------------------------------------------------------------


@pytest.fixture
def fake_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("FAKE_RUNNER_STEP_S", "0.5")
    monkeypatch.delenv("FAKE_RUNNER_MODE", raising=False)
    settings = make_settings(tmp_path, runner_module="tests.support.fake_runners.runner")
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.mark.parametrize("oom_killed", [True, False])
def test_a_sigkill_nobody_sent_is_an_oom_only_with_evidence(
    fake_client: TestClient, monkeypatch: pytest.MonkeyPatch, oom_killed: bool
) -> None:
    readings = iter([OomCounters(cgroup=5), OomCounters(cgroup=6 if oom_killed else 5)])
    monkeypatch.setattr(exit_cause, "read_counters", lambda: next(readings))
    monkeypatch.setattr(exit_cause, "kernel_oom_victims", lambda since_s: None)
    resp = fake_client.post("/runs", json={"environment": "arithmetic", "total_steps": 100})
    run_id = resp.json()["run_id"]
    running = wait_for(lambda: (r := fake_client.get(f"/runs/{run_id}").json())["step"] >= 1 and r)
    os.kill(running["pid"], signal.SIGKILL)  # as the OOM killer would
    run = wait_for(
        lambda: (r := fake_client.get(f"/runs/{run_id}").json())["status"] in FINAL and r
    )
    assert run["status"] == "failed", run
    if oom_killed:
        assert run["failure_kind"] == "oom", run
        assert "out-of-memory killer" in run["error"] and "rose from 5 to 6" in run["error"]
    else:
        assert run["failure_kind"] == "killed" and "SIGKILL" in run["error"], run


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A v1 memory cgroup below ours with a 64 MiB limit; skipped where one cannot be made."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    ours = next((line.split(":", 2)[2] for line in lines if ":memory:" in line), None)
    if ours is None:
        pytest.skip("no cgroup v1 memory controller here to make a small cgroup in")
    if exit_cause.kernel_oom_victims(None) is None and exit_cause.read_counters().machine is None:
        pytest.skip("neither the kernel log nor /proc/vmstat is readable here")
    group = Path("/sys/fs/cgroup/memory") / ours.lstrip("/") / f"rlcs-oom-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(64 << 20))
    except OSError as exc:
        if group.exists():
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        yield group
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 30)
        group.rmdir()


def test_a_real_oom_kill_is_reported_as_oom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_cgroup: Path
) -> None:
    monkeypatch.setenv("FAKE_OOM_CGROUP", str(memory_cgroup))
    settings = make_settings(tmp_path, runner_module="tests.support.fake_runners.oom_runner")
    with TestClient(create_app(settings)) as client:
        run_id = client.post("/runs", json={"environment": "arithmetic"}).json()["run_id"]
        run = wait_for(
            lambda: (r := client.get(f"/runs/{run_id}").json())["status"] in FINAL and r, 60
        )
        if (settings.runs_dir / run_id / "survived").exists():
            pytest.skip("the cgroup's memory limit was not enforced here")
        assert run["status"] == "failed" and run["failure_kind"] == "oom", run
        assert "out-of-memory killer" in run["error"], run
