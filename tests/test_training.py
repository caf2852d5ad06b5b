"""Runs of the real runner refused at the request, and the environment mixer (the runs
themselves, on tiny-random: tests/training/test_training.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.helpers import TINY_RUN as TINY
from tests.support.settings import make_settings


@pytest.fixture
def tclient(tmp_path: Path):
    with TestClient(create_app(make_settings(tmp_path, stop_grace_s=30.0))) as c:
        yield c


def test_unknown_model_is_refused_at_the_request(tclient: TestClient) -> None:
    body = {**TINY, "environment": "arithmetic", "model_name": "nobody/no-such-model-anywhere"}
    resp = tclient.post("/runs", json=body)
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert "model_name" in detail and "no-such-model" in detail and "tiny-random" in detail
    assert tclient.get("/runs").json() == []


def test_mixer_shares_groups_by_weight() -> None:
    from runners.episodes.sources import Mixer, Source

    a = Source("a", object, None, None, 3.0)  # type: ignore[arg-type]
    b = Source("b", object, None, None, 1.0)  # type: ignore[arg-type]
    mixer = Mixer([a, b])
    picks = [mixer.next().name for _ in range(8)]
    assert picks.count("a") == 6 and picks.count("b") == 2
    assert "bb" not in "".join(picks)
