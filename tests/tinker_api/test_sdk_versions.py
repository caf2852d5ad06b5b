"""The SDK versions the server serves: the same script (sdk_script.py: LoRA training with two
losses, checkpoints, samplers, a resume, the RestClient) run under the project's tinker 0.38 and
under the oldest protobuf-era SDK, 0.25.0 (.venv-tinker-oldest, made by `make install` from
tests/tinker_api/sdk_oldest/requirements.lock), each as its own process; both get the same
numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import PROJECT_ROOT
from tests.support.live_server import LiveServer
from tests.tinker_api.conftest import sdk_env

pytestmark = pytest.mark.timeout(300)
SCRIPT = Path(__file__).with_name("sdk_script.py")
OLDEST = PROJECT_ROOT / ".venv-tinker-oldest" / "bin" / "python"


def run_script(python: Path, server: LiveServer) -> dict[str, object]:
    done = subprocess.run(
        [str(python), str(SCRIPT)],
        env=sdk_env(server),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"{python}: {done.stdout[-2000:]}{done.stderr[-4000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_oldest_protobuf_sdk_and_0_38_both_train_here(server: LiveServer) -> None:
    if not OLDEST.exists():
        pytest.skip(f"{OLDEST} is missing: `make install` makes it")
    oldest = run_script(OLDEST, server)
    newest = run_script(Path(sys.executable), server)
    assert (oldest["sdk"], newest["sdk"]) == ("0.25.0", "0.38.0")
    # Each trained its own model: the same numbers, its own checkpoints.
    assert (oldest["samples"], oldest["sample_again"]) == (
        newest["samples"],
        newest["sample_again"],
    )
    assert oldest["logprobs"][0] is None and newest["logprobs"][0] is None  # type: ignore[index]
    assert oldest["logprobs"][1:] == pytest.approx(newest["logprobs"][1:], abs=1e-5)  # type: ignore[index]
    for key in ("losses", "rl_loss", "resumed_loss"):
        assert oldest[key] == pytest.approx(newest[key], abs=1e-5), key
    for seen in (oldest, newest):
        assert seen["checkpoints"] == sorted(seen["paths"])  # type: ignore[call-overload]
    assert oldest["paths"] != newest["paths"]
