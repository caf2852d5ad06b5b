"""The adapters through the HTTP API, the slow test: a live server selects and validates each
adapter without loading its library."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LIGHT_CHECK = """
import sys, tempfile
from pathlib import Path
from fastapi.testclient import TestClient
from server.app import create_app
from tests.support.settings import make_settings
with TestClient(create_app(make_settings(Path(tempfile.mkdtemp())))) as c:
    for name in ("gem", "reasoning_gym", "openreward"):
        assert c.post(f"/environments/{name}/select").status_code == 200
    edits = {"env_id": "rg:leg_counting", "wrappers": "concat,episode_tracking"}
    assert c.put("/environments/gem/config", json={"values": edits}).status_code == 200
    edits = {"dataset_config": {"min_animals": 2}}
    assert c.put("/environments/reasoning_gym/config", json={"values": edits}).status_code == 200
heavy = ("gem", "reasoning_gym", "openreward", "torch", "transformers", "numpy")
print(",".join(m for m in heavy if m in sys.modules))
"""


def test_selecting_and_validating_keeps_the_server_light() -> None:
    """Config checks read the libraries' source; the server process never imports them."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", LIGHT_CHECK],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
