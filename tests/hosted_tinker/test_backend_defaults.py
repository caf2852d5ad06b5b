"""With a Tinker key the default model is one the hosted service serves, and a model it does
not serve is refused at the request (POST /runs, config edits, /test/inference), listing the
ones it does, from the service's own capabilities list."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from core.model_names import LOCAL_DEFAULT_MODEL, TINKER_DEFAULT_MODEL
from server.app import create_app
from tests.hosted_tinker.conftest import TEST_KEY
from tests.support.settings import make_settings
from tests.support.standins.tinker_standin import TinkerStandin


def tinker_client(tmp_path: Path, standin: TinkerStandin) -> TestClient:
    settings = make_settings(tmp_path, tinker_api_key=TEST_KEY, tinker_base_url=standin.url)
    return TestClient(create_app(settings))


def test_a_model_tinker_does_not_serve_is_refused_at_the_request(
    tmp_path: Path, standin: TinkerStandin
) -> None:
    with tinker_client(tmp_path, standin) as client:
        client.post("/environments/arithmetic/select")
        before = client.get("/config").json()

        run = client.post("/runs", json={"model_name": LOCAL_DEFAULT_MODEL})
        assert run.status_code == 422
        detail = run.json()["detail"]
        assert "model_name" in detail and "tinker backend cannot train" in detail
        assert TINKER_DEFAULT_MODEL in detail and "meta-llama/Llama-3.1-8B" in detail
        assert TINKER_DEFAULT_MODEL in run.json()["supported_models"]
        assert client.get("/runs").json() == []

        edit = client.post("/config", json={"field": "model_name", "value": LOCAL_DEFAULT_MODEL})
        assert edit.status_code == 422 and TINKER_DEFAULT_MODEL in edit.json()["detail"]
        assert client.get("/config").json()["version"] == before["version"]

        infer = client.post(
            "/test/inference", json={"prompts": ["What is 1 + 1?"], "model": "tiny-random"}
        )
        assert infer.status_code == 404 and "cannot sample from 'tiny-random'" in infer.text

        ok = client.post("/config", json={"field": "model_name", "value": "Qwen/Qwen3-8B"})
        assert ok.status_code == 200, ok.text
    # One capabilities request served every check (cached).
    assert len(standin.requests("get_server_capabilities")) == 1
