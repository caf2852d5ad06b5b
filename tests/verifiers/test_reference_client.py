"""Done when: a verifiers user drops their environment folder into a folder named in
RLCS_ENV_DIRS, and the reference client (tests/support/reference_client, unchanged) lists it,
configures it, tries it and trains it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.reference_client.load import call, load_client
from tests.support.reference_client.steps import (
    edit_config,
    select_listed,
    train_two_steps,
    try_unscored,
)
from tests.verifiers.conftest import verifiers_server


def test_the_reference_client_lists_configures_tries_and_trains_a_verifiers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verifiers_python: str
) -> None:
    with verifiers_server(tmp_path / "var") as server:
        rl = load_client(monkeypatch, server.url)

        select_listed(
            rl,
            "reverse-word",
            framework="verifiers",
            class_name="load_environment",
            file_path_end="reverse_word/reverse_word.py",
        )

        config, _ = call(rl.rl_get_current_config)
        assert config["configurable_fields"]["num_examples"] == 8
        edit_config(
            rl,
            [
                ("model_name", "tiny-random"),
                ("total_steps", 2),
                ("group_size", 2),
                ("max_tokens", 8),
                ("num_examples", 4),
                ("use_wandb", False),
            ],
        )
        refused, _ = call(rl.rl_edit_config, "num_examples", "four")
        assert refused["error"].startswith("HTTP 422") and "num_examples" in refused["error"]

        try_unscored(rl, "Write the word 'cat' backwards.", 8)
        train_two_steps(rl)
