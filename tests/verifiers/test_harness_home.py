"""Where verifiers' v1 runtime prepares its null harness: a folder of the server's, and its
script's unpinned dependencies resolved as of a fixed moment (a later openai with httpx2 failed
every rollout), unless the user's own UV_EXCLUDE_NEWER says otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.verifiers.driver import HARNESS_RESOLVED_AS_OF, harness_home
from tests.support.settings import make_settings


def test_the_harness_resolves_as_of_the_fixed_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UV_EXCLUDE_NEWER", raising=False)
    settings = make_settings(tmp_path)
    env = harness_home(settings)
    assert env["UV_EXCLUDE_NEWER"] == HARNESS_RESOLVED_AS_OF == "2026-11-27T00:00:00Z"
    assert Path(env["HOME"]) == settings.var_dir / "verifiers" / "home"


def test_a_users_own_moment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_EXCLUDE_NEWER", "2026-12-01T00:00:00Z")
    assert harness_home(make_settings(tmp_path))["UV_EXCLUDE_NEWER"] == "2026-12-01T00:00:00Z"
