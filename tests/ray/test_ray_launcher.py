"""RLCS_LAUNCHER=ray against a real Ray head on loopback (tests/support/ray_head.py) and a real
PostgreSQL: a tiny-random run goes through Ray with metrics and checkpoints, a stop ends it
`stopped` with a checkpoint, a server killed mid-run adopts its job on restart, a run asking
for GPUs the cluster lacks waits queued saying why, and an unreachable Ray leaves runs queued
with /health saying so. Skipped, saying why, where the ray extra is not installed."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core import schema
from core.db import make_engine, read_session, write_session
from core.models import Run, RunStatus
from core.settings import Settings
from server.launch.ray import RayLauncher
from server.launch.ray_jobs import RayJobs
from tests.support.helpers import TINY_RUN, finish_run, processes_with, run_of, start_run, wait_for
from tests.support.live_server import LiveServer, free_port
from tests.support.ray_head import RayHead, missing_reason

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))

SECRET = "wandb-key-that-must-not-leak-0123456789"


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    head = RayHead().start()
    yield head
    head.stop()


def ray_server(var: Path, head_address: str, database_url: str, **env: str) -> LiveServer:
    return LiveServer(
        var,
        RLCS_LAUNCHER="ray",
        RLCS_RAY_ADDRESS=head_address,
        RLCS_DATABASE_URL=database_url,
        RLCS_CHECKPOINT_DIR=str(var.parent / "shared"),
        RLCS_STOP_GRACE_S="30",
        **env,
    )


def get_run(server: LiveServer, run_id: str) -> dict:
    return run_of(server.api, run_id)


def log_text(server: LiveServer, run_id: str) -> str:
    resp = httpx.get(f"{server.url}/runs/{run_id}/logs", params={"tail": 500}, timeout=30)
    return "\n".join(resp.json()["lines"])


def test_a_run_goes_through_ray_and_postgresql(
    tmp_path: Path, ray_head: RayHead, postgres_url: str
) -> None:
    server = ray_server(tmp_path / "var", ray_head.address, postgres_url, WANDB_API_KEY=SECRET)
    with server:
        health = httpx.get(f"{server.url}/health", timeout=10).json()
        assert health["launcher"] == {
            "kind": "ray",
            "address": ray_head.address,
            "reachable": True,
            "reason": None,
        }
        run_id = start_run(
            server.api, environment="arithmetic", total_steps=3, save_every=2, **TINY_RUN
        )
        run = finish_run(server.api, run_id, 180)
        logs = log_text(server, run_id)
        assert run["status"] == "succeeded", (run, logs)
        assert run["step"] == 3 and run["metrics"]["reward_mean"] is not None
        # The runner's output is Ray's job log; our endpoint reads it from there.
        assert "step 3/3" in logs and "run succeeded at step 3" in logs
        followed = httpx.get(
            f"{server.url}/runs/{run_id}/logs",
            params={"follow": "true", "tail": 3},
            timeout=30,
        ).text
        assert "run succeeded at step 3" in followed and "event: end" in followed
        checkpoints = httpx.get(f"{server.url}/runs/{run_id}/checkpoints", timeout=10).json()
        assert [c["step"] for c in checkpoints if c["kind"] == "state"] == [2, 3]
        # Checkpoints went to RLCS_CHECKPOINT_DIR, the path every node would share.
        shared = tmp_path / "shared" / run_id
        assert Path(run["weights_path"]).is_relative_to(shared)
        assert (Path(run["weights_path"]) / "adapter_model.safetensors").exists()
    # One Ray job, named by the run id; the key reached it through env_vars only.
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(ray_head.address)
    # The runner records its end, then exits: Ray sees the job end a moment later.
    info = wait_for(lambda: (i := jobs.get_job_info(run_id)).status.is_terminal() and i, 30)
    assert info.status.value == "SUCCEEDED" and info.submission_id == run_id
    assert [j.submission_id for j in jobs.list_jobs()].count(run_id) == 1
    assert SECRET not in str(info.metadata) and SECRET not in info.entrypoint
    assert info.metadata["rlcs_run_id"] == run_id
    assert not processes_with(shared)


def test_two_runs_on_one_node_share_its_engine_host(
    tmp_path: Path, ray_head: RayHead, postgres_url: str
) -> None:
    """Each node has one engine host (under the runs' var folder there, started by the first
    run that needs it): two Ray jobs on this one node train on the same host."""
    with ray_server(tmp_path / "var", ray_head.address, postgres_url) as server:
        runs = [
            start_run(server.api, environment="arithmetic", total_steps=300, seed=i, **TINY_RUN)
            for i in range(2)
        ]
        try:

            def both_attached() -> dict | None:
                (host,) = server.api.get("/engine").json()["hosts"]
                names = {c["client"] for c in host["clients"]}
                # A client says hello before its base is loaded: wait for both.
                attached = {f"run {r}" for r in runs} <= names and host["bases"]
                return host if attached else None

            host = wait_for(both_attached, 180, every=0.5)
            assert host["running"] and [b["name"] for b in host["bases"]] == ["tiny-random"]
        finally:
            for run_id in runs:
                server.api.post(f"/runs/{run_id}/stop")
            for run_id in runs:
                assert finish_run(server.api, run_id, 180)["status"] in ("stopped", "succeeded")


def test_stop_ends_stopped_with_a_checkpoint_and_resume_is_a_new_job(
    tmp_path: Path, ray_head: RayHead, postgres_url: str
) -> None:
    with ray_server(tmp_path / "var", ray_head.address, postgres_url) as server:
        run_id = start_run(
            server.api, environment="repeat_word", total_steps=500, save_every=0, **TINY_RUN
        )
        wait_for(lambda: get_run(server, run_id)["step"] >= 1, 120, every=0.5)
        resp = httpx.post(f"{server.url}/runs/{run_id}/stop", timeout=10)
        assert resp.json()["status"] == "stopping"
        run = finish_run(server.api, run_id, 60)
        assert run["status"] == "stopped" and run["step"] < 500, run
        checkpoints = httpx.get(f"{server.url}/runs/{run_id}/checkpoints", timeout=10).json()
        assert checkpoints and checkpoints[-1]["step"] == run["step"]
        assert "a stop was requested through the database" in log_text(server, run_id)
        # A resume is a second attempt: a new job, carrying the resume point with it.
        stopped_at = run["step"]
        resp = httpx.post(
            f"{server.url}/runs/{run_id}/resume",
            json={"total_steps": stopped_at + 2, "force": True},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        run = finish_run(server.api, run_id, 180)
        assert run["status"] == "succeeded" and run["step"] == stopped_at + 2, run
        assert "resuming from" in log_text(server, run_id)
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(ray_head.address)
    for job_id in (run_id, f"{run_id}-2"):
        wait_for(lambda j=job_id: jobs.get_job_info(j).status.is_terminal(), 30, every=0.5)
    wait_for(lambda: not processes_with(tmp_path / "shared" / run_id), 10)


def test_a_server_killed_mid_run_adopts_its_ray_jobs(
    tmp_path: Path, ray_head: RayHead, postgres_url: str
) -> None:
    """Kill -9 the server mid-run; while it is down one job goes on and the other's runner is
    killed. Started again, the server adopts the first and records the second's end from Ray."""
    var = tmp_path / "var"
    first = ray_server(var, ray_head.address, postgres_url).start()
    try:
        body = {"environment": "repeat_word", "save_every": 0, **TINY_RUN}
        going, killed = (
            start_run(first.api, total_steps=40, **body),
            start_run(first.api, total_steps=500, **body),
        )
        for run_id in (going, killed):
            wait_for(lambda r=run_id: get_run(first, r)["step"] >= 1, 120, every=0.5)
    finally:
        first.kill(signal.SIGKILL)
    for pid in processes_with("runners.train", tmp_path / "shared" / killed):
        os.kill(pid, signal.SIGKILL)
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(ray_head.address)
    wait_for(lambda: jobs.get_job_info(killed).status.value == "FAILED", 30, every=0.5)
    with ray_server(var, ray_head.address, postgres_url) as second:
        run = finish_run(second.api, killed, 30)
        assert run["status"] == "failed" and run["failure_kind"] == "killed", run
        assert f"its Ray job {killed} ended FAILED" in run["error"]
        assert get_run(second, going)["status"] in ("running", "succeeded")
        run = finish_run(second.api, going, 180)
        assert run["status"] == "succeeded" and run["step"] == 40, run


def test_more_gpus_than_the_cluster_has_waits_queued_saying_why(
    tmp_path: Path, ray_head: RayHead, postgres_url: str
) -> None:
    with ray_server(
        tmp_path / "var", ray_head.address, postgres_url, RLCS_MAX_CONCURRENT_RUNS="1"
    ) as server:
        big = start_run(server.api, environment="arithmetic", num_gpus=1, **TINY_RUN)
        run = wait_for(
            lambda: "asks for 1 GPU" in ((r := get_run(server, big))["details"] or "") and r,
            60,
            every=0.5,
        )
        assert run["status"] == "queued"
        assert "the cluster has 0 in all" in run["details"] and "Ray says" in run["details"]
        # It holds the one slot: the next run waits for it, and says so.
        after = start_run(server.api, environment="arithmetic", **TINY_RUN)
        assert "waiting for a slot" in get_run(server, after)["details"]
        assert httpx.post(f"{server.url}/runs/{after}/stop", timeout=10).status_code == 200
        # Stopped before it started: it ends at once, and Ray is asked to stop the job.
        httpx.post(f"{server.url}/runs/{big}/stop", timeout=10)
        run = finish_run(server.api, big, 30)
        assert run["status"] == "stopped" and "was PENDING" in run["details"], run
    from ray.job_submission import JobSubmissionClient

    assert JobSubmissionClient(ray_head.address).get_job_info(big).status.value != "RUNNING"


def test_a_job_ray_does_not_have_is_lost(
    tmp_path: Path, ray_head: RayHead, postgres_url: str
) -> None:
    """Only when Ray has no such job: an unfinished Ray run is recorded `lost`."""
    settings = Settings(
        var_dir=tmp_path, database_url=postgres_url, launcher="ray", ray_address=ray_head.address
    )
    engine = make_engine(settings.db_url)
    schema.upgrade(engine)
    with write_session(engine) as session:
        session.add(
            Run(
                id="r-0dead0ff",
                environment="arithmetic",
                status=RunStatus.running,
                config_json="{}",
                config_hash="h",
                run_dir=str(tmp_path / "r-0dead0ff"),
                launcher="ray",
                job_id="r-0dead0ff",
            )
        )
    with read_session(engine) as session:
        run = session.get(Run, "r-0dead0ff")
    assert run is not None
    RayLauncher(settings, engine, RayJobs(settings)).watch([run])
    with read_session(engine) as session:
        run = session.get(Run, "r-0dead0ff")
    assert run is not None and run.status == RunStatus.failed and run.failure_kind == "lost"
    assert "Ray has no job r-0dead0ff" in (run.details or "")
    engine.dispose()


def test_an_unreachable_ray_leaves_runs_queued_and_health_says_so(
    tmp_path: Path, postgres_url: str
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    with ray_server(tmp_path / "var", nowhere, postgres_url) as server:
        launcher = httpx.get(f"{server.url}/health", timeout=30).json()["launcher"]
        assert launcher["reachable"] is False and nowhere in launcher["reason"]
        run_id = start_run(server.api, environment="arithmetic", **TINY_RUN)
        run = wait_for(
            lambda: (
                "waiting for the Ray cluster" in ((r := get_run(server, run_id))["details"] or "")
                and r
            ),
            30,
        )
        assert run["status"] == "queued" and nowhere in run["details"]
