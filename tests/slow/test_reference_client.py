"""The reference client, its code unchanged, reaches a token server through its URL (basic auth)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.live_server import LiveServer
from tests.support.reference_client.load import call, load_client


def test_reference_client_reaches_a_token_server_through_its_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client cannot send a header; credentials in RL_API_URL become basic auth, which
    the server accepts with the token as password."""
    token = "tok-reference-client-0123"
    with LiveServer(tmp_path / "var", RLCS_API_TOKEN=token) as live:
        plain = load_client(monkeypatch, live.url)
        refused, _ = call(plain.rl_list_environments)
        assert refused["error"].startswith("HTTP 401"), refused

        with_token = load_client(monkeypatch, live.url.replace("http://", f"http://rlcs:{token}@"))
        listed, _ = call(with_token.rl_list_environments)
        assert listed["count"] >= 1, listed
        wrong = load_client(monkeypatch, live.url.replace("http://", "http://rlcs:nope@"))
        assert call(wrong.rl_list_runs)[0]["error"].startswith("HTTP 401")
