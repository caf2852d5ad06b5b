"""The real runner through the real server on tiny-random: success, learning, stop and resume."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fastapi.testclient import TestClient

from server.app import create_app
from tests import test_training
from tests.support.helpers import FINISHED as FINAL
from tests.support.helpers import TINY_RUN as TINY
from tests.support.helpers import finish_run as finish
from tests.support.helpers import start_run as start
from tests.support.helpers import wait_for
from tests.support.settings import make_settings

# The fixtures these tests share with tests/test_training.py, bound here where pytest looks.
tclient = test_training.tclient


def history(tmp_path: Path, client: TestClient, run_id: str) -> list[dict]:
    from core.db import make_engine, read_session
    from core.models import Metric

    engine = make_engine(client.app.state.settings.db_url)
    with read_session(engine) as session:
        rows = session.exec(Metric.__table__.select().where(Metric.run_id == run_id)).all()
    engine.dispose()
    return [{"step": row.step, **json.loads(row.values_json)} for row in rows]


def test_three_step_run_succeeds_with_metrics_and_checkpoints(
    tmp_path: Path, database_url: str
) -> None:
    """On SQLite and on PostgreSQL: the runner records into whichever the server uses."""
    settings = make_settings(tmp_path, stop_grace_s=30.0, database_url=database_url)
    with TestClient(create_app(settings)) as client:
        three_steps(client, tmp_path)


def three_steps(tclient: TestClient, tmp_path: Path) -> None:
    run_id = start(
        tclient,
        environment="arithmetic",
        total_steps=3,
        save_every=2,
        steps_per_eval=2,
        eval_num_tasks=4,
        **TINY,
    )
    run = finish(tclient, run_id)
    logs = "\n".join(tclient.get(f"/runs/{run_id}/logs", params={"tail": 200}).json()["lines"])
    assert run["status"] == "succeeded", logs
    assert run["step"] == 3
    assert run["metrics"]["reward_mean"] is not None
    assert run["metrics"]["percent_correct"] is not None
    assert run["metrics"]["eval_percent_correct"] is not None
    run_dir = tmp_path / "var" / "runs" / run_id
    records = [json.loads(x) for x in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3] and records[-1]["final"] is True
    for record in records:
        assert Path(record["state_path"]).is_dir() and Path(record["sampler_path"]).is_dir()
    assert run["weights_path"] == records[-1]["sampler_path"]
    assert (Path(run["weights_path"]) / "adapter_model.safetensors").exists()
    steps = {row["step"] for row in history(tmp_path, tclient, run_id) if "time/step_s" in row}
    assert steps == {1, 2, 3}
    assert "step 3/3" in logs and "best episode" in logs


def test_learning_is_real_on_repeat_word(tmp_path: Path) -> None:
    """A dense reward a random policy already earns a little of: the second half's mean reward
    must clearly exceed the first steps'. A sign error in the advantages or the loss makes
    the policy move away from rewarded characters and fails this. (A run's rewards wander,
    and some runs take off late: the last 5 of 30 steps failed this about one run in ten.)
    The default sampler (bf16 where the CPU has it, its logits in float32) and the default
    correction: what a user's run gets (benchmarks/README.md, "The sampler-trainer gap")."""
    settings = make_settings(tmp_path, stop_grace_s=30.0)
    with TestClient(create_app(settings)) as tclient:
        _learns(tclient, tmp_path)


def _learns(tclient: TestClient, tmp_path: Path) -> None:
    run_id = start(
        tclient,
        environment="repeat_word",
        total_steps=60,
        learning_rate=0.02,
        seed=1,
        save_every=0,
        steps_per_eval=0,
        **{**TINY, "group_size": 8, "batch_size": 4},
    )
    run = finish(tclient, run_id, timeout=150)
    assert run["status"] == "succeeded", run["error"]
    rows = sorted(
        (r for r in history(tmp_path, tclient, run_id) if "reward/mean" in r),
        key=lambda r: r["step"],
    )
    first = sum(r["reward/mean"] for r in rows[:5]) / 5
    last = sum(r["reward/mean"] for r in rows[30:]) / len(rows[30:])
    assert last > 2 * first and last - first > 0.03, (first, last)


def test_sigterm_leaves_a_checkpoint_and_resume_continues(tclient: TestClient) -> None:
    run_id = start(
        tclient,
        environment="repeat_word",
        total_steps=10_000,
        save_every=0,
        steps_per_eval=0,
        **TINY,
    )
    wait_for(lambda: tclient.get(f"/runs/{run_id}").json()["step"] >= 3, 60)
    assert tclient.post(f"/runs/{run_id}/resume").status_code == 409  # still running
    tclient.post(f"/runs/{run_id}/stop")
    stopped = finish(tclient, run_id)
    assert stopped["status"] == "stopped", stopped
    at = stopped["step"]
    assert "resumable" in stopped["details"]

    refused = tclient.post(f"/runs/{run_id}/resume", json={"total_steps": at + 2})
    assert refused.status_code == 409 and "force" in refused.json()["detail"]
    resumed = tclient.post(f"/runs/{run_id}/resume", json={"total_steps": at + 2, "force": True})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["resume_step"] == at and resumed.json()["attempt"] == 2
    done = finish(tclient, run_id)
    assert done["status"] == "succeeded", done
    assert done["step"] == at + 2 and done["attempt"] == 2
    logs = "\n".join(tclient.get(f"/runs/{run_id}/logs", params={"tail": 400}).json()["lines"])
    assert "resuming from" in logs and f"step {at + 1}/{at + 2}" in logs


def test_wandb_offline_run_is_written(tclient: TestClient, tmp_path: Path) -> None:
    run_id = start(
        tclient,
        environment="arithmetic",
        total_steps=1,
        save_every=0,
        steps_per_eval=0,
        **{**TINY, "use_wandb": True, "wandb_project": "t"},
    )
    run = finish(tclient, run_id)
    assert run["status"] == "succeeded", run["error"]
    wandb_dir = tmp_path / "var" / "runs" / run_id / "wandb"
    assert any(p.name.startswith("offline-run-") for p in wandb_dir.iterdir())
    assert run["wandb_url"] is None  # offline: nothing to link to


def test_two_environment_run_logs_both_sets_of_metrics(tclient: TestClient, tmp_path: Path) -> None:
    mix = {"repeat_word": {"weight": 1.0, "num_rollouts": 2}}
    bad = tclient.post(
        "/runs", json={"environment": "arithmetic", "environments": {"repeat_wrd": {}}}
    )
    assert bad.status_code == 422 and "repeat_word" in bad.json()["detail"]
    run_id = start(
        tclient,
        environment="arithmetic",
        environments=mix,
        total_steps=1,
        save_every=0,
        steps_per_eval=1,
        eval_num_tasks=2,
        **{**TINY, "batch_size": 4},
    )
    run = finish(tclient, run_id)
    assert run["status"] == "succeeded", run["error"]
    rows = history(tmp_path, tclient, run_id)
    keys = set().union(*rows)
    for name in ("arithmetic", "repeat_word"):
        assert f"env/{name}/reward_mean" in keys and f"env/{name}/percent_correct" in keys
        assert f"eval/{name}/percent_correct" in keys
    step = next(r for r in rows if "env/num_episodes" in r)
    # Four groups alternate: arithmetic groups of 4 episodes, repeat_word groups of 2.
    assert step["env/arithmetic/num_episodes"] == 8 and step["env/repeat_word/num_episodes"] == 4


def test_status_while_running_shows_rising_step(tclient: TestClient) -> None:
    run_id = start(
        tclient, environment="arithmetic", total_steps=8, save_every=0, steps_per_eval=0, **TINY
    )
    seen: list[int] = []
    while (run := tclient.get(f"/runs/{run_id}").json())["status"] not in FINAL:
        if run["status"] == "running":
            seen.append(run["step"])
            assert run["progress"]["fraction"] == round(run["step"] / 8, 4)
        time.sleep(0.05)
    assert run["status"] == "succeeded"
    assert seen == sorted(seen) and len(set(seen)) >= 3, seen
    assert run["progress"]["time_per_step_s"] > 0


def test_a_stop_through_the_database_reaches_a_runner_no_signal_reaches(tmp_path: Path) -> None:
    """A runner the server cannot signal (on another machine; here SIGTERM is blocked) stops
    at the stop request it reads from the database: checkpoint, then `stopped`."""
    settings = make_settings(
        tmp_path, runner_module="tests.support.fake_runners.deaf_runner", stop_grace_s=300.0
    )
    with TestClient(create_app(settings)) as client:
        run_id = start(client, environment="repeat_word", total_steps=200, save_every=0, **TINY)
        wait_for(lambda: client.get(f"/runs/{run_id}").json()["step"] >= 1, 120, every=0.25)
        assert client.post(f"/runs/{run_id}/stop").json()["status"] == "stopping"
        run = finish(client, run_id, 60)  # well inside the 300-s grace: no SIGKILL came
        assert run["status"] == "stopped" and run["step"] < 200, run
        logs = "\n".join(client.get(f"/runs/{run_id}/logs", params={"tail": 50}).json()["lines"])
        assert "a stop was requested through the database" in logs
        checkpoints = client.get(f"/runs/{run_id}/checkpoints").json()
        assert checkpoints and checkpoints[-1]["step"] == run["step"]
