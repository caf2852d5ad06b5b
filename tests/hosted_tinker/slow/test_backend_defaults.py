"""With a Tinker key the default model is one the hosted service serves (a live server)."""

from __future__ import annotations

import json
from pathlib import Path

from core.model_names import LOCAL_DEFAULT_MODEL, TINKER_DEFAULT_MODEL
from tests.hosted_tinker.test_backend_defaults import tinker_client
from tests.support.standins.tinker_standin import TinkerStandin


def test_tinker_default_model_is_one_the_service_serves(
    tmp_path: Path, standin: TinkerStandin
) -> None:
    with tinker_client(tmp_path, standin) as client:
        client.post("/environments/arithmetic/select")
        config = client.get("/config").json()
        assert config["configurable_fields"]["model_name"] == TINKER_DEFAULT_MODEL
        assert config["locked_fields"]["tokenizer_name"] == TINKER_DEFAULT_MODEL
        assert TINKER_DEFAULT_MODEL in standin.supported_models

        created = client.post("/runs", json={"total_steps": 1, "use_wandb": False})
        assert created.status_code == 200, created.text
        run_id = created.json()["run_id"]
        client.post(f"/runs/{run_id}/stop")
        frozen = json.loads((tmp_path / "var" / "runs" / run_id / "config.json").read_text())
        assert frozen["config"]["model_name"] == TINKER_DEFAULT_MODEL
        # The default follows the backend: the local one keeps SmolLM2.
        client.post("/config", json={"field": "backend", "value": "local"})
        local = client.get("/config").json()["configurable_fields"]
        assert local["model_name"] == LOCAL_DEFAULT_MODEL
