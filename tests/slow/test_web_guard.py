"""The attack from the issue fails on a live server."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.live_server import LiveServer
from tests.test_web_guard import EVIL


def test_the_attack_from_the_issue_fails_on_a_live_server(tmp_path: Path) -> None:
    with LiveServer(tmp_path / "var", RLCS_INFERENCE_WARMUP="0") as server:
        select = httpx.post(
            f"{server.url}/environments/arithmetic/select", headers=EVIL, content="x", timeout=10
        )
        assert select.status_code == 403
        assert httpx.get(f"{server.url}/config", timeout=10).status_code == 400  # none selected
        rebound = httpx.get(
            f"{server.url}/runs", headers={"Host": f"evil.example:{server.port}"}, timeout=10
        )
        assert rebound.status_code == 400
        assert "RLCS_ALLOWED_HOSTS" in rebound.json()["detail"]
        # What a user does still works.
        assert httpx.get(f"http://localhost:{server.port}/runs", timeout=10).status_code == 200
        ok = httpx.post(f"{server.url}/environments/arithmetic/select", timeout=10)
        assert ok.status_code == 200
