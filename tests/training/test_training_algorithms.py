"""Each algorithm knob end to end through POST /runs on tiny-random (the real server and
runner): sampling ahead of training (with a stop mid-flight and a resume), a KL penalty to the
base model, gspo, stable_reinforce, a teacher that is another run's checkpoint; and
max_steps_off_policy 0 giving the synchronous loop's numbers (its tokens exactly, in float32)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import TINY_RUN as TINY
from tests.support.helpers import finish_run as finish
from tests.support.helpers import start_run as start
from tests.support.helpers import wait_for
from tests.support.settings import make_settings

QUIET = {**TINY, "steps_per_eval": 0, "save_every": 0}


@pytest.fixture
def tclient(tmp_path: Path):
    # A float32 sampler: a bf16 row's logprobs move with the number of rows it decodes beside
    # (the CPU's kernels differ by batch size), and which episodes share a step is timing.
    settings = make_settings(tmp_path, stop_grace_s=30.0, sampling_dtype="float32")
    with TestClient(create_app(settings)) as c:
        yield c


def history(client: TestClient, run_id: str) -> dict[int, dict]:
    rows = client.get(f"/runs/{run_id}/history").json()["rows"]
    return {row["step"]: row for row in rows if "time/step_s" in row}


def succeeded(client: TestClient, run_id: str) -> dict:
    run = finish(client, run_id, timeout=180)
    logs = "\n".join(client.get(f"/runs/{run_id}/logs", params={"tail": 80}).json()["lines"])
    assert run["status"] == "succeeded", logs
    return run


def test_bound_zero_gives_the_synchronous_loops_numbers(tclient: TestClient, tmp_path: Path):
    """The runner at max_steps_off_policy 0 (its producer and queue) against the loop as it
    was, written out here from the same parts: a snapshot of the weights, the step's episodes,
    advantages, forward_backward + optim_step, step after step, on the same seed."""
    run_id = start(tclient, environment="repeat_word", total_steps=3, seed=7, **QUIET)
    assert succeeded(tclient, run_id)["step"] == 3
    got = history(tclient, run_id)
    expected = asyncio.run(synchronous_loop(tclient, tmp_path, run_id, steps=3))
    assert any(loss is not None for loss, _ in expected.values())  # something trained
    for step, (loss_sum, reward) in expected.items():
        # Even in float32 a product of one row rounds apart from one of several (gemv and
        # gemm): the last bits of a logprob, never a sampled token here. The loss is a sum of
        # O(1) terms whose advantages cancel (near 1e-7): its rounding is absolute.
        assert got[step].get("train/loss_sum") == pytest.approx(loss_sum, rel=1e-5, abs=1e-5), step
        assert got[step]["reward/mean"] == reward, step
        assert "sampler/steps_off_policy" not in got[step]  # a synchronous run: not recorded


async def synchronous_loop(
    client: TestClient, tmp_path: Path, run_id: str, steps: int
) -> dict[int, tuple[float | None, float]]:
    from core.db import make_engine
    from core.run_folder import RunFolder
    from runners.backends.factory import create_service
    from runners.episodes.collection import Collector, concurrency_for
    from runners.episodes.render import Renderer
    from runners.episodes.rollouts import mean_return
    from runners.models.loading import load_tokenizer
    from runners.train.learner import assign_advantages, train_on
    from runners.train.loop import Trainer, sequences_of

    settings = client.app.state.settings
    folder = RunFolder(tmp_path / "var" / "runs" / run_id)
    engine = make_engine(settings.db_url)
    trainer = Trainer(settings, folder, folder.spec(), engine)  # for its seeds and policy
    cfg = trainer.config
    service = create_service("local", settings, tmp_path / "reference-checkpoints")
    tokenizer = load_tokenizer(cfg.model_name, settings.models_dir)
    renderer = Renderer(tokenizer, cfg.prompt_template, cfg.system_prompt)
    collector = Collector(trainer.sources, renderer, concurrency_for(cfg, "local"))
    adam = __import__("tinker").types.AdamParams(
        learning_rate=cfg.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8
    )
    out = {}
    try:
        training = await service.create_lora_training_client(
            base_model=cfg.model_name, rank=cfg.lora_rank, seed=cfg.seed
        )
        for step in range(1, steps + 1):
            sampler = await training.save_weights_and_get_sampling_client()
            policy = trainer._policy(renderer, sampler, trainer.seeds.sampling(step))
            collected = await collector.train_batch(policy, step)
            advantaged = assign_advantages(
                sequences_of(collector.usable(collected)),
                cfg.advantage,
                scale_by_std=cfg.scale_advantage_by_std,
                gamma=cfg.gamma,
                limit=cfg.batch_size,
                seed=trainer.seeds.subset(step),
            )
            metrics = await train_on(
                training, advantaged.sequences, cfg.loss_fn, cfg.loss_fn_config, adam
            )
            reward = mean_return(collected.episodes)
            assert reward is not None
            out[step] = (metrics.get("train/loss_sum"), reward)  # None: no group had signal
    finally:
        service.close()
        engine.dispose()
    return out


def test_sampling_ahead_with_a_kl_penalty_and_gspo_stops_and_resumes(tclient: TestClient):
    run_id = start(
        tclient,
        environment="repeat_word",
        total_steps=10_000,
        max_steps_off_policy=1,
        kl_penalty_coef=0.1,
        loss_fn="gspo",
        **{**QUIET, "steps_per_eval": 2, "eval_num_tasks": 2},  # evaluations beside sampling
    )
    wait_for(lambda: tclient.get(f"/runs/{run_id}").json()["step"] >= 3, 90)
    tclient.post(f"/runs/{run_id}/stop")  # while the producer samples the next step
    stopped = finish(tclient, run_id)
    assert stopped["status"] == "stopped", stopped
    at = stopped["step"]
    checkpoints = tclient.get(f"/runs/{run_id}/checkpoints").json()
    assert {c["step"] for c in checkpoints} == {at}  # of the last trained step
    evaluated = tclient.get(f"/runs/{run_id}/history", params={"keys": "eval/reward_mean"})
    assert 2 in {row["step"] for row in evaluated.json()["rows"]}
    rows = history(tclient, run_id)
    assert sorted(rows) == list(range(1, at + 1))
    assert rows[1]["sampler/steps_off_policy"] == 0  # step 1: the start's weights
    for step in range(2, at + 1):
        # Step k sampled from policy k-2 while step k-1 trained: one step off, never more.
        assert rows[step]["sampler/steps_off_policy"] == 1
        assert rows[step]["sampler/steps_off_policy_max"] <= 1
        assert rows[step]["sampler/stale_groups_dropped"] == 0
        assert "kl/reference" in rows[step] and "time/wait_s" in rows[step]

    resumed = tclient.post(f"/runs/{run_id}/resume", json={"total_steps": at + 2, "force": True})
    assert resumed.status_code == 200, resumed.text
    assert succeeded(tclient, run_id)["step"] == at + 2
    rows = history(tclient, run_id)
    assert rows[at + 1]["sampler/steps_off_policy"] == 0  # sampling starts again from the resume
    assert rows[at + 2]["sampler/steps_off_policy"] == 1


def test_stable_reinforce_distilled_from_another_runs_checkpoint(tclient: TestClient):
    teacher = start(tclient, environment="repeat_word", total_steps=2, **QUIET)
    succeeded(tclient, teacher)
    student = start(
        tclient,
        environment="repeat_word",
        total_steps=2,
        max_steps_off_policy=1,
        loss_fn="stable_reinforce",
        teacher=teacher,
        reward_coef=0.5,
        **QUIET,
    )
    succeeded(tclient, student)
    rows = history(tclient, student)
    for step in (1, 2):
        # The teacher is 2 small steps from the student's start: close, not equal.
        assert 0 < abs(rows[step]["teacher/reverse_kl"]) < 0.5
        # Every sampled token of the batch was read from the sampler's record.
        assert rows[step]["train/sampled_tokens"] == rows[step]["train/num_action_tokens"]
    assert rows[2]["sampler/steps_off_policy"] == 1
    logs = "\n".join(tclient.get(f"/runs/{student}/logs", params={"tail": 200}).json()["lines"])
    assert f"teacher {teacher}@step-2" in logs, logs
