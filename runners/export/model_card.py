"""The README.md model card of an exported folder: what it is, where from, how to load it."""

from __future__ import annotations

from typing import Any

from core.model_names import TINY_RANDOM


def model_card(
    card: dict[str, Any], base_model: str, merged: bool, base_location: str | None = None
) -> str:
    """Markdown with a Hugging Face YAML header. `card` holds the run's facts (run_id, step,
    environment, config_hash, reward_mean, backend); `base_model` what the adapter applies to,
    `base_location` the folder its weights were read from on this machine, if any."""
    library = "transformers" if merged else "peft"
    lines = [
        "---",
        f"base_model: {base_model}",
        f"library_name: {library}",
        "tags: [rl-control-server, lora, reinforcement-learning]",
        "---",
        "",
        f"# {card.get('run_id')} at step {card.get('step')}",
        "",
        (
            "The LoRA adapter of this checkpoint merged into its base model."
            if merged
            else "A LoRA adapter (PEFT format) trained with reinforcement learning."
        ),
        "",
        *_facts(card, base_model, base_location),
        "",
        "## Loading",
        "",
        "```python",
        *_loading_code(base_model, merged),
        "```",
        "",
    ]
    return "\n".join(lines)


def _facts(card: dict[str, Any], base_model: str, base_location: str | None) -> list[str]:
    """The card's bullet list: the base model, the run and step, the environment, the reward."""
    reward = card.get("reward_mean")
    return [
        f"- Base model: `{base_model}`",
        *(
            [f"- Base model weights on the exporting machine: `{base_location}`"]
            if base_location
            else []
        ),
        f"- Run: `{card.get('run_id')}`, step {card.get('step')} of {card.get('total_steps')}",
        f"- Environment: `{card.get('environment')}`",
        f"- Config hash: `{card.get('config_hash')}`",
        f"- Latest mean reward of the run: {'n/a' if reward is None else f'{reward:.4g}'}",
        f"- Backend: {card.get('backend', 'local')}",
    ]


def _loading_code(base_model: str, merged: bool) -> list[str]:
    """The card's Python snippet that loads the folder (PATH): the merged model, or the adapter
    on its base."""
    if merged:
        return [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "model = AutoModelForCausalLM.from_pretrained(PATH)",
            "tokenizer = AutoTokenizer.from_pretrained(PATH)",
        ]
    if base_model == TINY_RANDOM:
        return [
            "from peft import PeftModel",
            "from runners.models.tiny import build_tiny  # tiny-random is built, not downloaded",
            "base, tokenizer = build_tiny()",
            "model = PeftModel.from_pretrained(base, PATH)",
        ]
    return [
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"base = AutoModelForCausalLM.from_pretrained({base_model!r})",
        "model = PeftModel.from_pretrained(base, PATH)",
        "tokenizer = AutoTokenizer.from_pretrained(PATH)",
    ]
