"""Cost per run on live servers: prices are the server's, not a run's; a bad price or table
stops the server with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from server.app import create_app
from tests.support.settings import make_settings
from tests.test_cost import TABLE


def test_a_bad_price_or_table_stops_the_server_with_one_line(tmp_path: Path) -> None:
    bad_table = tmp_path / "prices.toml"
    bad_table.write_text(TABLE.replace("sample = 0.6", "sample = -1"))
    for variable, value, words in (
        ("RLCS_PRICE_DEVICE_HOUR", "-2", "RLCS_PRICE_DEVICE_HOUR must be a number of at least 0"),
        ("RLCS_TINKER_PRICES", str(bad_table), "sample must be at least 0"),
    ):
        env = {**os.environ, "RLCS_VAR_DIR": str(tmp_path / "var"), variable: value}
        done = subprocess.run(
            [sys.executable, "-m", "server"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and variable in lines[0], done.stderr


def test_prices_are_the_servers_not_a_runs(tmp_path: Path) -> None:
    """A run's body takes no price: the field is unknown, refused by name, nothing created."""
    with TestClient(create_app(make_settings(tmp_path))) as client:
        answer = client.post("/runs", json={"environment": "arithmetic", "price_device_hour": 2})
        assert 400 <= answer.status_code < 500 and "price_device_hour" in answer.json()["detail"]
        assert client.get("/runs").json() == []
