"""The SDK's own command line (`tinker`, SDK 0.38) against the server, run as a user runs it:
a subprocess with TINKER_BASE_URL and TINKER_API_KEY. Checkpoints (list, download of a
training checkpoint through an exported adapter and signed URLs, time to live, publication),
sessions (list, trace export), runs, models and billing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
from safetensors.numpy import load_file
from tinker import types

from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import KEY, WAIT_S, sdk_env
from tests.tinker_api.reference import ADAM, datums

pytestmark = pytest.mark.timeout(240)
TINKER = str(Path(sys.executable).parent / "tinker")


def cli(server: LiveServer, *args: str, cwd: Path | None = None) -> Any:
    """`tinker --format json ARGS`: its JSON output (or its text, when it prints none)."""
    done = subprocess.run(
        [TINKER, "--format", "json", *args],
        env=sdk_env(server),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"tinker {' '.join(args)}: {done.stdout}{done.stderr}"
    try:
        return json.loads(done.stdout)
    except ValueError:
        return done.stdout


def test_checkpoint_download_ttl_and_publish(
    service: tinker.ServiceClient, server: LiveServer, tmp_path: Path
) -> None:
    training = service.create_lora_training_client("tiny-random", rank=4, seed=31).result(WAIT_S)
    training.forward_backward(datums("cross_entropy"), "cross_entropy")
    training.optim_step(ADAM)
    state = training.save_state("trained").result(WAIT_S).path
    sampler = training.save_weights_for_sampler("trained").result(WAIT_S).path

    listed = cli(server, "checkpoint", "list", "--run-id", training.model_id)
    assert {c["tinker_path"] for c in listed["checkpoints"]} == {state, sampler}

    out = cli(server, "checkpoint", "download", state, "--output", str(tmp_path))
    folder = Path(out["destination"])
    assert folder == tmp_path / state.removeprefix("tinker://").replace("/", "_")
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    # The adapter downloaded is the one trained (the sampler weights saved at the same step).
    sampler_folder = server.var_dir / "runs" / training.model_id.split(":")[0] / "tinker"
    want = load_file(
        sampler_folder / "train-0" / "trained" / "sampler" / "adapter_model.safetensors"
    )
    got = load_file(folder / "adapter_model.safetensors")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    cli(server, "checkpoint", "set-ttl", state, "--ttl", "7200")
    cli(server, "checkpoint", "publish", state)
    shown = {c["tinker_path"]: c for c in cli(server, "checkpoint", "list")["checkpoints"]}
    assert shown[state]["public"] is True and shown[state]["expires_at"] is not None
    assert shown[sampler]["public"] is False and shown[sampler]["expires_at"] is None
    # The temporary export the download made went with its session.
    assert not [c for c in shown.values() if c["checkpoint_type"] == "external"]
    rest = tinker.RestClient(base_url=server.url, api_key=KEY)
    rest.set_checkpoint_ttl_from_tinker_path(state, None).result(WAIT_S)
    rest.unpublish_checkpoint_from_tinker_path(state).result(WAIT_S)
    [back] = [
        c
        for c in rest.list_checkpoints(training.model_id).result(WAIT_S).checkpoints
        if c.tinker_path == state
    ]
    assert back.public is False and back.expires_at is None
    with pytest.raises(tinker.BadRequestError, match="already private"):
        rest.unpublish_checkpoint_from_tinker_path(state).result(WAIT_S)

    # Out of its bounds, a time to live is refused naming them.
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds: 60 is out of bounds"):
        rest.set_checkpoint_ttl_from_tinker_path(state, 60).result(WAIT_S)
    # A download URL is this server's, for an hour: changed, it is refused.
    export = training.save_weights_external("shared").result(WAIT_S).path
    urls = rest.get_external_weights_urls(export).result(WAIT_S).urls
    assert set(urls) == {"adapter_config.json", "adapter_model.safetensors"}
    assert httpx.get(urls["adapter_config.json"]).status_code == 200
    assert (
        httpx.get(urls["adapter_config.json"].replace("signature=", "signature=0")).status_code
        == 403
    )
    shutil.rmtree(tmp_path)


def test_sessions_traces_runs_and_billing(server: LiveServer, tmp_path: Path) -> None:
    script = tinker.ServiceClient()
    training = script.create_lora_training_client("tiny-random", rank=4, seed=32).result(WAIT_S)
    session_id = training.model_id.split(":")[0]
    training.forward_backward(datums("cross_entropy"), "cross_entropy")
    training.optim_step(ADAM).result(WAIT_S)
    sampler = training.save_weights_and_get_sampling_client().result(WAIT_S)
    prompt = types.ModelInput.from_ints([1, 2, 3])
    sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4, stop=[])).result(WAIT_S)
    training.forward_backward(datums("cross_entropy"), "cross_entropy")
    training.optim_step(ADAM).result(WAIT_S)
    training.save_state("kept").result(WAIT_S)

    # The trace of a live session, and of the same once it ended (kept in its run's folder).
    for when in ("live", "ended"):
        if when == "ended":
            script.close("success").result(WAIT_S)
        out = cli(server, "session", "export-trace", session_id, "-o", str(tmp_path / when))
        trace = json.loads((tmp_path / when).read_text())
        assert out["destination"] == str(tmp_path / when)
        slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] != "queued"]
        names = [e["name"] for e in slices]
        for op in ("create_model", "forward_backward", "optim_step", "sample", "save_state"):
            assert op in names, (when, op, names)
        threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
        assert training.model_id in threads
        assert all(e["dur"] >= 0 and e["args"]["run_s"] >= 0 for e in slices)

    assert session_id in {
        r["training_run_id"].split(":")[0] for r in cli(server, "run", "list")["runs"]
    }
    assert "tiny-random" in json.dumps(cli(server, "model", "list"))

    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    usage = cli(
        server,
        "billing",
        "usage",
        hour.isoformat().replace("+00:00", "Z"),
        (hour + timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
    )
    mine = [row for row in usage["data"] if row["session_id"] == session_id]
    trained = sum(
        r["event_info"]["token_count"] for r in mine if r["event_info"]["type"] == "training"
    )
    assert trained == 2 * sum(d.model_input.length for d in datums("cross_entropy"))
    assert any(r["event_info"]["type"] == "sampling_sample" for r in mine)
    storage = cli(server, "billing", "checkpoint-storage")
    assert sum(row["checkpoint_count"] for row in storage["data"]) >= 1
    assert all(row["size_bytes"] > 0 for row in storage["data"])
