"""The calls of the reference client (rl_training_tool.py) against a live server and a live
run, exactly as it makes them: paths, bodies (or none), and only HTTP 200 counts."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers import wait_for
from tests.live_server import LiveServer


def test_reference_client_calls_return_useful_json(tmp_path: Path) -> None:
    with (
        LiveServer(tmp_path / "var") as server,
        httpx.Client(base_url=server.url, timeout=120) as http,
    ):
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"

        envs = http.get("/environments").json()
        assert {"name", "class_name", "file_path", "description"} <= set(envs[0])

        # rl_select_environment posts with json=None: no body at all.
        selected = http.post("/environments/arithmetic/select")
        assert selected.status_code == 200 and selected.json()["selected"] == "arithmetic"

        config = http.get("/config").json()
        for field in (
            "group_size",
            "max_token_length",
            "total_steps",
            "steps_per_eval",
            "use_wandb",
            "wandb_name",
            "max_num_workers",
        ):
            assert field in config["configurable_fields"]
        for field, value in [
            ("model_name", "tiny-random"),
            ("total_steps", 6),
            ("max_token_length", 8),
            ("group_size", 2),
            ("batch_size", 2),
            ("steps_per_eval", 3),
            ("eval_num_tasks", 2),
            ("use_wandb", False),
            ("save_every", 2),
        ]:
            edited = http.post("/config", json={"field": field, "value": value})
            assert edited.status_code == 200, edited.text

        # rl_test_inference before training.
        inference = http.post(
            "/test/inference",
            json={
                "prompts": ["What is 2 + 2?"],
                "max_tokens": 16,
                "temperature": 1.0,
            },
        )
        assert inference.status_code == 200, inference.text
        assert inference.json()["results"][0]["score"] in (0.0, 1.0)

        # rl_start_training's body.
        started = http.post(
            "/runs",
            json={
                "wandb_project": "rl-training",
                "lora_rank": 32,
                "learning_rate": 4e-5,
            },
        )
        assert started.status_code == 200, started.text
        run_id = started.json()["run_id"]

        listed = http.get("/runs").json()
        assert listed[0]["run_id"] == run_id

        status = wait_for(
            lambda: (r := http.get(f"/runs/{run_id}").json())["step"] >= 1 and r, 90, every=0.5
        )
        assert status["status"] in ("running", "succeeded")
        assert set(status["metrics"]) >= {
            "reward_mean",
            "loss",
            "percent_correct",
            "eval_percent_correct",
        }

        done = wait_for(
            lambda: (
                (r := http.get(f"/runs/{run_id}").json())["status"]
                in ("succeeded", "failed", "stopped")
                and r
            ),
            120,
            every=0.5,
        )
        assert done["status"] == "succeeded", done

        results = http.get(f"/runs/{run_id}/metrics").json()
        assert results["weights_path"] and results["metrics"]["eval_percent_correct"] is not None
        assert results["history"] and "wandb_url" in results

        stopped = http.post(f"/runs/{run_id}/stop")
        assert stopped.status_code == 200 and stopped.json()["status"] == "succeeded"
