"""Export of a Tinker run through the unmodified SDK against the loopback stand-in: the state
checkpoint is loaded, saved as external weights, and every file downloaded from its URL."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from server.app import create_app
from tests.hosted_tinker.conftest import TEST_KEY
from tests.support.helpers import finish_run, start_run
from tests.support.settings import make_settings
from tests.support.standins.tinker_standin import TinkerStandin


def test_a_tinker_run_is_exported_by_downloading_its_external_weights(tmp_path: Path) -> None:
    with TinkerStandin(expected_api_key=TEST_KEY, extra_models=("tiny-random",)) as standin:
        settings = make_settings(tmp_path, tinker_api_key=TEST_KEY, tinker_base_url=standin.url)
        with TestClient(create_app(settings)) as client:
            run_id = start_run(
                client,
                environment="repeat_word",
                model_name="tiny-random",
                total_steps=2,
                save_every=1,
                steps_per_eval=0,
                group_size=2,
                batch_size=2,
                max_token_length=8,
                use_wandb=False,
            )
            assert finish_run(client, run_id)["status"] == "succeeded"
            rows = client.get(f"/runs/{run_id}/checkpoints").json()
            state = next(r["path"] for r in rows if r["kind"] == "state" and r["step"] == 1)
            standin.clear()

            resp = client.post(f"/runs/{run_id}/export", json={"checkpoint_step": 1})
            assert resp.status_code == 200, resp.text
            answer = resp.json()
            refused = client.post(f"/runs/{run_id}/export", json={"merged": True})

        folder = Path(answer["path"])
        assert folder == tmp_path / "var" / "runs" / run_id / "export" / "step-1"
        assert answer["format"] == "tinker-external" and answer["base_model"] == "tiny-random"
        assert answer["files"] == ["README.md", "adapter_config.json", "adapter_model.safetensors"]

        # What we sent: the step-1 state loaded into a new training client, saved as external
        # weights under a name that says which run and step, then each file fetched once.
        (loaded,) = standin.bodies("load_weights")
        assert loaded["path"] == state
        (saved,) = standin.bodies("save_weights_external")
        assert saved["path"] == f"{run_id}-step-1"
        (external,) = standin.external
        (asked,) = standin.requests("external_weights_urls")
        assert asked.method == "GET" and asked.api_key == TEST_KEY
        downloads = standin.requests("download")
        assert sorted(r.path.rsplit("/", 1)[-1] for r in downloads) == sorted(
            standin.external[external]
        )
        assert all(r.api_key is None for r in downloads)  # the key never goes to a file URL
        for name, data in standin.external[external].items():
            assert (folder / name).read_bytes() == data
        assert run_id in (folder / "README.md").read_text()

        assert refused.status_code == 422 and refused.json()["detail"].startswith("merged:")
