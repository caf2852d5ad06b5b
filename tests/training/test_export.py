"""POST /runs/{id}/export: a real tiny-random run's checkpoints written as Hugging Face folders
(the PEFT adapter, loaded by peft alone; the merged model, loaded by transformers alone) that
compute what the run's own sampler computes; and the refusals, which write nothing."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from peft import PeftModel
from tinker import types
from transformers import AutoModelForCausalLM, AutoTokenizer

from runners.models.tiny import build_tiny
from server.app import create_app
from tests.support.helpers import TINY_RUN, finish_run, processes_with, start_run, wait_for
from tests.support.local_backend import local_service
from tests.support.settings import make_settings

PROMPT = "<|im_start|>user\nrepeat: apple<|im_end|>\n<|im_start|>assistant\napple"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str, Path]]:
    """A server and a finished 3-step run with sampler checkpoints at steps 1, 2 and 3."""
    root = tmp_path_factory.mktemp("export")
    with TestClient(create_app(make_settings(root, stop_grace_s=30.0))) as client:
        run_id = start_run(
            client,
            environment="repeat_word",
            total_steps=3,
            save_every=1,
            steps_per_eval=0,
            seed=1,
            learning_rate=0.02,
            **{**TINY_RUN, "group_size": 8, "batch_size": 4},
        )
        assert finish_run(client, run_id)["status"] == "succeeded"
        yield client, run_id, root
    wait_for(lambda: not processes_with(root / "var" / "runs"), 30)


def sampler(client: TestClient, run_id: str, step: int) -> Path:
    rows = client.get(f"/runs/{run_id}/checkpoints").json()
    (row,) = [r for r in rows if r["kind"] == "sampler" and r["step"] == step]
    return Path(row["path"])


def token_ids() -> torch.Tensor:
    _, tokenizer = build_tiny()
    return torch.tensor([tokenizer.encode(PROMPT)])


def next_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    logprobs = torch.log_softmax(logits[0, :-1].double(), dim=-1)
    return logprobs.gather(1, ids[0, 1:, None])[:, 0]


def logits_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(ids).logits


def with_adapter(folder: Path) -> torch.nn.Module:
    """tiny-random with the adapter in `folder`, loaded by peft alone."""
    base, _ = build_tiny()
    with warnings.catch_warnings():
        # The run adapts the unembedding of a tied-embedding model on purpose (never the input
        # embeddings); peft warns about that tie.
        warnings.filterwarnings("ignore", message=".*ensure_weight_tying.*")
        # peft reads transformers' deprecated name (as runners.engine.lora also allows).
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        return PeftModel.from_pretrained(base, folder)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_adapter_export_computes_what_the_runs_sampler_computes(
    trained: tuple[TestClient, str, Path], tmp_path: Path
) -> None:
    client, run_id, root = trained
    resp = client.post(f"/runs/{run_id}/export", json={})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    folder = Path(answer["path"])
    assert answer["step"] == 3 and answer["merged"] is False and answer["format"] == "peft-lora"
    assert folder == root / "var" / "runs" / run_id / "export" / "step-3"
    assert sorted(p.name for p in folder.iterdir()) == answer["files"]
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
        "README.md",
    } <= set(answer["files"])
    assert not any(name.startswith("rlcs_") for name in answer["files"])  # a clean HF folder
    assert sha(folder / "adapter_model.safetensors") == sha(
        sampler(client, run_id, 3) / "adapter_model.safetensors"
    )
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-random" and config["inference_mode"]
    card = (folder / "README.md").read_text()
    run = client.get(f"/runs/{run_id}").json()
    for fact in (run_id, "repeat_word", run["config_hash"], "base_model: tiny-random"):
        assert fact in card

    # peft alone loads it; its next-token logprobs are those the run's sampler computes.
    ids = token_ids()
    exported = next_token_logprobs(logits_of(with_adapter(folder), ids), ids)
    service = local_service(tmp_path)
    try:
        sampling = service.create_sampling_client(model_path=str(sampler(client, run_id, 3)))
        want = sampling.result().compute_logprobs(types.ModelInput.from_ints(ids[0].tolist()))
        want = torch.tensor(want.result()[1:], dtype=torch.float64)
    finally:
        service.close()
    torch.testing.assert_close(exported, want, atol=1e-4, rtol=0)
    untrained = next_token_logprobs(logits_of(build_tiny()[0], ids), ids)
    assert (exported - untrained).abs().max() > 1e-3  # training changed it: the check can fail
    assert AutoTokenizer.from_pretrained(folder).encode(PROMPT) == ids[0].tolist()


def test_the_merged_export_loads_with_transformers_alone(
    trained: tuple[TestClient, str, Path],
) -> None:
    client, run_id, root = trained
    resp = client.post(f"/runs/{run_id}/export", json={"checkpoint_step": 2, "merged": True})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    folder = Path(answer["path"])
    assert folder.name == "step-2-merged" and answer["step"] == 2
    assert answer["format"] == "hf-merged" and "model.safetensors" in answer["files"]
    assert "adapter_config.json" not in answer["files"]

    ids = token_ids()
    merged = logits_of(AutoModelForCausalLM.from_pretrained(folder), ids)
    adapted = logits_of(with_adapter(sampler(client, run_id, 2)), ids)
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=0)
    assert (adapted - logits_of(build_tiny()[0], ids)).abs().max() > 1e-3
    assert AutoTokenizer.from_pretrained(folder).encode(PROMPT) == ids[0].tolist()


def test_a_chosen_step_and_a_chosen_path_inside_the_export_folder(
    trained: tuple[TestClient, str, Path],
) -> None:
    client, run_id, root = trained
    exports = root / "var" / "exports"
    resp = client.post(f"/runs/{run_id}/export", json={"checkpoint_step": 1, "path": "mine/one"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["path"] == str(exports / "mine" / "one") and resp.json()["step"] == 1
    written = exports / "mine" / "one" / "adapter_model.safetensors"
    assert sha(written) == sha(sampler(client, run_id, 1) / "adapter_model.safetensors")

    # A second export there is refused, the first left as it was; overwrite replaces it.
    again = client.post(f"/runs/{run_id}/export", json={"checkpoint_step": 2, "path": "mine/one"})
    assert again.status_code == 409 and "overwrite" in again.json()["detail"]
    assert sha(written) == sha(sampler(client, run_id, 1) / "adapter_model.safetensors")
    replaced = client.post(
        f"/runs/{run_id}/export",
        json={"checkpoint_step": 2, "path": str(exports / "mine" / "one"), "overwrite": True},
    )
    assert replaced.status_code == 200, replaced.text
    assert sha(written) == sha(sampler(client, run_id, 2) / "adapter_model.safetensors")
    assert sorted(p.name for p in (exports / "mine").iterdir()) == ["one"]  # no temp left


@pytest.mark.parametrize(
    "body",
    [
        {"path": "../outside"},
        {"path": "/tmp/rlcs-export-outside"},
        {"path": "."},
        {"path": "a/../../b"},
        {"path": "bad\u0000name"},
    ],
)
def test_a_path_outside_the_export_folder_is_refused_and_nothing_written(
    trained: tuple[TestClient, str, Path], body: dict[str, str]
) -> None:
    client, run_id, root = trained
    before = sorted(p for p in root.rglob("*"))
    resp = client.post(f"/runs/{run_id}/export", json=body)
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"].startswith("path:")
    assert sorted(p for p in root.rglob("*")) == before
    assert not Path("/tmp/rlcs-export-outside").exists()


def test_unknown_step_and_unknown_run(trained: tuple[TestClient, str, Path]) -> None:
    client, run_id, _ = trained
    resp = client.post(f"/runs/{run_id}/export", json={"checkpoint_step": 7})
    assert resp.status_code == 404
    assert resp.json()["detail"].startswith("checkpoint_step:")
    assert "it has steps 1, 2, 3" in resp.json()["detail"]
    assert client.post("/runs/r-00000000/export", json={}).status_code == 404
    unknown_field = client.post(f"/runs/{run_id}/export", json={"step": 1})
    assert unknown_field.status_code == 422


def test_a_corrupt_checkpoint_is_refused_saying_why(trained: tuple[TestClient, str, Path]) -> None:
    client, run_id, root = trained
    weights = sampler(client, run_id, 1) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    resp = client.post(f"/runs/{run_id}/export", json={"checkpoint_step": 1, "path": "corrupt"})
    assert resp.status_code == 409, resp.text
    assert "adapter_model.safetensors" in resp.json()["detail"]
    assert not (root / "var" / "exports" / "corrupt").exists()
    # The newest checkpoint is still fine, and is what a plain export takes.
    resp = client.post(f"/runs/{run_id}/export", json={"path": "newest"})
    assert resp.status_code == 200 and resp.json()["step"] == 3
