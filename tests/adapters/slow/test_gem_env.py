"""The GEM adapter's slow test: the chat wrapper loads the run model's tokenizer (transformers)."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

from environments.base import EnvContext
from environments.gem_env import GemConfig, GemEnv
from runners.models.loading import load_tokenizer


def test_chat_wrapper_uses_the_run_models_tokenizer(tmp_path: Path) -> None:
    chat = GemConfig(
        wrappers="concat_chat",
        model_name="tiny-random",
        prompt_template="plain",
        observation_template="none",
    )
    # The runner hands environments its tokenizer loader; GEM's chat wrapper uses it.
    context = EnvContext(load_tokenizer=partial(load_tokenizer, models_dir=tmp_path))
    env = GemEnv(chat, context)
    first = asyncio.run(env.reset(0))
    # GEM appends the game's suffix after the template, inside the assistant turn (its quirk).
    assert first.startswith("<|im_start|>user") and "<|im_end|>\n<|im_start|>assistant" in first
    second = asyncio.run(env.step("\\boxed{5}")).observation
    assert second.count("<|im_start|>assistant") == 2
